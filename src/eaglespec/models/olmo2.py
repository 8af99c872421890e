"""OLMo 2 and 3 (`Olmo2ForCausalLM`: OLMo-2-1B / 7B / 13B / 32B; `Olmo3ForCausalLM`: OLMo-3-7B / 32B): post-norm
layers and RMSNorms over the whole q and k projections; EXAONE 4 (`Exaone4ForCausalLM`) on the same layers with
per-head q / k norms (below).

Layer i: `h += post_attention_layernorm(self_attn(h))`, then `h += post_feedforward_layernorm(mlp(h))`: the norms sit
after each sublayer, none before. The attention is GQA whose q and k projections are each RMS-normalised over their
full width (`q_norm` [H * head_dim], `k_norm` [H_kv * head_dim]: not per head) before RoPE, no biases; OLMo 3 windows
three layers of four (`layer_types`, `ModelConfig.layer_windows`; transformers 5's rope_parameters by layer type).
The MLP is Llama's SwiGLU. Checkpoint names are the HF ones, the rename table empty.

The layers are not `PreNormDecoderLayer`s and the norms are not per head: they run the module path (GEMMs, SDPA),
never the fused RoPE + KV-store kernel (whose head norms are per head), nor the fused norm + projection ones.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from ..config import ModelConfig
from ..layers.attention import GQAAttention
from ..layers.context import ForwardContext
from ..layers.embedding import embedding
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from .base import DecoderOnlyLM, set_windows
from .qwen import qwen3_attention


class Olmo2Attention(GQAAttention):
    """GQA with RMSNorms over the whole q and k projections (before the heads are split and rotated)."""

    rope_store_ok = False

    def __init__(self, cfg: ModelConfig) -> None:
        H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        super().__init__(cfg.hidden_size, cfg.hidden_size, H, Hkv, D, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(H * D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(Hkv * D, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext,
                cache: Sequence[torch.Tensor] | None) -> torch.Tensor:
        if hasattr(self, "qkv_proj"):  # fused by engine.transforms
            return self.attend_qkv(self.qkv_proj(x), cos, sin, ctx, cache)
        return self.o_proj(self._heads(self.q_proj(x), self.k_proj(x), self.v_proj(x), cos, sin, ctx, cache))

    def attend_heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext,
                     cache: Sequence[torch.Tensor] | None,
                     norm_of: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """qkv [B, T, (H + 2 Hkv) * D] (the fused projection) -> [B, T, H * D]."""
        assert norm_of is None  # (no norm before the attention to fold)
        q, k, v = qkv.split([self.num_heads * self.head_dim] + [self.num_kv_heads * self.head_dim] * 2, -1)
        return self._heads(q, k, v, cos, sin, ctx, cache)

    def _heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               ctx: ForwardContext, cache: Sequence[torch.Tensor] | None) -> torch.Tensor:
        B, T, _ = q.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.rope(self.q_norm(q).view(B, T, H, D), cos, sin)
        k = self.rope(self.k_norm(k).view(B, T, Hkv, D), cos, sin)
        return self._attend(q, k, v.reshape(B, T, Hkv, D), ctx, cache).reshape(B, T, H * D)


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: Callable[[ModelConfig], GQAAttention] = Olmo2Attention) -> None:
        super().__init__()
        self.self_attn = attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.hidden_act)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, delta, cos, sin, ctx, cache):  # type: ignore[no-untyped-def]
        """PreNormDecoderLayer's call: the layer's output is h + delta; this layer returns it whole (delta None)."""
        if delta is not None:
            h = h + delta
        h = h + self.post_attention_layernorm(self.self_attn(h, cos, sin, ctx, cache))
        return h + self.post_feedforward_layernorm(self.mlp(h)), None


class Olmo2Model(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: Callable[[ModelConfig], GQAAttention] = Olmo2Attention) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Olmo2DecoderLayer(cfg, attention) for _ in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)
        if cfg.rope_local is not None and cfg.rope_local != cfg.rope:
            self.rotary_local = Rotary(cfg.rotary_dim, cfg.rope_local)


class Olmo2ForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    checkpoint_ignore: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)
    attention: Callable[[ModelConfig], GQAAttention] = Olmo2Attention

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = Olmo2Model(config, type(self).attention)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


class Exaone4ForCausalLM(Olmo2ForCausalLM):
    """EXAONE 4 (`Exaone4ForCausalLM`: EXAONE-4.0-1.2B / 32B): OLMo 2's post-norm layers with Qwen3's per-head q / k
    RMSNorms (`QKNormAttention`, so the fused RoPE + KV-store and short-query kernels apply); with a sliding window,
    three layers of four windowed (`sliding_window_pattern` "LLLG" or `layer_types`) and only those rotated, the
    global ones NoPE (`ModelConfig.rope_layers`); without one (1.2B) every layer global and rotated."""

    attention = staticmethod(qwen3_attention)
