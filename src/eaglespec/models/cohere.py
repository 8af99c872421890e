"""Cohere's Command models (`CohereForCausalLM`: Command R 35B, Aya 23 / Expanse; `Cohere2ForCausalLM`: Command R7B,
Command A): one LayerNorm feeding attention and MLP in parallel.

Layer i: `x = input_layernorm(h)`, `h += self_attn(x) + mlp(x)` (`layers.norm.BiasFreeLayerNorm`, `layer_norm_eps`).
The attention is GQA (biases as `attention_bias` says) with RoPE over adjacent pairs (transformers' Cohere layout,
dims 2j and 2j + 1 at frequency j): `transform_checkpoint` permutes q_proj's and k_proj's rows within each head,
pairs to halves (`layers.rotary.pairs_to_halves`: q and k alike, every score unchanged), so the engine's RoPE and its
kernels apply as they are. Command R7B / A window three layers of four (`layer_types`, `sliding_window`) and rotate only
those: their full-attention layers are NoPE (`ModelConfig.rope_layers`). The logits are multiplied by `logit_scale`
(`DecoderOnlyLM.logits_divisor` = 1 / it), the head tied to the embedding. With `use_qk_norm` (Command R+) q and k
take a bias-free LayerNorm per head before RoPE, weights [heads, head_dim] (`self_attn.q_norm` / `k_norm`, permuted at
load as q / k are); those layers keep PyTorch's RoPE and attention (the fused kernels apply Llama's RMSNorm). The
layers run the module path (GEMMs, the RoPE + KV-store and short-query attention kernels), not the fused norm +
projection ones.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..layers.attention import GQAAttention, QKNormAttention
from ..layers.embedding import embedding
from ..layers.mlp import GatedMLP
from ..layers.norm import BiasFreeLayerNorm
from ..layers.rotary import Rotary, qk_rows_to_halves
from .base import DecoderOnlyLM, set_windows
from .llama import llama_attention


class CohereQKNormAttention(QKNormAttention):
    """Command R+'s attention: `QKNormAttention` whose per-head norms are bias-free LayerNorms with a weight per head,
    [heads, head_dim]; not Llama's RMSNorm, so no fused RoPE + KV-store kernel (`rope_store_ok`)."""

    rope_store_ok = False

    def __init__(self, cfg: ModelConfig, eps: float) -> None:
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        super().__init__(cfg.hidden_size, cfg.hidden_size, H, Hkv, D, eps, bias=cfg.attention_bias)
        self.q_norm, self.k_norm = BiasFreeLayerNorm((H, D), eps), BiasFreeLayerNorm((Hkv, D), eps)


class CohereDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, eps: float) -> None:
        super().__init__()
        self.input_layernorm = BiasFreeLayerNorm(cfg.hidden_size, eps)
        if cfg.text.get("use_qk_norm"):
            self.self_attn: GQAAttention = CohereQKNormAttention(cfg, eps)
        else:
            self.self_attn = llama_attention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.hidden_act)

    def forward(self, h, delta, cos, sin, ctx, cache):  # type: ignore[no-untyped-def]
        """PreNormDecoderLayer's call: the layer's output is h + delta; this layer returns it whole (delta None)."""
        if delta is not None:
            h = h + delta
        x = self.input_layernorm(h)
        return h + self.self_attn(x, cos, sin, ctx, cache) + self.mlp(x), None


class CohereModel(nn.Module):
    def __init__(self, cfg: ModelConfig, eps: float) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(CohereDecoderLayer(cfg, eps) for _ in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        self.norm = BiasFreeLayerNorm(cfg.hidden_size, eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)


class CohereForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    checkpoint_ignore: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)

    def __init__(self, config: ModelConfig) -> None:
        text = config.text
        super().__init__(config)
        self.model = CohereModel(config, float(text.get("layer_norm_eps", 1e-5)))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.logits_divisor = 1.0 / float(text.get("logit_scale", 1.0))

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """q / k rows from RoPE pairs to halves (module docstring)."""
        cfg = self.config
        yield name, qk_rows_to_halves(name, tensor, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rotary_dim)


class Cohere2ForCausalLM(CohereForCausalLM):
    """Command R7B / Command A: the same model; its windows and NoPE layers come from the config."""
