"""Gemma 2 and 3 (`Gemma2ForCausalLM`: Gemma-2-2B / 9B / 27B; `Gemma3ForCausalLM`: Gemma-3-1B and the text-only
checkpoints; `Gemma3ForConditionalGeneration`: Gemma 3 4B, 12B, 27B, run here for text: the language model only).

Layer i: `h += post_attention_layernorm(self_attn(input_layernorm(h)))`, then `h += post_feedforward_layernorm(mlp(
pre_feedforward_layernorm(h)))` (four norms, "sandwich" order). Every norm is Gemma's (`layers.norm.OffsetRMSNorm`:
weights as offsets from 1, the product in float32). The attention is GQA with the softmax scaled by
`query_pre_attn_scalar`^-0.5 (not head_dim's), a sliding window (`sliding_window`) on the layers `layer_types` names,
else Gemma 2's even layers and all but Gemma 3's every `sliding_window_pattern`-th (`ModelConfig.layer_windows`), and
where the config sets `attn_logit_softcapping` (Gemma 2's 50) scores soft-capped, cap * tanh(s / cap)
(`layers.attention.sdpa_written_out`, the written-out attention); Gemma 3's adds q / k head norms before RoPE, and its
windowed ("local") layers rotate with their own base frequency (`rope_local_base_freq`, default RoPE:
`ModelConfig.rope_local`, `model.rotary_local`), the global ones with `rope_theta` and its scaling (4B+: linear, 8).
The MLP gates with GELU (tanh approximation, `hidden_activation`). The token embedding is multiplied by
sqrt(hidden_size) (`layers.embedding.ScaledEmbedding`), the head tied to it unless the config says otherwise (the
wrapper's own `tie_word_embeddings` decides for it, as in transformers); `final_logit_softcapping` (Gemma 2's 30)
soft-caps the logits (`DecoderOnlyLM.final_logit_softcap`).

Parameter names are the HF checkpoint's (`model.layers.L.pre_feedforward_layernorm.weight`, ...), so the text models'
rename tables are empty; the wrapper's (`base.VisionLanguageForText`) are its releases' `language_model.model.*` and
transformers 5's `model.language_model.*`, its vision tower and projector skipped (images refused). The engine's
fused norm kernels are written for Llama's layer and norms: these layers run on the module path (GEMMs, SDPA); Gemma
2's attention (no head norms) takes the fused RoPE + KV-store kernel and the short-query kernel, which caps its
scores as the written-out attention does.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ..config import ModelConfig
from ..layers.attention import GQAAttention, QKNormAttention
from ..layers.embedding import ScaledEmbedding
from ..layers.mlp import GatedMLP
from ..layers.norm import OffsetRMSNorm
from ..layers.rotary import Rotary
from .base import DecoderOnlyLM, VisionLanguageForText, set_windows


class Gemma3Attention(QKNormAttention):
    """QKNormAttention with Gemma's head norms, kept off the fused RoPE + KV-store kernel (its head norms are
    Llama's)."""

    rope_store_ok = False

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.rms_norm_eps, bias=cfg.attention_bias)
        self.q_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def head_norms(self) -> None:
        return None  # not Llama's: no kernel applies them (rope_store_ok is False)


def gemma_attention(cfg: ModelConfig) -> GQAAttention:
    """Gemma 2's attention (plain GQA) or Gemma 3's (q / k head norms), with the config's softmax scale and soft cap."""
    text = cfg.text
    if cfg.model_type == "gemma2" or text.get("model_type") == "gemma2":
        attn = GQAAttention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                            cfg.head_dim, bias=cfg.attention_bias)
    else:
        attn = Gemma3Attention(cfg)
    attn.scale = float(text.get("query_pre_attn_scalar") or cfg.head_dim) ** -0.5
    cap = text.get("attn_logit_softcapping")
    attn.softcap = float(cap) if cap is not None else None
    return attn


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, act: str) -> None:
        super().__init__()
        dim, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = OffsetRMSNorm(dim, eps)
        self.self_attn = gemma_attention(cfg)
        self.post_attention_layernorm = OffsetRMSNorm(dim, eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(dim, eps)
        self.mlp = GatedMLP(dim, cfg.intermediate_size, act=act)
        self.post_feedforward_layernorm = OffsetRMSNorm(dim, eps)

    def forward(self, h, delta, cos, sin, ctx, cache):  # type: ignore[no-untyped-def]
        """PreNormDecoderLayer's call: the layer's output is h + delta; this layer returns it whole (delta None)."""
        if delta is not None:
            h = h + delta
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), cos, sin, ctx, cache))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h))), None


class GemmaTextModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        text = cfg.text
        act = str(text.get("hidden_activation") or text.get("hidden_act") or "gelu_pytorch_tanh")
        self.embed_tokens = ScaledEmbedding(cfg.vocab_size, cfg.hidden_size, cfg.hidden_size**0.5)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, act) for _ in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)
        if cfg.rope_local is not None:
            self.rotary_local = Rotary(cfg.rotary_dim, cfg.rope_local)


class Gemma3ForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    checkpoint_ignore: tuple[str, ...] = (r"rotary_emb(?:_local)?\.inv_freq$",)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = GemmaTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cap = config.text.get("final_logit_softcapping")
        self.final_logit_softcap = float(cap) if cap is not None else None


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 2: the same model with its own attention (`gemma_attention`), chosen by the config's model_type."""


class Gemma3ForConditionalGeneration(VisionLanguageForText):
    """Gemma 3's multimodal wrapper, for text (`base.VisionLanguageForText`)."""

    language_model_class = Gemma3ForCausalLM

    def __init__(self, config: ModelConfig) -> None:
        # transformers ties the wrapper's head as its own field says (default True), whatever text_config's says
        super().__init__(replace(config, tie_word_embeddings=bool(config.raw.get("tie_word_embeddings", True))))
