"""Llama (SmolLM2, Llama 2/3; Mistral, Ministral 3, SmolLM3 and Seed-OSS under their names): pre-norm RMSNorm
decoder, GQA, RoPE (incl. Llama-3 scaling; none in SmolLM3's NoPE layers, `ModelConfig.rope_layers`), SwiGLU, tied or
untied; biases as `attention_bias` (q/k/v, and o_proj unless `attention_out_bias` says otherwise: Seed-OSS) and
`mlp_bias` say. Ministral 3's rope parameters' `llama_4_scaling_beta` scales every query past the original positions
(`GQAAttention.temperature`: 1 + beta * log(1 + floor(p / original_max_position_embeddings))).
`Ernie4_5ForCausalLM` (ERNIE 4.5 dense) is this model with `use_bias` for both and RoPE on adjacent pairs, its q / k
rows permuted to halves at load (`layers.rotary.pairs_to_halves`).

Parameter names are the HF checkpoint's (`model.layers.N.self_attn.q_proj.weight`, ...), so the rename table is
empty; GGUF names are mapped in `loading/gguf_names.py`.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..layers.attention import GQAAttention
from ..layers.embedding import embedding
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary, qk_rows_to_halves
from .base import DecoderOnlyLM, PreNormDecoderLayer, set_windows


def llama_attention(cfg: ModelConfig) -> GQAAttention:
    """Llama's attention for a model config: GQA with biases as `attention_bias` says (o_proj's as
    `attention_out_bias`, where a config names it apart: Seed-OSS). Mixtral's, Command R's, ERNIE's and Llama 4's
    too."""
    return GQAAttention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                        cfg.head_dim, bias=cfg.attention_bias, o_bias=cfg.text.get("attention_out_bias"))


class LlamaDecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = llama_attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias, act=cfg.hidden_act)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: type[nn.Module] = LlamaDecoderLayer) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer(cfg) for _ in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        rope = cfg.text.get("rope_parameters") or cfg.text.get("rope_scaling") or {}
        if rope.get("llama_4_scaling_beta"):  # Ministral 3: every query scaled past the original positions
            for lay in self.layers:
                lay.self_attn.temperature = (float(rope["original_max_position_embeddings"]),
                                             float(rope["llama_4_scaling_beta"]), 0.0)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)


class LlamaForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    # Keys a checkpoint may carry that we do not use.
    checkpoint_ignore: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)
    decoder_layer: type[nn.Module] = LlamaDecoderLayer  # architectures on the same skeleton swap their layer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = LlamaModel(config, self.decoder_layer)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    """ERNIE 4.5 dense: Llama's model (its `use_bias` and tied head read by ModelConfig.from_hf), RoPE on pairs."""

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """q / k rows from RoPE pairs to halves (the module docstring)."""
        cfg = self.config
        yield name, qk_rows_to_halves(name, tensor, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rotary_dim)
