"""Can a plain Triton GEMM beat cuBLAS on SmolLM2's projections at 64-256 rows?

Steps of more than 64 rows (the 32-row tree's 256-row verify, prefills of 65-512 tokens) run their projections as
cuBLAS GEMMs: 4 per layer, ~4-6 us each, ~60% of a 32-row S5 K2 D8 verify (docs/benchmarks.md, sessions 17-18). Their
work is tiny (a 256 x 960 x 576 product is 0.3 GFLOP, 1.1 MB of weights), so the time is each kernel's fixed cost.
Sessions 14 and 17 found our norm-fused tensor-core kernels slower than cuBLAS there (one-shot tiles, and a K loop
with the norm's sums recomputed); this probe asks the plain question first: C [M, N] = A [M, K] @ W [N, K]^T in bf16,
a K loop pipelined by Triton, with pointer loads (`ptr`) or Hopper's tensor-memory descriptors (`tma`), with and
without programmatic dependent launch, against `torch.nn.functional.linear`. Each timing is one call in a CUDA graph
that reads distinct weight matrices totalling COLD_BYTES (256 MB, 5x the L2), so that every call reads its weights
from HBM as a model's layers do; `--hot`: a graph of 30 calls over 30 weights (20-100 MB), which the L2 keeps across
replays. Every variant is checked against the float32 product first.

Session 29 (H200): hot, o_proj through `ptr+pdl` took 2.3-2.4 us against cuBLAS's 3.1-3.2 at 64-256 rows; cold, 3.2-3.3
against 3.7-3.8 (64x64 blocks; 64x32 3.9-4.0); the other projections were no faster than cuBLAS or slower. The kernel
built on it for o_proj on the folded path (1855713) made whole graphs slower, not faster (the 32-row S5 K2 D8 verify
1.081 -> 1.189 ms) and was reverted: a GEMM timed alone, back to back with itself, is not a GEMM in a layer.

usage: python benchmarks/triton_gemm_check.py OUT [--rows=64,128,256] [--configs=BMxBNxBKxSxW,...] [--hot] [--cpu]
"""

from __future__ import annotations

import itertools
import sys

from probe_script import CPU, DEV, DT, Emitter, option, per_call_us  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SHAPES = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}  # (N, K)
COLD_BYTES = 256 << 20  # weights per timing by default: 5x the H200's L2
DEFAULT_CONFIGS = ("64x64x64x3x4,64x32x64x3x4,64x128x64x3x4,128x64x64x3x4,128x128x64x3x8,64x64x128x2x4,"
                   "32x64x64x3x4,64x64x64x4x4,64x32x128x3x4,128x32x64x3x4")


@triton.jit
def gemm_ptr(a, w, c, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             PDL: tl.constexpr):
    pid = tl.program_id(0)
    nb = tl.cdiv(N, BN)
    pm, pn = pid // nb, pid % nb
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rl = tl.minimum(rm, M - 1)  # rows past M read row M - 1 (never stored): no row mask on the loads
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        at = tl.load(a + rl[:, None] * K + (k + rk)[None, :])
        wt = tl.load(w + rn[:, None] * K + (k + rk)[None, :])
        acc = tl.dot(at, tl.trans(wt), acc)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(c.dtype.element_ty), mask=rm[:, None] < M)


@triton.jit
def gemm_tma(a_desc, w_desc, c_desc, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    nb = tl.cdiv(N, BN)
    pm, pn = pid // nb, pid % nb
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        at = a_desc.load([pm * BM, k])
        wt = w_desc.load([pn * BN, k])
        acc = tl.dot(at, wt.T, acc)
    c_desc.store([pm * BM, pn * BN], acc.to(c_desc.dtype))


def parse(cfg: str) -> tuple[int, ...]:
    return tuple(int(x) for x in cfg.split("x"))


def main() -> None:
    emit = Emitter("triton_gemm_check.json")
    rows = [int(r) for r in option("rows", "16,32" if CPU else "64,128,256").split(",")]
    configs = [parse(c) for c in option("configs", "16x16x16x1x4" if CPU else DEFAULT_CONFIGS).split(",")]
    shapes = {"tiny": (32, 64)} if CPU else SHAPES
    cold = "--hot" not in sys.argv
    if not CPU:
        from triton.tools.tensor_descriptor import TensorDescriptor

        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=DEV))
    summary: dict[tuple, dict] = {}
    for (name, (N, K)), M in itertools.product(shapes.items(), rows):
        g = torch.Generator(device=DEV).manual_seed(N + K + M)
        # --hot: 30 weights (20-100 MB: they stay in the H200's 50 MB L2 across replays, which flatters a kernel);
        # by default as many as make COLD_BYTES, all in one graph, so that every call reads its weight from HBM
        nw = 2 if CPU else 30 if not cold else -(-COLD_BYTES // (N * K * 2))
        ws = [torch.randn(N, K, device=DEV, dtype=DT, generator=g) * 0.05 for _ in range(nw)]
        a = torch.randn(M, K, device=DEV, dtype=DT, generator=g)
        c = torch.empty(M, N, device=DEV, dtype=DT)
        ref = a.float() @ ws[0].float().T
        tol = 1e-3 if CPU else 0.05
        it = itertools.cycle(ws)
        base = per_call_us(lambda: torch.nn.functional.linear(a, next(it)), len(ws))
        row = {"shape": name, "M": M, "N": N, "K": K, "cublas_us": round(base, 2)}
        best = ("cublas", base)
        for (BM, BN, BK, S, W), kind, pdl in itertools.product(configs, ("ptr",) if CPU else ("ptr", "tma"),
                                                               (False,) if CPU else (False, True)):
            if K % BK or N % BN:
                continue
            grid = (triton.cdiv(M, BM) * (N // BN),)
            opts = {"num_stages": S, "num_warps": W}
            if pdl:
                opts["launch_pdl"] = True
            if kind == "ptr":
                def call(w, _o=opts, _g=grid, _b=(BM, BN, BK), _p=pdl):
                    gemm_ptr[_g](a, w, c, M, N, K, *_b, PDL=_p, **_o)
            else:
                ad = TensorDescriptor.from_tensor(a, [BM, BK])
                cd = TensorDescriptor.from_tensor(c, [BM, BN])
                wds = {id(w): TensorDescriptor.from_tensor(w, [BN, BK]) for w in ws}

                def call(w, _o=opts, _g=grid, _b=(BM, BN, BK), _p=pdl, _a=ad, _c=cd, _w=wds):
                    gemm_tma[_g](_a, _w[id(w)], _c, M, N, K, *_b, PDL=_p, **_o)
            key = f"{kind}{'+pdl' if pdl else ''} {BM}x{BN}x{BK}x{S}x{W}"
            try:
                call(ws[0])
                err = (c.float() - ref).abs().max().item()
                if err > tol:
                    row[key] = f"wrong ({err:.3g})"
                    continue
                it2 = itertools.cycle(ws)
                us = per_call_us(lambda: call(next(it2)), len(ws))
            except Exception as e:  # out of shared memory, an unsupported layout: report and go on
                row[key] = f"{type(e).__name__}: {str(e)[:80]}"
                continue
            row[key] = round(us, 2)
            if us < best[1]:
                best = (key, us)
        row["best"] = best[0]
        row["best_us"] = round(best[1], 2)
        emit(row)
        summary[(name, M)] = {"cublas": base, "best": best}
    print("\nshape      M  cuBLAS us  best Triton (us)")
    for (name, M), s in summary.items():
        print(f"{name:8s} {M:4d} {s['cublas']:9.2f}  {s['best'][0]} ({s['best'][1]:.2f})")


if __name__ == "__main__":
    main()
