"""Inference transforms applied to built models (DESIGN.md principle 8: model files stay plain).

- `fuse_projections(model)`: q/k/v into one GEMM and gate/up into one GEMM, in every GQA attention and gated MLP;
  fewer, larger kernels, which matters when a decode step is bound by kernel count (small models, batch 1).
- `use_rope_store_kernel(model)` (CUDA): RoPE on q/k and both KV-cache writes as one Triton kernel per layer.
- `compile_elementwise(model)`: RMSNorm, residual-add + RMSNorm, RoPE and SiLU-gating through `torch.compile` (one
  fused kernel each instead of ~6), shapes dynamic so one compilation serves every batch and length bucket.
Both change nothing numerically beyond floating-point reassociation; neither is applied to models being trained.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.attention import GQAAttention
from ..layers.mlp import GatedMLP, silu_mul
from ..layers.norm import RMSNorm, add_rms_norm, rms_norm
from ..layers.rotary import apply_rotary


def fuse_projections(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, GQAAttention) and hasattr(m, "q_proj"):
            m.fuse_qkv()
        elif isinstance(m, GatedMLP) and hasattr(m, "gate_proj"):
            m.fuse_gate_up()
    return model


_compiled: dict[str, object] = {}


def compile_elementwise(model: nn.Module) -> nn.Module:
    if not _compiled:
        for name, fn in (("norm", rms_norm), ("add_norm", add_rms_norm), ("rope", apply_rotary),
                         ("silu_mul", silu_mul)):
            _compiled[name] = torch.compile(fn, dynamic=True, fullgraph=True)
    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.impl, m.add_impl = _compiled["norm"], _compiled["add_norm"]
        elif isinstance(m, GQAAttention):
            m.rope = _compiled["rope"]
        elif isinstance(m, GatedMLP):
            m.gated_act = _compiled["silu_mul"]
    return model


def use_rope_store_kernel(model: nn.Module) -> nn.Module:
    """RoPE and the KV-cache writes of every fused GQA attention as one Triton kernel (layers/rope_kv_kernel.py)."""
    from ..layers.rope_kv_kernel import rope_store

    for m in model.modules():
        if isinstance(m, GQAAttention) and hasattr(m, "qkv_proj") and (m.head_dim // 2) & (m.head_dim // 2 - 1) == 0:
            m.rope_store = rope_store
    return model


def prepare_for_inference(model: nn.Module, device: torch.device, fuse: bool | None,
                          compile: bool | None) -> nn.Module:
    """Apply the transforms an EngineConfig asks for (None: only on CUDA; fused projections on CUDA come with the
    fused RoPE + KV-store Triton kernel). On the H200, compiling took SmolLM2-135M from 302 to 795 tok/s and a
    Llama-8B-shaped model from 172 to 209 tok/s (docs/benchmarks.md); on the CPU it only adds compile time."""
    if fuse or (fuse is None and device.type == "cuda"):
        fuse_projections(model)
        if device.type == "cuda":
            use_rope_store_kernel(model)
    if compile or (compile is None and device.type == "cuda"):
        compile_elementwise(model)
    return model
