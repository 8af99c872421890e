"""Llama 4 (`Llama4ForCausalLM`, and `Llama4ForConditionalGeneration` for text: Llama-4-Scout-17B-16E,
Llama-4-Maverick-17B-128E): Llama's pre-norm layers with chunked attention, NoPE layers and a mixture of experts.

Layer i is pre-norm: `h += self_attn(input_layernorm(h))`, `h += feed_forward(post_attention_layernorm(h))`.
- Attention: GQA, RoPE (llama3 scaling) on adjacent pairs (transformers' complex form), except on the NoPE layers
  (`no_rope_layers[i]` 0; by default every `no_rope_layer_interval`-th, 4: `ModelConfig.rope_layers`). The RoPE layers
  see only their query's chunk of `attention_chunk_size` positions (8,192; `layer_types` "chunked_attention":
  `layers.context.Chunk`) and, with `use_qk_norm` (Scout), norm q and k per head with a weightless RMSNorm after RoPE;
  since RoPE rotates pairs and keeps each head's norm, that equals the norm before RoPE, which is where this engine's
  `QKNormAttention` and its fused kernels apply it (`layers.norm.UnitRMSNorm`: fixed ones). The NoPE layers attend to
  everything and, with `attn_temperature_tuning`, scale each query by 1 + attn_scale * log(1 + floor((p + 1) /
  floor_scale)) at position p (`GQAAttention.temperature`; 1 below floor_scale - 1 = 8,191).
- Feed-forward: the MoE on the layers `moe_layers` lists (else every `interleave_moe_layer_step`-th: all of Scout's,
  every other of Maverick's), else a SwiGLU of `intermediate_size_mlp`. The MoE (`layers/moe.py`,
  `MoEConfig.weight_inputs`): the top-`num_experts_per_tok` (1) logits of the router, each expert's input the token
  times the sigmoid of its logit, plus one shared expert of `intermediate_size` on the token itself.

As GLM-4's, the pair rotation becomes this engine's halves by permuting q_proj's and k_proj's rows at load
(`layers.rotary.qk_rows_to_halves`: scores unchanged, the weightless norms too). Checkpoint names: the layers'
`feed_forward` is the MoE's or MLP's `mlp` (`router` -> `gate`, `shared_expert` -> `shared_experts`); each MoE layer's
experts come fused, `experts.gate_up_proj` [E, H, 2I] (gate columns, then up) and `experts.down_proj` [E, I, H],
split per expert at load (`transform_checkpoint`). On CUDA the experts run as the grouped kernels (their first GEMM
scaling the rows by the routing weights), so the model takes CUDA graphs.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import CheckpointError
from ..layers.attention import GQAAttention, QKNormAttention
from ..layers.context import Chunk
from ..layers.embedding import embedding
from ..layers.mlp import GatedMLP
from ..layers.moe import MoE
from ..layers.norm import RMSNorm, UnitRMSNorm
from ..layers.rotary import Rotary, qk_rows_to_halves
from .base import DecoderOnlyLM, PreNormDecoderLayer, VisionLanguageForText, set_windows
from .llama import llama_attention


def llama4_attention(cfg: ModelConfig, layer_idx: int) -> GQAAttention:
    """Layer `layer_idx`'s attention: weightless q / k norms on the RoPE layers with `use_qk_norm` (else Llama's), the
    query temperature on the NoPE layers with `attn_temperature_tuning` (the chunks: `Llama4TextModel`)."""
    text = cfg.text
    args = (cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
    rope = cfg.uses_rope(layer_idx)
    if rope and text.get("use_qk_norm", True):
        attn: GQAAttention = QKNormAttention(*args, eps=cfg.rms_norm_eps, bias=cfg.attention_bias)
        attn.q_norm, attn.k_norm = UnitRMSNorm(cfg.head_dim, cfg.rms_norm_eps), UnitRMSNorm(cfg.head_dim,
                                                                                              cfg.rms_norm_eps)
    else:
        attn = llama_attention(cfg)
    if not rope and text.get("attn_temperature_tuning", True):
        attn.temperature = (float(text.get("floor_scale", 8192)), float(text.get("attn_scale", 0.1)), 1.0)
    return attn


def chunked_layers(cfg: ModelConfig) -> tuple[bool, ...]:
    """Per layer, whether it attends in chunks: `layer_types`' "chunked_attention", else (transformers' default) the
    RoPE layers when `attention_chunk_size` is set."""
    text = cfg.text
    n = cfg.num_hidden_layers
    if text.get("layer_types"):
        return tuple(t == "chunked_attention" for t in text["layer_types"])
    return tuple(cfg.uses_rope(i) and text.get("attention_chunk_size") is not None for i in range(n))


class Llama4DecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = llama4_attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
            self.mlp: nn.Module = MoE(cfg.hidden_size, cfg.moe, act=cfg.hidden_act)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, int(cfg.text.get("intermediate_size_mlp") or cfg.intermediate_size),
                                act=cfg.hidden_act)


class Llama4TextModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Llama4DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        size = cfg.text.get("attention_chunk_size")
        for layer, chunked in zip(self.layers, chunked_layers(cfg)):
            if chunked and size:
                layer.self_attn.window = Chunk(int(size))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)


class Llama4ForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = (
        (r"\.feed_forward\.router\.", ".mlp.gate."),
        (r"\.feed_forward\.shared_expert\.", ".mlp.shared_experts."),
        (r"\.feed_forward\.", ".mlp."),
    )
    checkpoint_ignore: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = Llama4TextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """q / k rows from pairs to halves; a layer's fused experts split per expert (module docstring)."""
        cfg = self.config
        base, _, leaf = name.rpartition(".")
        if not base.endswith(".mlp.experts"):
            yield name, qk_rows_to_halves(name, tensor, cfg.num_attention_heads, cfg.num_key_value_heads,
                                          cfg.rotary_dim)
            return
        if leaf == "gate_up_proj":  # [E, H, 2I]: gate columns, then up
            gate, up = tensor.chunk(2, dim=-1)
            for e in range(tensor.shape[0]):
                yield f"{base}.{e}.gate_proj.weight", gate[e].t()
                yield f"{base}.{e}.up_proj.weight", up[e].t()
        elif leaf == "down_proj":  # [E, I, H]
            for e in range(tensor.shape[0]):
                yield f"{base}.{e}.down_proj.weight", tensor[e].t()
        else:
            raise CheckpointError(f"{name}: Llama 4's experts hold gate_up_proj and down_proj, not this")


class Llama4ForConditionalGeneration(VisionLanguageForText):
    """Llama 4's multimodal checkpoint for text (`base.VisionLanguageForText`); its vision tower is `vision_model`."""

    language_model_class = Llama4ForCausalLM
    checkpoint_renames: tuple[tuple[str, str], ...] = (VisionLanguageForText.checkpoint_renames
                                                       + Llama4ForCausalLM.checkpoint_renames)
    checkpoint_ignore: tuple[str, ...] = VisionLanguageForText.checkpoint_ignore + (r"^(?:model\.)?vision_model\.",)

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The language model's (its names end alike under the wrapper's prefix)."""
        yield from self.language_model.transform_checkpoint(name, tensor)
