"""Phi-3 / Phi-4 (`Phi3ForCausalLM`: Phi-3-mini / small / medium, Phi-3.5-mini, Phi-4): Llama's layers with fused
projections in the checkpoint.

The checkpoints hold `self_attn.qkv_proj.weight` ([q heads + 2 kv heads] x head_dim rows, q then k then v) and
`mlp.gate_up_proj.weight` (gate rows, then up rows); `transform_checkpoint` splits them into the q / k / v and gate /
up projections of models/llama.py (the CUDA path fuses them again, `engine.transforms.fuse_projections`). RoPE: the
config's (default, or LongRoPE for the 128K variants: `RopeConfig` type "longrope", whose short factors apply up to
`original_max_position_embeddings`, the context such a model then runs at: `ModelConfig.context_limit`; transformers
switches to the long factors past it for the whole sequence, which the KV cache cannot follow). A sliding window
(Phi-3-mini-4k's 2047) windows every layer (`ModelConfig.layer_windows`). Phi-4-mini's `partial_rotary_factor` 0.75
rotates the first 96 of each head's 128 dims (`ModelConfig.rotary_dim`; its LongRoPE factors cover those 48
frequencies).
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..layers.mlp import split_gate_up
from .llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The fused checkpoint projections, split into the separate ones this model keeps."""
        cfg = self.config
        if name.endswith("self_attn.qkv_proj.weight"):
            q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
            base = name[: -len("qkv_proj.weight")]
            yield from zip((f"{base}q_proj.weight", f"{base}k_proj.weight", f"{base}v_proj.weight"),
                           torch.split(tensor, [q, kv, kv]))
        else:
            yield from split_gate_up(name, tensor) or [(name, tensor)]
