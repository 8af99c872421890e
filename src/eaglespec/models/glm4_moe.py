"""GLM-4.5 / 4.6 / 4.7 (`Glm4MoeForCausalLM`: GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7): GQA attention with partial RoPE
and DeepSeek-V3's mixture of experts.

Layer i is pre-norm: `h += self_attn(input_layernorm(h))`, `h += mlp(post_attention_layernorm(h))`. The attention is
GQA with biases on q/k/v as `attention_bias` says (none on o_proj), an RMSNorm over each head's q and k before RoPE when
`use_qk_norm` (`layers.attention.QKNormAttention`, off in the released models), and RoPE over the first
`partial_rotary_factor` of each head (0.5, also transformers' default when the config names none: 64 of 128 dims,
rotated by halves; `ModelConfig.rotary_dim`). `mlp` is a dense SwiGLU of `intermediate_size` for i <
`first_k_dense_replace`, after that the MoE (`layers/moe.py`): DeepSeek-V3's router (`NoAuxRouter`: sigmoid scores, the
`e_score_correction_bias` choosing, `n_group` / `topk_group`, the top `num_experts_per_tok` renormalised when
`norm_topk_prob`, times `routed_scaling_factor`), `n_routed_experts` SwiGLU experts of `moe_intermediate_size` and
`n_shared_experts` shared ones.

Parameter names are the HF checkpoint's (`model.layers.L.mlp.gate.e_score_correction_bias`,
`model.layers.L.mlp.experts.E.up_proj.weight`, `model.layers.L.mlp.shared_experts.down_proj.weight`, ...), so the
rename table is empty. The checkpoint's multi-token-prediction layers (`num_nextn_predict_layers`, indices >=
`num_hidden_layers`: GLM-4.5's layer 92, GLM-4.5-Air's 46) are ignored, as for DeepSeek-V3. On CUDA the experts run as
grouped GEMMs (`engine.transforms.use_grouped_experts`) and the fused RoPE + KV-store kernel passes the unrotated half
of each head through.
"""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..layers.attention import GQAAttention, QKNormAttention
from .deepseek_v3 import at_least_regex
from .qwen_moe import Qwen3MoeForCausalLM


def glm4_moe_attention(cfg: ModelConfig) -> nn.Module:
    """GLM-4.5's attention: biases on q/k/v only (`attention_bias`), q/k head norms when `use_qk_norm`."""
    if cfg.text.get("use_qk_norm"):
        return QKNormAttention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                               cfg.head_dim, cfg.rms_norm_eps, bias=cfg.attention_bias, o_bias=False)
    return GQAAttention(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                        cfg.head_dim, bias=cfg.attention_bias, o_bias=False)


class Glm4MoeForCausalLM(Qwen3MoeForCausalLM):
    """Qwen3-MoE's skeleton (models/qwen_moe.py: its decoder layer takes the MoE where `MoEConfig.is_sparse`, here from
    `first_k_dense_replace`) with GLM's attention; the MTP layers ignored."""

    attention = staticmethod(glm4_moe_attention)

    def __init__(self, config: ModelConfig) -> None:
        if config.moe is None:
            raise ConfigError(f"{config.architecture} needs n_routed_experts, num_experts_per_tok and "
                              "moe_intermediate_size in its config")
        super().__init__(config)
        mtp = rf"^(?:.*\.)?layers\.{at_least_regex(config.num_hidden_layers)}\."
        self.checkpoint_ignore = type(self).checkpoint_ignore + (mtp,)
