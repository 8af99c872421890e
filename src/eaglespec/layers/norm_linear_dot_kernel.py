"""The add + RMSNorm + projection kernel on tensor cores, for steps of DOT_MIN_ROWS (6)..MAX_ROWS rows (a one-row
verify of 6-16 tokens, the verifies of chains at 2-16 rows, drafter forwards of several rows, plain decoding at 6-64
rows).

`norm_linear_kernel` serves 1..5 rows with reductions on the CUDA cores, one program per row past one; past 8 rows
that re-reads the weight tile once per row and loses to cuBLAS (docs/benchmarks.md, "Session 13"), and at 6-8 rows it
lost to this kernel (rows padded to 16: "Session 24", "Session 65"), but not at 2-5. cuBLAS in turn
needs the residual add + norm and the SiLU gating as separate kernels (9 kernels per Llama layer instead of 6) and
cannot start loading its weights before the kernel before it ends. Here a program multiplies BLOCK_M rows by BLOCK_N
columns with `tl.dot`, its weight tile loaded before the programmatic-launch wait (layers/pdl.py).

`launch(h2, d2, nw, w, h_out, y, eps, gated, norm)`, called by `norm_linear_kernel._launch` with its
operands: h2, d2 [M, K] (d2 None: no residual add), nw [K] (norm False: a plain projection, nw unused), w [N or 2N,
K], h_out [M, K] (= h2 when d2 is None), y [M, N]; the same results and roundings as the CUDA-core kernel (the sum,
the normalised row, its product with the norm weight and each projection rounded to the input dtype). Program
(n, m): rows m * BLOCK_M.., columns n * BLOCK_N.. (and their up rows when gated); each row read whole as one or two
power-of-two chunks (`norm_linear_kernel._k_chunks`: 576 = 512 + 64), its sum of squares recomputed per program
(from L2); the programs of column block 0 write h_out. Rows past M (the last block's padding) load row M - 1 and
are not stored: row-masked loads made steps whose M is not a multiple of 16 (which Triton specialises) cost up to 25%
more per projection, e.g. an 8-row tree of 7 tokens (56 rows) 0.900 against 0.777 ms a verify (session 28). The
blocks are `DOT_BLOCKS` (the GPU probes set it), narrowed by `_blocks`.
float32 operands multiply in IEEE float32 (no TF32), bf16 / fp16 on tensor cores with float32 sums (under Triton's
interpreter, whose bf16 tl.dot is wrong, as exact float32 products). Built on first use, so that
`TRITON_INTERPRET=1` takes effect.
"""

from __future__ import annotations

import functools

import torch

from .pdl import interpreted, launch_options


_product = None  # the kernel's helper, bound when the kernel is built


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def product(x, w, IEEE: tl.constexpr):
        """x [BLOCK_M, BK] @ w [BK, BLOCK_N] in float32. IEEE: float32 operands without TF32 (float32 inputs, and
        Triton's interpreter, whose bf16 tl.dot is wrong: the operands are exact in float32 and the sums float32
        either way). One dot over the whole chunk: as a batched dot over narrower chunks it was 35-70% slower on the
        H200 (docs/benchmarks.md, "Session 28"), as separate chunks on their own accumulators (independent MMA
        chains) 9-18% slower in whole graphs ("Session 34"): each chunk stages its operands with its own barriers."""
        if IEEE:
            return tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        return tl.dot(x, w)

    # the kernel calls the helper as a module global: Triton 3.6's interpreter resolves a jit function's callees
    # among its module's globals only (as in short_attention_kernel)
    globals().update(_product=product)

    @triton.jit
    def norm_linear_dot_kernel(h, d, nw, w, h_out, y, M, N, eps, K: tl.constexpr, HAS_D: tl.constexpr,
                               GATED: tl.constexpr, NORM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BK1: tl.constexpr, BK2: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: only weights are read before the wait below
            tl.extra.cuda.gdc_launch_dependents()
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        dt = h_out.dtype.element_ty
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = rn < N
        # weight tiles transposed for the product: [BK, BLOCK_N] (gate rows, then up rows N further on)
        rk1 = tl.arange(0, BK1)
        km1 = rk1 < K
        wm1 = km1[:, None] & nm[None, :]
        w1 = tl.load(w + rn[None, :] * K + rk1[:, None], mask=wm1, other=0.0)
        if GATED:
            u1 = tl.load(w + (rn + N)[None, :] * K + rk1[:, None], mask=wm1, other=0.0)
        if NORM:
            g1 = tl.load(nw + rk1, mask=km1, other=0.0).to(tl.float32)
        if BK2 > 0:  # the row's tail past BK1
            rk2 = BK1 + tl.arange(0, BK2)
            km2 = rk2 < K
            wm2 = km2[:, None] & nm[None, :]
            w2 = tl.load(w + rn[None, :] * K + rk2[:, None], mask=wm2, other=0.0)
            if GATED:
                u2 = tl.load(w + (rn + N)[None, :] * K + rk2[:, None], mask=wm2, other=0.0)
            if NORM:
                g2 = tl.load(nw + rk2, mask=km2, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mm = rm < M
        msk1 = mm[:, None] & km1[None, :]
        # rows past M load row M - 1 (their products are never stored), so the loads carry no row mask: with one,
        # a step whose M is not a multiple of 16 cost up to 25% more per projection (module docstring)
        rl = tl.minimum(rm, M - 1)
        x1 = tl.load(h + rl[:, None] * K + rk1[None, :], mask=km1[None, :], other=0.0)
        if HAS_D:  # the residual sum, rounded; column block 0 writes it
            x1 = (x1.to(tl.float32) + tl.load(d + rl[:, None] * K + rk1[None, :], mask=km1[None, :], other=0.0)
                  .to(tl.float32)).to(dt)
            if pid_n == 0:
                tl.store(h_out + rm[:, None] * K + rk1[None, :], x1, mask=msk1)
        if BK2 > 0:
            msk2 = mm[:, None] & km2[None, :]
            x2 = tl.load(h + rl[:, None] * K + rk2[None, :], mask=km2[None, :], other=0.0)
            if HAS_D:
                x2 = (x2.to(tl.float32) + tl.load(d + rl[:, None] * K + rk2[None, :], mask=km2[None, :], other=0.0)
                      .to(tl.float32)).to(dt)
                if pid_n == 0:
                    tl.store(h_out + rm[:, None] * K + rk2[None, :], x2, mask=msk2)
        if NORM:  # the module path's roundings: x * rstd, then * weight, each to dt
            x1f = x1.to(tl.float32)
            ss = tl.sum(x1f * x1f, axis=1)
            if BK2 > 0:
                x2f = x2.to(tl.float32)
                ss += tl.sum(x2f * x2f, axis=1)
            r = 1.0 / tl.sqrt(ss / K + eps)
            x1 = ((x1f * r[:, None]).to(dt).to(tl.float32) * g1[None, :]).to(dt)
            if BK2 > 0:
                x2 = ((x2f * r[:, None]).to(dt).to(tl.float32) * g2[None, :]).to(dt)
        # [BLOCK_M, BLOCK_N] float32 products
        acc = _product(x1, w1, IEEE)
        if BK2 > 0:
            acc += _product(x2, w2, IEEE)
        out = acc.to(dt)
        if GATED:
            up = _product(x1, u1, IEEE)
            if BK2 > 0:
                up += _product(x2, u2, IEEE)
            gv = out.to(tl.float32)
            out = ((gv / (1.0 + tl.exp(-gv))).to(dt).to(tl.float32) * up.to(dt).to(tl.float32)).to(dt)
        tl.store(y + rm[:, None] * N + rn[None, :], out, mask=mm[:, None] & nm[None, :])

    return norm_linear_dot_kernel


# (BLOCK_M, BLOCK_N, num_warps): the best of the sweep on the H200 for steps of 16-32 rows
# (benchmarks/dot_rows_check.py, session 14: against 16x16x4, 16x64x4, 16x32x2, 32x32x4, 16x64x8, 32x16x4)
DOT_BLOCKS = (16, 32, 4)
SMEM_BYTES = 160 << 10  # the tiles tl.dot stages in shared memory stay under this (the H200 has 227 KB a block)


def _blocks(K: int, gated: bool, elt: int) -> tuple[int, int, int]:
    """`DOT_BLOCKS`, narrowed (columns first, then rows, down to 16) until the row and weight tiles of a K-wide input
    fit in SMEM_BYTES (the drafter's fc reads 3 x 576 = 1728 -> 2048 lanes)."""
    bm, bn, warps = DOT_BLOCKS
    while _tile_bytes(bm, bn, K, gated, elt) > SMEM_BYTES and max(bm, bn) > 16:
        if bn > 16:
            bn //= 2
        else:
            bm //= 2
    return bm, bn, warps


def fits(K: int, gated: bool, elt: int, limit: int | None) -> bool:
    """Whether the tiles of a K-wide input of `elt`-byte values, as `_blocks` narrows them, fit `limit` bytes of
    shared memory (None: no limit, e.g. Triton's interpreter). They do for every bf16 layer up to ONE_SHOT_K; float32
    inputs over 1,024 wide may not: a drafter's fc (1,728 -> 2,048 lanes) needs (16 + 16) x 2,048 x 4 = 256 KB, over
    the H200's 227 KB a block."""
    return limit is None or _tile_bytes(*_blocks(K, gated, elt)[:2], K, gated, elt) <= limit


def _tile_bytes(bm: int, bn: int, K: int, gated: bool, elt: int) -> int:
    """Shared memory of one program's tiles: bm rows and bn weight columns (twice when gated) of K's chunks."""
    return (bm + bn * (2 if gated else 1)) * sum(_chunks(K)) * elt


@functools.cache
def _device_shared_limit(index: int) -> int:
    import triton

    return int(triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"])


def shared_limit(device: torch.device) -> int | None:
    """The shared memory a block may opt into on `device` (bytes; what Triton checks a launch against), None off
    CUDA or under Triton's interpreter."""
    if device.type != "cuda" or interpreted():
        return None
    return _device_shared_limit(device.index if device.index is not None else torch.cuda.current_device())


def _chunks(K: int) -> tuple[int, int]:
    from .norm_linear_kernel import _k_chunks

    bk1, bk2 = _k_chunks(K)
    return max(bk1, 16), (max(bk2, 16) if bk2 else 0)  # tl.dot: every dimension at least 16


def launch(h2: torch.Tensor, d2: torch.Tensor | None, nw: torch.Tensor | None, w: torch.Tensor, h_out: torch.Tensor,
           y: torch.Tensor, eps: float, gated: bool, norm: bool) -> None:
    M, K = h2.shape
    N = y.shape[1]
    bm, bn, warps = _blocks(K, gated, h2.element_size())
    bk1, bk2 = _chunks(K)
    grid = ((N + bn - 1) // bn, (M + bm - 1) // bm)
    _kernel()[grid](h2, d2 if d2 is not None else h2, nw if norm else h2, w, h_out, y, M, N, eps,
                    K=K, HAS_D=d2 is not None, GATED=gated, NORM=norm, BLOCK_M=bm, BLOCK_N=bn, BK1=bk1, BK2=bk2,
                    IEEE=h2.dtype == torch.float32 or interpreted(),
                    num_warps=warps, **launch_options(h2))
