"""Qwen2 and Qwen3 (dense): Llama's skeleton (llama.py) with their own attention.

- Qwen2 (`Qwen2ForCausalLM`: Qwen2, Qwen2.5): q/k/v projections with biases, o_proj without;
- Qwen3 (`Qwen3ForCausalLM`): an RMSNorm over each head's q and k before RoPE (`layers.attention.QKNormAttention`),
  biases as `attention_bias` says (none in the released models).

Parameter names are the HF checkpoint's (`model.layers.N.self_attn.q_norm.weight`, ...): no renames; llama.cpp's
`qwen2` / `qwen3` GGUFs map onto them through loading/gguf_names.py. Sliding-window attention (`use_sliding_window`,
off in the released models; then the layers from `max_window_layers` on, or those `layer_types` names, see the last
`sliding_window` tokens) runs as such: `ModelConfig.layer_windows`, `ForwardContext.mask(window)`.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..layers.attention import GQAAttention, QKNormAttention
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from .base import PreNormDecoderLayer
from .llama import LlamaForCausalLM


def qwen2_attention(cfg: ModelConfig) -> GQAAttention:
    """Qwen2's attention (dense and MoE): biases on q/k/v, none on o_proj."""
    return GQAAttention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                        cfg.head_dim, bias=True, o_bias=False)


class Qwen2DecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = qwen2_attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.hidden_act)


def qwen3_attention(cfg: ModelConfig) -> QKNormAttention:
    """Qwen3's attention (dense and MoE): per-head q/k RMSNorms before RoPE, biases as `attention_bias` says."""
    return QKNormAttention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.head_dim, cfg.rms_norm_eps, bias=cfg.attention_bias)


class Qwen3DecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = qwen3_attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.hidden_act)


class Qwen2ForCausalLM(LlamaForCausalLM):
    decoder_layer = Qwen2DecoderLayer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)


class Qwen3ForCausalLM(LlamaForCausalLM):
    decoder_layer = Qwen3DecoderLayer

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
