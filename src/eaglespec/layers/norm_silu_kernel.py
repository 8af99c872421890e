"""SiLU gating with the MLP's RMSNorm applied after its gate/up projection: one Triton kernel per step.

An RMSNorm whose weight g is folded into the next projection's columns (W' = W diag(g), `engine.transforms.
fold_norms`) leaves a per-row scale: norm(h) @ W^T = r * (h @ W'^T) with r = 1 / sqrt(mean(h^2) + eps). The scale can
then ride on the kernel after the projection instead of a norm kernel before it (cuBLAS takes no prologue). For the
MLP half of a pre-norm layer that kernel is the SiLU gating:

`norm_silu_mul(gate_up, h, eps) -> act`: gate_up [..., 2I] = h @ W'^T (gate then up, the fused projection's output),
h [..., K] its input (the residual stream), act [..., I] = silu(r * gate) * (r * up), computed in float32 and returned
in gate_up's dtype. Program (row, block of BLOCK_I columns of I): each reduces its row of h (K is small: the
kernel serves the small models whose layers take the fused norm + projection kernel, on CUDA only).
`norm_silu_mul_reference` is the same computation in PyTorch (the tests' reference). The kernel is built on first
use, so that `TRITON_INTERPRET=1` (set by the CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .norm import rms_scaled
from .pdl import launch_options

# columns per program: SmolLM2's 1,536 in three (H200, 128 rows: 77 us per verify; 256: 80, 2,048: 87, 128: 100)
BLOCK_I = 512


def norm_silu_mul_reference(gate_up: torch.Tensor, h: torch.Tensor, eps: float) -> torch.Tensor:
    gate, up = rms_scaled(gate_up, h, eps).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def norm_silu_kernel(gu, x, out, K, N, eps, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        xr = tl.load(x + row * K + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(xr * xr, axis=0) / K + eps)  # rms_scale's float32 formula
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < N
        g = tl.load(gu + row * 2 * N + cols, mask=m, other=0.0).to(tl.float32) * r
        u = tl.load(gu + row * 2 * N + N + cols, mask=m, other=0.0).to(tl.float32) * r
        act = g / (1.0 + tl.exp(-g)) * u
        tl.store(out + row * N + cols, act.to(out.dtype.element_ty), mask=m)

    return norm_silu_kernel


def norm_silu_mul(gate_up: torch.Tensor, h: torch.Tensor, eps: float) -> torch.Tensor:
    """gate_up [..., 2I], h [..., K] with the same leading shape -> silu(r * gate) * (r * up) [..., I]."""
    lead, K = h.shape[:-1], h.shape[-1]
    I = gate_up.shape[-1] // 2
    assert gate_up.shape[:-1] == lead and gate_up.shape[-1] == 2 * I
    gu, x = gate_up.reshape(-1, 2 * I).contiguous(), h.reshape(-1, K).contiguous()
    out = torch.empty(*lead, I, dtype=gate_up.dtype, device=gate_up.device)
    M = gu.shape[0]
    if M:
        block = min(BLOCK_I, 1 << (I - 1).bit_length())
        _kernel()[(M, (I + block - 1) // block)](gu, x, out, K, I, eps, BLOCK_K=1 << (K - 1).bit_length(),
                                                 BLOCK=block, **launch_options(out))
    return out
