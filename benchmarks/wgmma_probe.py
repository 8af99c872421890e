"""Would the tensor-core projection of a few rows be cheaper transposed, y^T = W x^T, with the weight as the MMA's
first operand? Then a program's BLOCK_N weight rows are the MMA's M dimension: at 64 of them (one warpgroup) Triton
emits Hopper's asynchronous wgmma (HGMMA, operands read from shared memory, accumulation pipelined in the tensor
core) instead of mma.sync (HMMA, one dependent chain of K / 16 per warp, operands through ldmatrix), and the rows
(8 of a verify of 8, padded to 16) are its N dimension. Session 34's CHAIN_K probe found independent HMMA chains
slower, so the chain alone is not the cost; this measures the other form.

A probe kernel (plain projection, no add or norm: o_proj and down_proj; the weight tile loaded before the
programmatic-launch wait as in the engine's kernel; the row as two power-of-two chunks, 576 = 512 + 64) against the
engine's `linear_rows` (layers/norm_linear_dot_kernel.py at 5-64 rows). Timing: a CUDA graph of 30 calls, each on its
own copy of the weight (30 emulated layers, so the weights do not all sit in L2), us per call; BLOCK_N x warps of
the probe: 64x4 (wgmma), 128x4 and 128x8 (wgmma), 32x4 (mma.sync, transposed). Outputs are checked against F.linear.

usage: python benchmarks/wgmma_probe.py OUT_DIR [--cpu]
"""

from __future__ import annotations

from probe_script import CPU, DEV, DT, Emitter, per_call_us  # noqa: E402

import itertools  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from eaglespec.layers.block_size import pow2  # noqa: E402
from eaglespec.layers.norm_linear_kernel import _k_chunks, linear_rows  # noqa: E402
from eaglespec.layers.pdl import launch_options  # noqa: E402


@triton.jit
def transposed_kernel(x, w, y, M, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                      BK1: tl.constexpr, BK2: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < N
    rk1 = tl.arange(0, BK1)
    w1 = tl.load(w + rn[:, None] * K + rk1[None, :], mask=nm[:, None] & (rk1 < K)[None, :], other=0.0)  # [BN, BK1]
    if BK2 > 0:
        rk2 = BK1 + tl.arange(0, BK2)
        w2 = tl.load(w + rn[:, None] * K + rk2[None, :], mask=nm[:, None] & (rk2 < K)[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    rm = tl.arange(0, BLOCK_R)
    rl = tl.minimum(rm, M - 1)
    x1 = tl.load(x + rl[None, :] * K + rk1[:, None], mask=(rk1 < K)[:, None], other=0.0)  # [BK1, BLOCK_R]
    if IEEE:
        acc = tl.dot(w1.to(tl.float32), x1.to(tl.float32), input_precision="ieee")
    else:
        acc = tl.dot(w1, x1)
    if BK2 > 0:
        x2 = tl.load(x + rl[None, :] * K + rk2[:, None], mask=(rk2 < K)[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(w2.to(tl.float32), x2.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w2, x2, acc)
    tl.store(y + rm[None, :] * N + rn[:, None], acc.to(y.dtype.element_ty), mask=nm[:, None] & (rm < M)[None, :])


def transposed(x: torch.Tensor, w: torch.Tensor, bn: int, warps: int) -> torch.Tensor:
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    bk1, bk2 = _k_chunks(K)
    transposed_kernel[(triton.cdiv(N, bn),)](x, w, y, M, N, K=K, BLOCK_N=bn, BLOCK_R=pow2(M, 16), BK1=max(bk1, 16),
                                             BK2=max(bk2, 16) if bk2 else 0, IEEE=x.dtype == torch.float32 or CPU,
                                             num_warps=warps, **launch_options(x))
    return y


def cycling(fn_of_layer):
    """fn_of_layer(i) as a call without arguments taking the next of the LAYERS weight copies each time, so that
    per_call_us's graph of LAYERS calls reads every copy once."""
    it = itertools.cycle(range(LAYERS))
    return lambda: fn_of_layer(next(it))


emit = Emitter("wgmma_probe.json")
H, FF, LAYERS = (576, 1536, 30) if not CPU else (80, 96, 2)
g = torch.Generator().manual_seed(0)
variants = [("engine", None), ("T64x4", (64, 4)), ("T128x4", (128, 4)), ("T128x8", (128, 8)), ("T32x4", (32, 4))]
for rnd in range(2):
    for name, (K, N) in {"o_proj": (H, H), "down": (FF, H)}.items():
        ws = [(torch.randn(N, K, generator=g) / K ** 0.5).to(DEV, DT) for _ in range(LAYERS)]
        for M in (8, 16, 64):
            x = torch.randn(M, K, generator=g).to(DEV, DT)
            row = {"round": rnd, "projection": name, "M": M}
            ref = F.linear(x.float(), ws[0].float())
            for vname, cfg in variants:
                if cfg is None:
                    fn = lambda i: linear_rows(x, ws[i])  # noqa: E731
                else:
                    fn = lambda i, cfg=cfg: transposed(x, ws[i], *cfg)  # noqa: E731
                try:
                    out = fn(0).float()
                except triton.runtime.errors.OutOfResources:  # the tiles over the block's shared memory
                    continue
                row[f"{vname}_err"] = round(float((out - ref).abs().max() / ref.abs().max()), 4)
                row[f"{vname}_us"] = round(per_call_us(cycling(fn), LAYERS), 3)
            emit(row)
