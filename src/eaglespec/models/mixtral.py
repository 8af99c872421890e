"""Mixtral (`MixtralForCausalLM`: Mixtral-8x7B, 8x22B): Llama's attention with a softmax top-k mixture of experts.

Layer i is pre-norm: `h += self_attn(input_layernorm(h))`, `h += mlp(post_attention_layernorm(h))`, where the
attention is Llama's (GQA, RoPE, no biases) and `mlp` is the MoE in every layer (`layers/moe.py`: the router
`SoftmaxTopKRouter` over `num_local_experts` SwiGLU experts of `intermediate_size`, the top `num_experts_per_tok`
softmax probabilities renormalised to sum to 1, as transformers' MixtralSparseMoeBlock; no shared experts).

Checkpoint names: the released checkpoints (and transformers' `save_pretrained`) write
`model.layers.L.block_sparse_moe.gate.weight` and `...block_sparse_moe.experts.E.w{1,2,3}.weight` (w1 the gate, w3
the up, w2 the down projection); `checkpoint_renames` maps them onto the MoE's names (`mlp.gate`,
`mlp.experts.E.{gate,up,down}_proj`). llama.cpp's Mixtral files are `llama` GGUFs with experts (loading/gguf_config.py
reads them as this class; loading/gguf_names.py maps their stacked `ffn_*_exps` or older per-expert `ffn_*.E` tensors
to the MoE's names). `sliding_window` (null in the released configs) windows every layer
(`ModelConfig.layer_windows`). The router's jitter noise and auxiliary loss are training-only and ignored. On CUDA the
experts run as grouped GEMMs like Qwen3-MoE's (`engine.transforms.use_grouped_experts`).
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ..config import ModelConfig
from ..layers.moe import MoE
from ..layers.norm import RMSNorm
from .base import PreNormDecoderLayer
from .llama import LlamaForCausalLM, llama_attention


class MixtralDecoderLayer(PreNormDecoderLayer):
    family = "Mixtral"
    attention: Callable[[ModelConfig], nn.Module] = staticmethod(llama_attention)  # the layer's, from the config

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.moe is not None, f"{self.family} needs num_local_experts and num_experts_per_tok in its config"
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = self.attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg.hidden_size, cfg.moe, act=cfg.hidden_act)


class MixtralForCausalLM(LlamaForCausalLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = (
        (r"\.block_sparse_moe\.", ".mlp."),
        (r"(\.mlp\.experts\.\d+)\.w1\.", r"\1.gate_proj."),
        (r"(\.mlp\.experts\.\d+)\.w3\.", r"\1.up_proj."),
        (r"(\.mlp\.experts\.\d+)\.w2\.", r"\1.down_proj."),
    )
    decoder_layer = MixtralDecoderLayer
