"""GLM-4-0414 (`Glm4ForCausalLM`: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1): GQA with q/k/v biases and partial RoPE on
adjacent pairs, "sandwich" norms, a SwiGLU whose gate and up are one tensor in the checkpoint.

Layer i: `h += post_self_attn_layernorm(self_attn(input_layernorm(h)))`, then `h += post_mlp_layernorm(mlp(
post_attention_layernorm(h)))` (Llama's RMSNorms). RoPE rotates the first `partial_rotary_factor` (0.5) of each head's
dims in adjacent pairs (dims 2j and 2j + 1 at frequency j: transformers' GLM-4 layout). This engine rotates halves
everywhere (its kernels too), so `transform_checkpoint` permutes the rows of q_proj and k_proj (weights and biases)
within each head's rotated dims, pairs to halves (row 2j -> j, 2j + 1 -> R/2 + j): q and k are permuted alike, so every
score q.k, and so the model, is unchanged. The checkpoint's `mlp.gate_up_proj` (gate rows, then up rows) is split
into gate_proj / up_proj (the CUDA path fuses them again).

The layers are not `PreNormDecoderLayer`s (the post-norms sit between the sublayers and their residual adds): they
run the module path (GEMMs, the fused RoPE + KV-store and short-query attention kernels), not the fused norm +
projection kernels.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..layers.attention import GQAAttention
from ..layers.embedding import embedding
from ..layers.mlp import GatedMLP, split_gate_up
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary, qk_rows_to_halves
from .base import DecoderOnlyLM, set_windows


class Glm4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dim, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = GQAAttention(dim, dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                      bias=cfg.attention_bias, o_bias=False)
        self.post_self_attn_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = GatedMLP(dim, cfg.intermediate_size, act=cfg.hidden_act)
        self.post_mlp_layernorm = RMSNorm(dim, eps)

    def forward(self, h, delta, cos, sin, ctx, cache):  # type: ignore[no-untyped-def]
        """PreNormDecoderLayer's call: the layer's output is h + delta; this layer returns it whole (delta None)."""
        if delta is not None:
            h = h + delta
        h = h + self.post_self_attn_layernorm(self.self_attn(self.input_layernorm(h), cos, sin, ctx, cache))
        return h + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(h))), None


class Glm4Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Glm4DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)


class Glm4ForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    checkpoint_ignore: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = Glm4Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """q / k rows from pairs to halves (module docstring); gate_up_proj split into gate_proj and up_proj."""
        cfg = self.config
        yield from split_gate_up(name, tensor) or [
            (name, qk_rows_to_halves(name, tensor, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rotary_dim))]
