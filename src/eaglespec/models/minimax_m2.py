"""MiniMax-M2 (`MiniMaxM2ForCausalLM`: MiniMax-M2, M2.1): Mixtral's layout with OLMo 2's q / k norms, partial RoPE and
DeepSeek-V3's sigmoid router.

Layer i is pre-norm: `h += self_attn(input_layernorm(h))`, `h += mlp(post_attention_layernorm(h))`. The attention is
GQA (heads of `head_dim` 128, no biases) whose q and k projections are RMS-normalised over their full width before
the heads are split (`olmo2.Olmo2Attention`: `q_norm` [H * head_dim], `k_norm` [H_kv * head_dim]), RoPE on halves
over the first `rotary_dim` (64) dims of each head (the released configs' name for partial RoPE:
`ModelConfig.rotary_dim`). `mlp` is the MoE in every layer (`layers/moe.py`): `num_local_experts` (256) SwiGLU experts
of `intermediate_size`, chosen by `NoAuxRouter` (sigmoid scores, the top `num_experts_per_tok` of scores plus the
correction bias, their unbiased scores normalised), no shared experts. Checkpoint names are Mixtral's
(`block_sparse_moe.gate`, `experts.E.w1 / w3 / w2`; the bias `block_sparse_moe.e_score_correction_bias`), renamed onto
the MoE's. The norms are not per head: the layers take the module path for attention (no fused RoPE + KV-store
kernel); on CUDA the experts run as the grouped kernels and the router as its kernel.
"""

from __future__ import annotations

from .mixtral import MixtralDecoderLayer, MixtralForCausalLM
from .olmo2 import Olmo2Attention


class MiniMaxM2DecoderLayer(MixtralDecoderLayer):
    """Mixtral's layer with OLMo 2's whole-projection q / k norms."""

    family = "MiniMax-M2"
    attention = Olmo2Attention


class MiniMaxM2ForCausalLM(MixtralForCausalLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = (
        (r"\.block_sparse_moe\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),
        *MixtralForCausalLM.checkpoint_renames,
    )
    decoder_layer = MiniMaxM2DecoderLayer
