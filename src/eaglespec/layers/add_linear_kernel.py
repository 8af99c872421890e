"""The residual add that rides on a projection, h += x @ W^T in place, as one Triton kernel with programmatic
dependent launch, for the long steps of small models (o_proj in `PreNormDecoderLayer._forward_folded`: SmolLM2's
32-row tree verify of 256 rows, prefills of 65-512 tokens).

cuBLAS's GEMMs there are bound by their fixed cost, not their work (a 256 x 576 x 576 product is 0.17 GFLOP and
0.66 MB of weights), and a cuBLAS kernel cannot be launched before the kernel before it has ended. On the H200
(`benchmarks/triton_gemm_check.py`, session 29; 30 distinct weights, one call in a graph of 60) this kernel took
o_proj in 2.33 / 2.34 / 2.42 us at 64 / 128 / 256 rows against cuBLAS's 3.14 / 3.16 / 3.23; the same loop on
SmolLM2's other projections was no faster than cuBLAS (q/k/v, gate/up) or slower (down_proj, K = 1,536), so only
o_proj takes it.

`add_linear_(h, x, w) -> h`: h [M, N] (updated in place, row stride free, unit column stride), x [M, K], w [N, K]
(contiguous), one dtype; h <- round(h + x @ w^T) with the product and the add in float32 (as `h.addmm_(x, w.t())`).
Usable when `fits(M, N, K)`: M <= MAX_ROWS, N a multiple of BLOCK_N, K a multiple of BLOCK_K. Program (m, n) holds
BLOCK_M rows by BLOCK_N columns and loops over K in BLOCK_K slices (pipelined by Triton); rows past M load row M - 1
and are never stored (no row mask on the loads: layers/norm_linear_dot_kernel.py says why). float32 operands multiply
in IEEE float32 (no TF32), bf16 / fp16 on tensor cores with float32 sums (under Triton's interpreter, whose bf16
tl.dot is wrong, as exact float32 products). The PDL wait comes first: x is the kernel before's output. Built on
first use, so that `TRITON_INTERPRET=1` (set by the CPU tests) takes effect.
"""

from __future__ import annotations

import functools
import os

import torch

from .pdl import launch_options

BLOCK_M, BLOCK_N, BLOCK_K, STAGES, WARPS = 64, 32, 64, 3, 4  # the best of the probe's sweep at 64-128 rows
MAX_ROWS = 512  # rows measured against cuBLAS (past them cuBLAS's larger tiles are the better bet)


def fits(M: int, N: int, K: int) -> bool:
    return 0 < M <= MAX_ROWS and N % BLOCK_N == 0 and K % BLOCK_K == 0


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_linear_kernel(h, x, w, M, N, s_h, s_x, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: x is the kernel before's output, so wait at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        nb = N // BN
        pid = tl.program_id(0)
        rm = (pid // nb) * BM + tl.arange(0, BM)
        rn = (pid % nb) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        rl = tl.minimum(rm, M - 1).to(tl.int64)  # padding rows read row M - 1, never stored
        acc = tl.zeros([BM, BN], tl.float32)
        for k in range(0, K, BK):
            xt = tl.load(x + rl[:, None] * s_x + (k + rk)[None, :])
            wt = tl.load(w + rn[None, :] * K + (k + rk)[:, None])  # [BK, BN]: the weight slice transposed
            if IEEE:
                acc = tl.dot(xt.to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(xt, wt, acc)
        ptr = h + rm.to(tl.int64)[:, None] * s_h + rn[None, :]
        keep = (rm < M)[:, None]
        acc += tl.load(ptr, mask=keep, other=0.0).to(tl.float32)
        tl.store(ptr, acc.to(h.dtype.element_ty), mask=keep)

    return add_linear_kernel


def add_linear_(h: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    M, N = h.shape
    K = x.shape[1]
    assert fits(M, N, K) and x.shape[0] == M and w.shape == (N, K), "add_linear_: shape"
    assert h.dtype == x.dtype == w.dtype and h.stride(1) == 1 and x.stride(1) == 1 and w.is_contiguous()
    opts = launch_options(h)
    _kernel()[((M + BLOCK_M - 1) // BLOCK_M * (N // BLOCK_N),)](
        h, x, w, M, N, h.stride(0), x.stride(0), K=K, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
        IEEE=h.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        num_stages=STAGES, num_warps=WARPS, **opts)
    return h
