"""gpt-oss (`GptOssForCausalLM`: gpt-oss-20b, gpt-oss-120b): Llama's pre-norm layer with attention sinks, alternating
sliding-window and full attention, and a mixture of clamped-SwiGLU experts with biases.

Layer i is pre-norm: `h += self_attn(input_layernorm(h))`, `h += mlp(post_attention_layernorm(h))`. The attention is
GQA with biases on q/k/v/o and one learned sink logit per head (`self_attn.sinks` [H]: each head's softmax also runs
over it, and its share goes to no value: `layers.attention.sdpa_written_out`), RoPE with YaRN (factor 32 over 4,096
positions, `truncate` false), and a window of `sliding_window` (128) on the layers `layer_types` names
"sliding_attention" (every other one; `ModelConfig.layer_windows`). `mlp` is the MoE in every layer (`layers/moe.py`):
the router's logits with a bias, the softmax of the top `num_experts_per_tok` logits (the renormalised top-k of the
softmax), `num_local_experts` experts of `intermediate_size`, each `layers/mlp.ClampedSwiGLUMLP` (gate clamped above,
up both ways at `swiglu_limit`, gate * sigmoid(`swiglu_alpha` gate) * (up + 1), biases everywhere). RMSNorm is
Llama's (the same in float32; in bf16 transformers rounds after the weight, Llama before it).

Checkpoint names: the releases hold the router as `mlp.router.{weight,bias}` (renamed to the MoE's `mlp.gate`) and
every layer's experts fused, `mlp.experts.gate_up_proj` [E, H, 2I] (gate and up columns interleaved) with
`gate_up_proj_bias` [E, 2I], `down_proj` [E, I, H] with `down_proj_bias` [E, H], or, as released, the two weights
in MXFP4: `*_blocks` uint8 [E, rows, H/32, 16] (two E2M1 codes a byte, low nibble first) and `*_scales` uint8
[E, rows, H/32] (E8M0: 2^(s - 127) a block of 32), rows the output features; `transform_checkpoint` splits them into
the per-expert projections (dequantizing MXFP4 once both halves have arrived). On CUDA the experts run as the
grouped kernels with their bias and clamp epilogues (`engine.transforms.use_grouped_experts`), so the model takes
CUDA graphs; the sinks join the short-query kernel's softmax (few-token steps), else the written-out attention's.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import CheckpointError, ConfigError
from ..layers.attention import GQAAttention
from ..layers.embedding import embedding
from ..layers.moe import MoE
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from .base import DecoderOnlyLM, PreNormDecoderLayer, set_windows

# E2M1 codes (bit 3 the sign) -> values
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequant_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> float32 [..., G * 32]: element 2j of a block is the low
    nibble of byte j, 2j + 1 the high one, each times 2^(scale - 127)."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise CheckpointError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match "
                              "([..., G, 16] and [..., G])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    b = blocks.to(torch.uint8)
    vals = torch.stack((lut[(b & 0x0F).long()], lut[(b >> 4).long()]), -1).flatten(-2)  # [..., G, 32]
    vals = torch.ldexp(vals, scales.to(torch.int32)[..., None] - 127)
    return vals.flatten(-2)


class GptOssAttention(GQAAttention):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, bias=cfg.attention_bias)
        self.sinks = nn.Parameter(torch.zeros(cfg.num_attention_heads))


class GptOssDecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.moe is not None
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = GptOssAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg.hidden_size, cfg.moe)


class GptOssModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GptOssDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        set_windows(self.layers, cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope)


_EXPERTS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


class GptOssForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ((r"\.mlp\.router\.", ".mlp.gate."),)
    checkpoint_ignore: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)

    def __init__(self, config: ModelConfig) -> None:
        if config.moe is None:
            raise ConfigError(f"{config.architecture} needs num_local_experts and num_experts_per_tok in its config")
        super().__init__(config)
        self.model = GptOssModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._mxfp4: dict[str, torch.Tensor] = {}  # one half of an MXFP4 pair, until the other arrives

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The fused (or MXFP4) experts of a layer -> its per-expert projections; other tensors as they are."""
        base, _, leaf = name.rpartition(".")
        if not base.endswith(".mlp.experts"):
            yield name, tensor
            return
        if leaf.endswith(("_blocks", "_scales")):
            stem, half = leaf.rsplit("_", 1)
            other = self._mxfp4.pop(f"{base}.{stem}_{'scales' if half == 'blocks' else 'blocks'}", None)
            if other is None:
                self._mxfp4[name] = tensor
                return
            blocks, scales = (tensor, other) if half == "blocks" else (other, tensor)
            yield from self._split(base, stem, dequant_mxfp4(blocks, scales).transpose(1, 2))  # [E, in, out]
            return
        if leaf not in _EXPERTS:
            raise CheckpointError(f"{name}: gpt-oss experts hold {', '.join(_EXPERTS)} (or their MXFP4 _blocks / "
                                  "_scales), not this")
        yield from self._split(base, leaf, tensor)

    def _split(self, base: str, leaf: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """One fused expert tensor (transformers' layout: weights [E, in, out], biases [E, out]) -> per expert."""
        for e in range(t.shape[0]):
            pre = f"{base}.{e}"
            if leaf == "gate_up_proj":  # columns: gate, up, gate, up, ...
                yield f"{pre}.gate_proj.weight", t[e, :, 0::2].t()
                yield f"{pre}.up_proj.weight", t[e, :, 1::2].t()
            elif leaf == "gate_up_proj_bias":
                yield f"{pre}.gate_proj.bias", t[e, 0::2]
                yield f"{pre}.up_proj.bias", t[e, 1::2]
            elif leaf == "down_proj":
                yield f"{pre}.down_proj.weight", t[e].t()
            else:
                yield f"{pre}.down_proj.bias", t[e]
