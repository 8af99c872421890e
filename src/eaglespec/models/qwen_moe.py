"""Qwen3-MoE (`Qwen3MoeForCausalLM`: Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention with a mixture of experts;
Qwen2-MoE (`Qwen2MoeForCausalLM`): Qwen2's attention (q/k/v biases) with the same MoE plus one shared expert of
`shared_expert_intermediate_size`, its output scaled by sigmoid(`shared_expert_gate`(x)) (layers/moe.py).

Layer i is pre-norm: `h += self_attn(input_layernorm(h))`, `h += mlp(post_attention_layernorm(h))`. The attention is
Qwen3 dense's (`layers.attention.QKNormAttention`: an RMSNorm over each head's q and k before RoPE, GQA, biases on
q/k/v/o as `attention_bias` says). `mlp` is the MoE (`layers/moe.py`: the softmax top-k router
`SoftmaxTopKRouter`, `num_experts` SwiGLU experts of `moe_intermediate_size`, no shared experts) when
`MoEConfig.is_sparse(i)`, i.e. `i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0` (and `num_experts` >
0), else a dense SwiGLU of `intermediate_size`.

Parameter names are the HF checkpoint's (`model.layers.L.mlp.gate.weight`, `model.layers.L.mlp.experts.E.up_proj.
weight`, `model.layers.L.self_attn.q_norm.weight`, ...: one tensor per expert, as the released checkpoints and
transformers' `save_pretrained` write them), so Qwen3-MoE's rename table is empty (Qwen2-MoE's renames its
`shared_expert`). llama.cpp's `qwen3moe` / `qwen2moe` GGUFs load too: loading/gguf_names.py maps their names (the
router `ffn_gate_inp` -> `mlp.gate`) and splits the experts, stacked there one tensor per projection
(`ffn_{gate,up,down}_exps`), into these per-expert names; the GGUF config has every layer sparse, and `norm_topk_prob`
True for qwen3moe, as llama.cpp runs them (loading/gguf_config.py). Sliding-window attention (`use_sliding_window`,
off in the released models) windows every layer (Qwen3-MoE) or the even ones below `max_window_layers` (Qwen2-MoE), as
transformers does (`ModelConfig.layer_windows`). The router's auxiliary
loss (`output_router_logits`) is training-only and ignored. On CUDA the experts run as grouped GEMMs
(`engine.transforms.use_grouped_experts`), so these targets take CUDA graphs like dense ones.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..layers.embedding import embedding
from ..layers.mlp import GatedMLP
from ..layers.moe import MoE
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary, qk_rows_to_halves
from .base import DecoderOnlyLM, PreNormDecoderLayer, set_windows
from .llama import LlamaForCausalLM, llama_attention
from .olmo2 import Olmo2Attention
from .qwen import qwen2_attention, qwen3_attention


class Qwen3MoeDecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int, attention: Callable[[ModelConfig], nn.Module]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
            self.mlp: nn.Module = MoE(cfg.hidden_size, cfg.moe, act=cfg.hidden_act)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.hidden_act)


class Qwen3MoeModel(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: Callable[[ModelConfig], nn.Module] = qwen3_attention) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3MoeDecoderLayer(cfg, i, attention) for i in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)


class Qwen3MoeForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    checkpoint_ignore: tuple[str, ...] = LlamaForCausalLM.checkpoint_ignore
    attention: Callable[[ModelConfig], nn.Module] = staticmethod(qwen3_attention)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = Qwen3MoeModel(config, type(self).attention)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    """Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention, the MoE with one sigmoid-gated shared
    expert (checkpoint `mlp.shared_expert.*`, renamed to the MoE's `shared_experts`; `mlp.shared_expert_gate`)."""

    checkpoint_renames = ((r"\.mlp\.shared_expert\.", ".mlp.shared_experts."),)
    attention = staticmethod(qwen2_attention)


class OlmoeForCausalLM(Qwen3MoeForCausalLM):
    """OLMoE (OLMoE-1B-7B): Qwen3-MoE's pre-norm layers and checkpoint names (the softmax top-k router over
    `num_experts` experts of `intermediate_size` in every layer, the top-k weights renormalised only when
    `norm_topk_prob`), with OLMo 2's q / k RMSNorms over the whole projections (`olmo2.Olmo2Attention`: the module path
    for attention). `clip_qkv` (null in the releases) is refused by name."""

    attention = Olmo2Attention

    def __init__(self, config: ModelConfig) -> None:
        if config.text.get("clip_qkv") is not None:
            raise ConfigError(f"{config.architecture} with clip_qkv {config.text['clip_qkv']} (q / k / v clamped) is "
                              "not implemented")
        super().__init__(config)


class Ernie4_5_MoeForCausalLM(Qwen3MoeForCausalLM):
    """ERNIE 4.5 MoE (ERNIE-4.5-21B-A3B, 300B-A47B): Llama's attention with RoPE on adjacent pairs (q / k rows
    permuted to halves at load, as `llama.Ernie4_5ForCausalLM`), the MoE on the layers `MoEConfig.from_hf` names (the
    float32 softmax router choosing by probability + `e_score_correction_bias`, stored as `mlp.moe_statics.
    e_score_correction_bias` [1, E]; shared experts), a dense SwiGLU elsewhere; the multi-token-prediction block the
    releases hold (`mtp` names) ignored, as transformers ignores it."""

    checkpoint_renames: tuple[tuple[str, str], ...] = (
        (r"\.mlp\.moe_statics\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),)
    checkpoint_ignore: tuple[str, ...] = Qwen3MoeForCausalLM.checkpoint_ignore + (r"mtp",)
    attention = staticmethod(llama_attention)

    def __init__(self, config: ModelConfig) -> None:
        if config.text.get("use_bias"):
            raise ConfigError(f"{config.architecture} with use_bias (biased experts) is not implemented")
        super().__init__(config)

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """q / k rows from RoPE pairs to halves; the correction bias [1, E] -> [E]."""
        cfg = self.config
        if name.endswith(".mlp.gate.e_score_correction_bias"):
            yield name, tensor.reshape(-1)
            return
        yield name, qk_rows_to_halves(name, tensor, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rotary_dim)
