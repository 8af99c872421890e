"""One Triton kernel for a pre-norm projection of a few rows: residual add, RMSNorm and the GEMV in one launch.

At batch 1 a decode step of a small model is bound by kernel count, not bytes (SmolLM2-135M: ~280 kernels of a few
microseconds each, ~1 us of launch gap between them inside a CUDA graph). Each pre-norm decoder layer runs
add+RMSNorm, then a projection, and the MLP also a SiLU gating kernel; this kernel does add + norm + projection (+
gating) in one launch, so a Llama layer runs 6 kernels instead of 9.

`add_norm_linear(h, delta, norm_weight, eps, weight, gated) -> (h_out, y)`:
  h, delta [M, K] (delta None: h is the residual stream), norm_weight [K], weight [N, K] (an nn.Linear's, no bias).
  h_out = h + delta (h itself when delta is None) and y = norm(h_out) @ weight.T [M, N]; gated (a fused gate/up
  weight, N = 2I, gate rows first): y = silu(gate) * up [M, I]. Every rounding of the PyTorch path is kept (the sum,
  the normalised row, its product with the norm weight and the projection's output are rounded to the input dtype
  where the modules round them), so results differ from `add_norm_linear_reference` only by the order of the
  float32 sums. Program n: BLOCK_N output columns (and their up rows when gated) of all M rows, each row read whole;
  every program recomputes the rows' sums of squares (K values per row, from L2), program 0 writes h_out. The
  products run either as one [BLOCK_M, BLOCK_N, BLOCK_K] broadcast or row by row (ROW_LOOP), per `_blocks`.
  Weights are loaded before the programmatic-launch wait (layers/pdl.py), so they stream in while the kernel before
  still runs.
For M < DOT_MIN_ROWS rows (decode, short verify and drafter steps) and K <= ONE_SHOT_K; steps of
DOT_MIN_ROWS..MAX_ROWS rows go to the tensor-core kernel of layers/norm_linear_dot_kernel.py (same contract) where its
tiles fit the device's shared memory, in bf16 / fp16 only (FLOAT32_DOT); float32 steps and float32 inputs over 1,024
wide come back here up to ROW_GRID_ROWS rows and go to the PyTorch path past them; longer steps and wider layers keep
cuBLAS.
Steps of 2..DOT_MIN_ROWS - 1 rows (and those fallbacks) launch one program per (column block, row) (ROW_GRID): each
runs the one-row row loop over its own row, so that a few-row step costs about what a one-row step costs per kernel
and computes each row as a one-row step does (a one-row chain's verify of up to 5 tokens gets the projections of
plain decoding, bit for bit). The row loop reads a row as two power-of-two chunks where that is narrower than one
block (`_k_chunks`: 576 = 512 + 64).
The kernel is built on first use, so that `TRITON_INTERPRET=1` (set by the CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .context import gather_rows
from .norm import rms_norm
from .block_size import pow2
from .pdl import launch_options

# rows (batch x tokens) up to which the fused kernels are used (engine.transforms wires them so): 1..4 rows here,
# DOT_MIN_ROWS..MAX_ROWS on tensor cores (layers/norm_linear_dot_kernel.py). Measured on the H200 (docs/benchmarks.md,
# "Session 14"): at 16, 32 and 64 rows the tensor-core kernel beat cuBLAS plus the separate norm and gating kernels by
# 14-27% in whole graphs; at 128 rows it lost by 7% (a K-pipelined version by 30-80%), so longer steps keep cuBLAS.
# At 5-8 rows it beat the row grid below (session 24, `benchmarks/few_rows_dot_check.py`, random SmolLM2 weights:
# 8-row decode graph 0.680 / 0.687 -> 0.651 ms, a one-row verify of 8 tokens 0.683 -> 0.647; MT-bench plain decoding
# at 8 rows +8%), while at 2-4 rows it lost (a one-row verify of 4 tokens 0.522 -> 0.587 ms): DOT_MIN_ROWS 9 -> 5.
# Session 65 (H100, docs/benchmarks.md): 5 rows are the row grid's again, DOT_MIN_ROWS 5 -> 6. A one-row verify of 5
# tokens took 0.548-0.551 ms on the row grid against 0.600-0.603 on tensor cores (6 / 7 tokens: 0.673-0.690 against
# 0.620-0.632, so 6+ rows stay on tensor cores), so the chain S4 K1 D5 ran MT-bench at 1 row at 3,912-3,915 tok/s
# (1.75x, tau 2.80, every answer plain decoding's: the row grid computes each row as a one-row step does) against
# 3,785 (1.69x, 19/80) and the chain of 3's 3,849-3,857 (1.72x); plain decoding at 5 rows +4.4% (7,754 against 7,425
# -7,432 tok/s, continuous batching), `auto` at 5 and 8 rows within -0.1% / -0.4%.
MAX_ROWS = 64
DOT_MIN_ROWS = 6
# float32 steps of DOT_MIN_ROWS..MAX_ROWS rows on the "tensor-core" kernel; False (the default): as float32 tiles too
# large for shared memory go (the row grid up to ROW_GRID_ROWS rows, PyTorch past it; `max_rows` keeps longer float32
# steps away from these kernels altogether). Its float32 products are IEEE (no TF32), which Triton runs as FMAs, not
# on tensor cores, and its float32 tiles spill: on the H200 a float32 one-row tree S6 K8 D48 (a 48-row verify, 8-row
# drafter steps) ran at 141 tok/s with it and float32 attention kernels (session 36; 851 in session 7). Session 37
# (`benchmarks/float32_tree_probe.sh`, MT-bench 1-10): off, 156 tok/s; off and float32 prompts on SDPA
# (short_attention_kernel.FLOAT32_MAX_QUERY_ROWS), 536 against 359 with SDPA alone; with `max_rows` and wider float32
# attention on SDPA too, 1,021 tok/s on all 80 (docs/benchmarks.md, "Session 37"). bf16 (the CUDA default) keeps
# the kernel; tests under Triton's interpreter set it to run the kernel in float32.
FLOAT32_DOT = False
ONE_SHOT_K = 2048  # widest input: a row is read in one block (wider layers keep cuBLAS: see _blocks)


def max_rows(dtype: torch.dtype) -> int:
    """The most rows a step of `dtype` should give these kernels: MAX_ROWS, but in float32 without FLOAT32_DOT the
    row grid's ROW_GRID_ROWS, so that longer float32 steps take the layers' own path (cuBLAS and the elementwise
    kernels) instead of this kernel's PyTorch fallback, which runs the norm as ~8 eager kernels and copies its
    results into the kernel's outputs: on the H200 that took a float32 48-token verify graph from 4.4 to 3.3 ms
    (session 37, `benchmarks/float32_step_trace.py`, random SmolLM2 weights)."""
    return ROW_GRID_ROWS if dtype == torch.float32 and not FLOAT32_DOT else MAX_ROWS


def add_norm_linear_reference(h: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor | None,
                              eps: float, weight: torch.Tensor, gated: bool,
                              norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The module path the kernels reproduce (norm False: no RMSNorm, norm_weight unused)."""
    if delta is not None:
        h = h + delta
    y = F.linear(rms_norm(h, norm_weight, eps) if norm else h, weight)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return h, y


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_norm_linear_kernel(h, d, nw, w, h_out, y, M, N, eps, K: tl.constexpr, HAS_D: tl.constexpr,
                               GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, NORM: tl.constexpr = True, PDL: tl.constexpr = False,
                               ROW_LOOP: tl.constexpr = False, BLOCK_K2: tl.constexpr = 0,
                               ROW_GRID: tl.constexpr = False, idx=None, R=1, T=1, INDEXED: tl.constexpr = False):
        if PDL:  # layers/pdl.py: the next kernel may start; only weights are read before the wait below
            tl.extra.cuda.gdc_launch_dependents()
        pid = tl.program_id(0)
        dt = h_out.dtype.element_ty
        rm = tl.arange(0, BLOCK_M)
        mm = rm < M
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = rn < N
        # the whole row in one block: the weight tile's loads are issued first, so that their latency overlaps the
        # norm's; one memory round trip per operand
        rk = tl.arange(0, BLOCK_K)
        km = rk < K
        wm = nm[:, None] & km[None, :]
        wt = tl.load(w + rn[:, None] * K + rk[None, :], mask=wm, other=0.0)  # [BLOCK_N, BLOCK_K]
        if GATED:
            wu = tl.load(w + (rn + N)[:, None] * K + rk[None, :], mask=wm, other=0.0)
        if NORM:
            nwv = tl.load(nw + rk, mask=km, other=0.0).to(tl.float32)
        if BLOCK_K2 > 0:  # row loop: the row's tail past BLOCK_K (K = 576: 512 + 64, not one 1024-wide block)
            rk2 = BLOCK_K + tl.arange(0, BLOCK_K2)
            km2 = rk2 < K
            wm2 = nm[:, None] & km2[None, :]
            wt2 = tl.load(w + rn[:, None] * K + rk2[None, :], mask=wm2, other=0.0)
            if GATED:
                wu2 = tl.load(w + (rn + N)[:, None] * K + rk2[None, :], mask=wm2, other=0.0)
            if NORM:
                nwv2 = tl.load(nw + rk2, mask=km2, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()
        if ROW_LOOP:  # row by row: 2-D products in the weight tile's own layout, no [M, N, K] broadcast
            for mi in tl.static_range(BLOCK_M):
                # ROW_GRID: program (n, j) owns rows j * BLOCK_M .. (j + 1) * BLOCK_M - 1, one after another
                m = tl.program_id(1) * BLOCK_M + mi if ROW_GRID else mi
                ok = km & (m < M)
                src = m  # the input row: INDEXED, row idx[m] of output row m's batch row (T input rows each)
                if INDEXED:
                    src = (m // R) * T + tl.load(idx + m, mask=m < M, other=0)
                xm = tl.load(h + src * K + rk, mask=ok, other=0.0)
                if HAS_D:
                    xm = (xm.to(tl.float32) + tl.load(d + src * K + rk, mask=ok, other=0.0).to(tl.float32)).to(dt)
                if HAS_D or INDEXED:  # INDEXED without a delta: the gathered rows are the residual stream
                    if pid == 0:
                        tl.store(h_out + m * K + rk, xm, mask=ok)
                xmf = xm.to(tl.float32)
                ss = tl.sum(xmf * xmf, axis=0)
                if BLOCK_K2 > 0:
                    ok2 = km2 & (m < M)
                    xm2 = tl.load(h + src * K + rk2, mask=ok2, other=0.0)
                    if HAS_D:
                        xm2 = (xm2.to(tl.float32) + tl.load(d + src * K + rk2, mask=ok2, other=0.0)
                               .to(tl.float32)).to(dt)
                    if HAS_D or INDEXED:
                        if pid == 0:
                            tl.store(h_out + m * K + rk2, xm2, mask=ok2)
                    xmf2 = xm2.to(tl.float32)
                    ss += tl.sum(xmf2 * xmf2, axis=0)
                if NORM:
                    r1 = 1.0 / tl.sqrt(ss / K + eps)
                    xmf = (xmf * r1).to(dt).to(tl.float32)
                    xmf = (xmf * nwv).to(dt).to(tl.float32)
                    if BLOCK_K2 > 0:
                        xmf2 = ((xmf2 * r1).to(dt).to(tl.float32) * nwv2).to(dt).to(tl.float32)
                o1 = tl.sum(wt.to(tl.float32) * xmf[None, :], axis=1)  # [BLOCK_N]
                if BLOCK_K2 > 0:
                    o1 += tl.sum(wt2.to(tl.float32) * xmf2[None, :], axis=1)
                o1 = o1.to(dt)
                if GATED:
                    u1 = tl.sum(wu.to(tl.float32) * xmf[None, :], axis=1)
                    if BLOCK_K2 > 0:
                        u1 += tl.sum(wu2.to(tl.float32) * xmf2[None, :], axis=1)
                    u1 = u1.to(dt).to(tl.float32)
                    g1 = o1.to(tl.float32)
                    o1 = ((g1 / (1.0 + tl.exp(-g1))).to(dt).to(tl.float32) * u1).to(dt)
                tl.store(y + m * N + rn, o1, mask=nm & (m < M))
        else:
            msk = mm[:, None] & km[None, :]
            src = rm  # the input rows (INDEXED: as in the row loop)
            if INDEXED:
                src = (rm // R) * T + tl.load(idx + rm, mask=mm, other=0)
            x = tl.load(h + src[:, None] * K + rk[None, :], mask=msk, other=0.0)
            if HAS_D:
                x = (x.to(tl.float32) + tl.load(d + src[:, None] * K + rk[None, :], mask=msk, other=0.0)
                     .to(tl.float32)).to(dt)
            if HAS_D or INDEXED:
                if pid == 0:
                    tl.store(h_out + rm[:, None] * K + rk[None, :], x, mask=msk)
            xf = x.to(tl.float32)
            if NORM:
                rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / K + eps)
                xn = (xf * rstd[:, None]).to(dt).to(tl.float32)
                xn = (xn * nwv[None, :]).to(dt).to(tl.float32)
            else:  # a plain projection of x
                xn = xf
            out = tl.sum(xn[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2).to(dt)  # [BLOCK_M, BLOCK_N]
            if GATED:
                up = tl.sum(xn[:, None, :] * wu.to(tl.float32)[None, :, :], axis=2).to(dt).to(tl.float32)
                gv = out.to(tl.float32)
                out = ((gv / (1.0 + tl.exp(-gv))).to(dt).to(tl.float32) * up).to(dt)
            tl.store(y + rm[:, None] * N + rn[None, :], out, mask=mm[:, None] & nm[None, :])

    return add_norm_linear_kernel


# (BLOCK_N, num_warps, row_loop) by row bucket (1, 2, 4), with programmatic dependent launch (layers/pdl.py). One
# row: the row loop (no cross-warp reduction), the best of session 12's cold per-call sweep, confirmed in whole decode
# steps (SmolLM2 graph 0.491 -> 0.455 ms). Four rows: chosen on whole verify steps of 4 tokens
# (benchmarks/verify_blocks_probe.py: 0.735 -> 0.677 ms), since the per-call sweep's winners at 2-8 rows made them
# slower (0.78 -> 0.98 ms; 8 rows through these kernels 1.21 ms against 1.01 with cuBLAS). Two rows: session 5-10's
# choices (docs/benchmarks.md, "Session 12"). Launches without PDL (GPUs before Hopper, EAGLESPEC_PDL=0) keep
# session 5-10's choices at every row count: without PDL the one-row row loop was slower (decode graph 0.635 -> 0.759 ms).
_NORM_CFG = {1: (4, 1, True), 2: (4, 2, False), 4: (2, 4, False)}  # add + norm + q/k/v
_GATED_CFG = {1: (4, 1, True), 2: (4, 1, False), 4: (2, 1, False)}  # add + norm + gate/up + SiLU
_PLAIN_CFG = {1: (4, 1, True), 2: (2, 1, False), 4: (2, 4, False)}  # o_proj, down_proj, the drafter's fc and q/k/v
_NO_PDL = {"norm": {1: (4, 1, False), 2: (4, 2, False), 4: (4, 2, False)},
           "gated": {1: (4, 1, False), 2: (4, 1, False), 4: (2, 1, False)},
           "plain": {1: (2, 1, False), 2: (2, 1, False), 4: (2, 1, False)}}


def _blocks(M: int, N: int, K: int, gated: bool, norm: bool = True, pdl: bool = True) -> tuple:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, row_loop) for M <= MAX_ROWS rows of width K <= ONE_SHOT_K: the row in
    one block (a first version looping over 128-wide blocks was latency-bound on the H200, 1.5-3x slower than cuBLAS),
    2-4 columns and 1-4 warps per program. Past 4 rows neither these products (session 12: row loop or broadcast,
    1-4 columns, 1-2 warps, with PDL), nor tensor cores (tl.dot, rows padded to 16: session 5 one-shot; session 10
    one-shot and K-pipelined, faster per call with the weights in L2 but 4-7% slower in whole verify steps), nor a
    row loop (session 9) beat cuBLAS plus the separate norm in whole steps; one program per row did (session 13:
    ROW_GRID_ROWS, which takes steps of 2-8 rows before these blocks are consulted), and so did session 14's
    tensor-core kernel, whose weight tiles load before the PDL wait, up to 64 rows (from DOT_MIN_ROWS rows on: at 6-8
    rows it beat the row grid too, sessions 24 and 65); for 4096-wide layers the blocked loop was 2x slower than
    cuBLAS, hence ONE_SHOT_K (docs/benchmarks.md, "Session 5", "Session 9", "Session 10", "Session 12")."""
    bucket = 1 if M <= 1 else 2 if M <= 2 else 4 if M <= 4 else 8
    if pdl:
        table = (_GATED_CFG if gated else _NORM_CFG) if norm else _PLAIN_CFG
    else:
        table = _NO_PDL[("gated" if gated else "norm") if norm else "plain"]
    bn, warps, loop = table[min(bucket, 4)]  # 5-8 rows (ROW_GRID_ROWS lowered below them): the 4-row blocks
    return bucket, bn, pow2(K), warps, loop


Blocks = tuple  # (BLOCK_M, BLOCK_N, BLOCK_K, num_warps[, row_loop[, row_grid]]): row_loop (default False) takes the
#                kernel's row-by-row path (2-D products) instead of one [BLOCK_M, BLOCK_N, BLOCK_K] broadcast; row_grid
#                one program per column block and group of BLOCK_M rows (the row loop over them; row_loop ignored)


SPLIT_K = True  # the row loop reads a row as two power-of-two chunks where that is narrower (`_k_chunks`)


def _k_chunks(K: int) -> tuple[int, int]:
    """(BLOCK_K, BLOCK_K2): one power-of-two block covering K, or, when narrower in all (and SPLIT_K), the largest
    power of two <= K and a second block for the rest: K = 576 (SmolLM2's width) as 512 + 64 instead of 1024 lanes of
    which 448 compute zeros, 1536 (its MLP) as 1024 + 512 instead of 2048. Used by the row loop only: on the H200
    (`benchmarks/split_k_check.py`, random SmolLM2 weights, session 13) it took the one-row decode graph from 0.444 to
    0.429 ms, while the broadcast product of 4-row verifies got slower with it (0.672 -> 0.736 ms)."""
    one = pow2(K)
    head = 1 << (K.bit_length() - 1)
    if not SPLIT_K or head == K:
        return one, 0
    tail = pow2(K - head)
    return (head, tail) if head + tail < one else (one, 0)


def _launch(h2: torch.Tensor, d2: torch.Tensor | None, nw: torch.Tensor | None, w: torch.Tensor, h_out: torch.Tensor,
            y: torch.Tensor, eps: float, gated: bool, norm: bool, blocks: Blocks | None = None,
            index: tuple[torch.Tensor, int, int] | None = None) -> None:
    """index (idx [M] int64, R, T): output row m reads input row (m // R) * T + idx[m] of h2 / d2 (the CUDA-core
    products only: fewer than DOT_MIN_ROWS rows, no explicit blocks)."""
    M, K = h2.shape if index is None else (index[0].shape[0], h2.shape[1])
    assert index is None or (blocks is None and M < DOT_MIN_ROWS), "norm_linear_kernel: indexed rows, few rows only"
    if blocks is None and M >= DOT_MIN_ROWS:  # tensor cores
        from . import norm_linear_dot_kernel as dot

        if (FLOAT32_DOT or h2.dtype != torch.float32) and dot.fits(K, gated, h2.element_size(),
                                                                   dot.shared_limit(h2.device)):
            return dot.launch(h2, d2, nw, w, h_out, y, eps, gated, norm)
        if M > ROW_GRID_ROWS:  # tiles over the device's shared memory (float32 inputs over 1,024 wide, e.g. a
            #                    drafter's fc; every float32 step without FLOAT32_DOT) past the row grid's reach:
            #                    PyTorch
            h, out = add_norm_linear_reference(h2, d2, nw, eps, w, gated, norm)
            if d2 is not None:
                h_out.copy_(h)
            y.copy_(out)
            return None
        # up to ROW_GRID_ROWS rows: the row grid below
    N = y.shape[1]
    opts = launch_options(h2)
    row_grid = bool(blocks[5]) if blocks is not None and len(blocks) > 5 else (
        blocks is None and 1 < M <= ROW_GRID_ROWS)
    if row_grid:  # one program per (column block, row group), each the one-row row loop over its rows
        bn, warps = _ROW_GRID_BLOCKS[(gated, norm)] if blocks is None else blocks[1:4:2]
        bm = 1 if blocks is None else blocks[0]  # rows per program
        bk, row_loop = pow2(K), True
    else:
        bm, bn, bk, warps, *rest = blocks or _blocks(M, N, K, gated, norm, opts["PDL"])
        assert M <= bm, "norm_linear_kernel: more rows than BLOCK_M"
        row_loop = bool(rest and rest[0])
    bk2 = 0
    if row_loop and bk >= K:  # the row in one block as `_blocks` sizes it: split where narrower
        bk, bk2 = _k_chunks(K)
    grid = ((N + bn - 1) // bn, (M + bm - 1) // bm if row_grid else 1)
    _kernel()[grid](h2, d2 if d2 is not None else h2, nw if norm else h2, w, h_out, y, M, N, eps,
                    K=K, HAS_D=d2 is not None, GATED=gated, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                    NORM=norm, ROW_LOOP=row_loop, BLOCK_K2=bk2, ROW_GRID=row_grid, num_warps=warps,
                    idx=index[0] if index is not None else h2, R=index[1] if index is not None else 1,
                    T=index[2] if index is not None else 1, INDEXED=index is not None, **opts)


# Steps of 2..ROW_GRID_ROWS rows that the tensor-core kernel does not take (2..DOT_MIN_ROWS - 1 rows, and wide float32
# inputs whose tiles do not fit in shared memory) take one program per (column block, row), each running the one-row
# row loop over its own row: the 4-row blocks (a broadcast product with cross-warp reductions) cost twice a one-row
# call per kernel, and cuBLAS plus a separate norm served 5-8 rows. On the H200 (benchmarks/row_grid_check.py, random
# SmolLM2 weights, session 13): verify of 4 tokens 0.673 -> 0.566 ms, of 8 tokens 0.916 -> 0.714 ms, an 8-row decode
# step 0.884 -> 0.703 ms; at 16 rows it lost to cuBLAS (decode 0.921 -> 1.001 ms: each row's program reads the weight
# tile again).
# Programs of several rows past 8 rows lost to cuBLAS by far (16-128 rows, 2-16 rows per program: an 8-row tree
# verify of 128 rows 1.09 -> 3.63 ms), so the policy keeps one row per program; explicit blocks may group rows.
# Rows grouped per program lost at 4 and 8 rows too (H100, session 64, random SmolLM2 weights, spec_phase_trace.py):
# a 4-token verify 0.527 ms -> 0.562 (2 rows a program), 0.773 (4), 1.189 (4, 8 columns), 0.943 (4, 8 columns, 2
# warps); an 8-token verify on the row grid instead of tensor cores 0.626 -> 0.960 (4 rows a program), 1.364 (8);
# 8 columns a program (one row) 0.527 -> 0.576.
ROW_GRID_ROWS = 8
# (BLOCK_N, warps) of a row-grid program, by (gated, norm): one row's choices
_ROW_GRID_BLOCKS = {(False, True): (4, 1), (True, True): (4, 1), (False, False): (4, 1)}


def linear_rows(x: torch.Tensor, weight: torch.Tensor, blocks: Blocks | None = None) -> torch.Tensor:
    """x [..., K] @ weight.T for K <= ONE_SHOT_K (the kernel without add and norm): a layer's o_proj and down_proj at
    batch 1, where cuBLAS spends 3-5 us on 0.7-2 MB of weights. Any number of rows computes (the engine wires it for
    up to MAX_ROWS); `blocks` overrides `_blocks` (the GPU benchmarks' sweeps; with it, up to its BLOCK_M rows)."""
    *lead, K = x.shape
    M = x.numel() // K
    N = weight.shape[0]
    assert K <= ONE_SHOT_K and weight.shape[1] == K \
        and weight.is_contiguous(), "linear_rows: shape"
    x2 = x.reshape(M, K).contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    _launch(x2, None, None, weight, x2, y, 0.0, False, False, blocks)
    return y.view(*lead, N)


def embed_norm_linear(table: torch.Tensor, ids: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A first layer's input from the embedding table: ids [B, T] -> (h = table[ids] [B, T, K], norm(h) @ weight.T
    [B, T, N]), `add_norm_linear(F.embedding(ids, table), None, ...)`'s values. Steps of fewer than DOT_MIN_ROWS rows
    read their rows of the table in the kernel (program 0 writes h), which saves the embedding's own (PyTorch)
    kernel; longer steps gather first."""
    B, T = ids.shape
    V, K = table.shape
    if B * T >= DOT_MIN_ROWS:
        return add_norm_linear(F.embedding(ids, table), None, norm_weight, eps, weight, False)
    assert K <= ONE_SHOT_K and weight.shape[1] == K and weight.is_contiguous() and table.is_contiguous(), \
        "embed_norm_linear: shape"
    N = weight.shape[0]
    h_out = torch.empty(B, T, K, dtype=table.dtype, device=table.device)
    y = torch.empty(B, T, N, dtype=table.dtype, device=table.device)
    # input row of output row m: (m // 1) * 0 + ids[m], the table's row
    _launch(table, None, norm_weight, weight, h_out.view(B * T, K), y.view(B * T, N), eps, False, True, None,
            (ids.reshape(-1).contiguous(), 1, 0))
    return h_out, y


def add_norm_linear(h: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                    weight: torch.Tensor, gated: bool, blocks: Blocks | None = None,
                    index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`index` [B, R] (h, delta [B, T, K]): the rows at those positions only, h_out [B, R, K] and y [B, R, N], as
    if both were gathered first (`context.gather_rows`); the CUDA-core kernel reads them in place (under
    DOT_MIN_ROWS rows, with a delta: a drafter catch-up's last real pair, whose add and gathers it saves), other steps
    gather first."""
    if index is not None:
        B, T, K = h.shape
        R = index.shape[1]
        if B * R >= DOT_MIN_ROWS or blocks is not None or delta is None:
            return add_norm_linear(gather_rows(h, index), None if delta is None else gather_rows(delta, index),
                                   norm_weight, eps, weight, gated, blocks)
        assert K <= ONE_SHOT_K and weight.shape[1] == K and weight.is_contiguous(), "add_norm_linear: shape"
        N = weight.shape[0] // 2 if gated else weight.shape[0]
        h_out = torch.empty(B, R, K, dtype=h.dtype, device=h.device)
        y = torch.empty(B, R, N, dtype=h.dtype, device=h.device)
        _launch(h.reshape(B * T, K).contiguous(), delta.reshape(B * T, K).contiguous(), norm_weight, weight,
                h_out.view(B * R, K), y.view(B * R, N), eps, gated, True, None, (index.reshape(-1).contiguous(), R, T))
        return h_out, y
    *lead, K = h.shape
    M = h.numel() // K
    N = weight.shape[0] // 2 if gated else weight.shape[0]
    assert K <= ONE_SHOT_K and weight.shape[1] == K \
        and weight.is_contiguous(), "add_norm_linear: shape"
    h2 = h.reshape(M, K).contiguous()
    d2 = delta.reshape(M, K).contiguous() if delta is not None else None
    h_out = torch.empty_like(h2) if delta is not None else h2
    y = torch.empty(M, N, dtype=h.dtype, device=h.device)
    _launch(h2, d2, norm_weight, weight, h_out, y, eps, gated, True, blocks)
    return h_out.view(*lead, K), y.view(*lead, N)
