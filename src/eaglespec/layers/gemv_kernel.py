"""x @ weight.T for one to a few rows of a wide layer in one Triton kernel: the decode GEMVs of large models.

At batch 1 a Llama-3.1-8B decode step is its weights read once; cuBLAS reads the 4096-wide q/k/v (50 MB) and o_proj
(34 MB) at only ~3.1 TB/s on the H200, o_proj through a split-K kernel plus a separate reduce (session 10's
`benchmarks/decode_profile.py`: 863 us of a 4.6 ms step, and 104 us of reduces), where its gate/up reads 4.1 TB/s.
Here a program owns BLOCK_N output features and walks K in BLOCK_K steps (Triton pipelines the loads over
`num_stages`), multiplying each [BLOCK_N, BLOCK_K] weight tile by the rows' [BLOCK_M, BLOCK_K] slice of x into a
float32 [BLOCK_M, BLOCK_N, BLOCK_K] accumulator that is reduced over K once at the end: no split-K, no second kernel.

`gemv_rows(x, weight, cfg=None, bias=None) -> y`: x [..., K] with at most MAX_ROWS rows, weight [N, K] (contiguous),
bias [N] or None -> y [..., N] in x's dtype: F.linear(x, weight, bias) with float32 accumulation and the bias added to
the float32 sum before the one rounding, as cuBLAS's bias epilogue does (the order of the sums differs from cuBLAS's:
bf16 results may differ by a rounding step). `cfg` = (BLOCK_N, BLOCK_K, num_warps, num_stages), default `cfg_for(N, K)`;
the GPU probes (`benchmarks/small_kernels_check.py --only=gemv`, `benchmarks/moe_cold_sweep.py --only=gemv`) sweep it
with the weights cold in L2, as a decode step meets them.
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .pdl import launch_options

MAX_ROWS = 4
USE_PDL = True  # layers/pdl.py: this kernel's own switch (the benchmarks' A/B)
# BLOCK_N, BLOCK_K, num_warps, num_stages: the best of session 11's sweep for Llama-8B's o_proj and down_proj (one row,
# cold weights, H200): o_proj 13.2 -> 10.7 us, down 31.9 -> 29.2 us (4.0 TB/s); q/k/v 15.6 -> 14.3 us at (4, 512, 2, 4)
DEFAULT_CFG = (4, 1024, 2, 4)
# Inputs of 4,096-8,192 (a multiple of 2,048) to over 2,048 features: two features a program in blocks of 2,048
# (session 61, H100, one row, cold weights, `moe_cold_sweep.py --only=gemv --gemv-cfgs=...`): Llama-8B's q/k/v 18.95
# -> 17.13 us and o_proj 12.75 -> 11.85, gpt-oss-20b's o_proj 9.61 -> 9.23; Llama-8B's down_proj (K 14,336) lost
# (40.1 -> 41.3), inputs of 2,048-2,880 lost (Qwen3's q/k/v 7.54 -> 9.01). Whole decode steps (host_gap.py,
# alternating): Llama-8B 5.797 -> 5.697 ms, gpt-oss-20b 3.227 either way, while Qwen3-30B-A3B, whose 2,048 x 4,096
# o_proj took it alone (6.57 -> 5.99 us), lost 3.517 -> 3.622 ms: 2,048 features and fewer keep their tiles. At
# K 8,192 (alone, no step measured): Llama-70B's q/k/v 57.05 -> 55.29 us, o_proj 45.65 -> 45.53.
# None: the rule off (the benchmarks' A/B).
WIDE_K_CFG: tuple[int, int, int, int] | None = (2, 2048, 4, 3)


def cfg_for(N: int, K: int, itemsize: int = 2) -> tuple[int, int, int, int]:
    """The configuration for a weight [N, K] of `itemsize`-byte elements (session 55's H100 sweep,
    `benchmarks/moe_cold_sweep.py --only=gemv`, 11 shapes of 0.5-117 MB from a MoE router's gate to Llama-8B's
    down_proj: each within 9% of its best configuration): narrow layers in more, smaller programs (a program per
    feature up to N 1,024: MLA's kv_a 576 x 7,168 5.4 us, 6.6 at two features a program; a noaux_tc router's float32
    384 x 7,168 gate 5.9 us with 8 warps, 9.6 with 4, cuBLAS 7.9); inputs whose blocks of 1,024 would read past K
    more than blocks of 512 do (MLA's q_b, K 1,536) in blocks of 512. gpt-oss's K 2,880 pads to 3,072 either way: its
    32 x 2,880 router gate took 1.47 us at (1, 1024, 4, 3), 2.76 at (4, 512, 2, 4) (session 60, H100). Inputs of
    4,096-8,192 (multiples of 2,048) to over 2,048 features: WIDE_K_CFG (session 61)."""
    if -(-K // 1024) * 1024 > -(-K // 512) * 512:
        return (4, 512, 2, 4)
    if WIDE_K_CFG is not None and N > 2048 and 4096 <= K <= 8192 and K % 2048 == 0:
        return WIDE_K_CFG
    if N <= 1024:
        return (1, 1024, 8 if itemsize >= 4 else 4, 3)
    if N <= 2048:
        return (2, 1024, 4, 3)
    return DEFAULT_CFG


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(x, w, b, y, M, N, s_xm, s_ym, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, BIAS: tl.constexpr, PDL: tl.constexpr = False):
        # K constexpr: a layer's width (few per model), and the interpreter's loop bound
        if PDL:  # layers/pdl.py: the next kernel may start; the first weight tile is read before the wait
            tl.extra.cuda.gdc_launch_dependents()
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, BLOCK_M)
        rk = tl.arange(0, BLOCK_K)
        nm = rn < N
        mm = rm < M
        km = rk < K
        wt = tl.load(w + rn[:, None] * K + rk[None, :], mask=nm[:, None] & km[None, :], other=0.0)  # [BN, BK]
        if PDL:
            tl.extra.cuda.gdc_wait()
        xt = tl.load(x + rm[:, None] * s_xm + rk[None, :], mask=mm[:, None] & km[None, :], other=0.0)  # [BM, BK]
        acc = xt.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :]
        for k0 in range(BLOCK_K, K, BLOCK_K):
            kk = k0 + rk
            km = kk < K
            wt = tl.load(w + rn[:, None] * K + kk[None, :], mask=nm[:, None] & km[None, :], other=0.0)  # [BN, BK]
            xt = tl.load(x + rm[:, None] * s_xm + kk[None, :], mask=mm[:, None] & km[None, :], other=0.0)  # [BM, BK]
            acc += xt.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :]
        out = tl.sum(acc, 2)  # [BM, BN]
        if BIAS:
            out += tl.load(b + rn, mask=nm, other=0.0).to(tl.float32)[None, :]
        tl.store(y + rm[:, None] * s_ym + rn[None, :], out.to(y.dtype.element_ty), mask=mm[:, None] & nm[None, :])

    return gemv_kernel


def gemv_rows(x: torch.Tensor, weight: torch.Tensor, cfg: tuple[int, int, int, int] | None = None,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    *lead, K = x.shape
    N = weight.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    assert 1 <= M <= MAX_ROWS and weight.shape[1] == K and weight.is_contiguous(), "gemv_rows: shape"
    assert bias is None or (bias.shape == (N,) and bias.is_contiguous()), "gemv_rows: bias shape"
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    bn, bk, warps, stages = cfg or cfg_for(N, K, weight.element_size())
    bm = 1 if M == 1 else 2 if M == 2 else 4
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _kernel()[((N + bn - 1) // bn,)](x2, weight, bias if bias is not None else y, y, M, N, x2.stride(0), y.stride(0),
                                     K=K, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BIAS=bias is not None,
                                     num_warps=warps, num_stages=stages, **launch_options(x2, USE_PDL))
    return y.view(*lead, N)
