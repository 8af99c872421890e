"""Small kernels against the PyTorch calls they replace, on the GPU (session 10's decode profile found them):

1. argmax: layers/argmax_kernel.py (two stages over CHUNK-entry chunks) against torch.argmax, for the rows greedy
   decoding reduces (Llama-8B's 128,256-entry vocabulary, SmolLM2's 49,152 at 1-32 rows, a 12,288-entry draft
   vocabulary), bf16 logits; the ids must be equal; CHUNK swept.
2. linear_rows: layers/norm_linear_kernel.linear_rows (the few-row kernel without add and norm) against F.linear
   (cuBLAS) for SmolLM2's o_proj (576 -> 576) and down_proj (1536 -> 576) at 1, 2, 4 and 8 rows, the weights cold
   (copies in turn: what a step meets): the default blocks and a sweep of (BLOCK_N, warps, row loop), with the
   largest difference in bf16 rounding steps of each. Per-call winners have lost in whole steps twice (a tensor-core
   variant in session 10, the 2-8-row winners in session 12: docs/benchmarks.md); choose blocks on whole steps
   (benchmarks/verify_blocks_probe.py).
3. topk: layers/topk_kernel.logsoftmax_topk (a tree's per-level draft selection) for K rows of a 12,288-entry draft
   vocabulary: the one-program-per-row kernel (session 9) against the two-kernel path (session 11; CHUNK swept) and
   PyTorch's log-softmax + topk; the ids must equal the one-program kernel's (and PyTorch's, but for the order of
   tied values, which bf16 rows of thousands of entries have and torch's topk orders freely).
4. norm_linear: layers/norm_linear_kernel.add_norm_linear (residual add + RMSNorm + projection, + SiLU gating) for
   SmolLM2's q/k/v (576 -> 960) and gate/up (576 -> 2 x 1536) at 1, 2, 4 and 8 rows, the weights cold, over the same
   sweep, against the eager PyTorch path.
5. gemv: layers/gemv_kernel.gemv_rows against F.linear (cuBLAS) for one row of Llama-3.1-8B's q/k/v, o_proj and
   down_proj, the weights cold (copies in turn), over a sweep of (BLOCK_N, BLOCK_K, warps, stages); GB/s of each.

Times: per call in a CUDA graph of 50 calls (eaglespec.bench.graph_timing), the engine's view.
(A section swept a tensor-core variant for 5-16 rows; commit 951beed has it. Whole verify steps measured that
variant slower, so it was removed: docs/benchmarks.md, "Session 10".)

usage: python benchmarks/small_kernels_check.py OUT_DIR [--cpu] [--only=argmax|linear|topk|norm_linear|gemv]
       (--cpu: interpreter, tiny sweep: a script check)
"""

from __future__ import annotations


import sys

from probe_script import CPU, DEV, DT, Emitter, per_call_us  # noqa: E402  (sets the interpreter for --cpu)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from eaglespec.layers import argmax_kernel as amk  # noqa: E402
from eaglespec.layers import gemv_kernel as gvk  # noqa: E402
from eaglespec.layers import norm_linear_kernel as nlk  # noqa: E402
from eaglespec.layers import topk_kernel as tkk  # noqa: E402

emit = Emitter("small_kernels.json")
ONLY = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")), None)


def wanted(section: str) -> bool:
    return ONLY is None or ONLY == section


g = torch.Generator(device=DEV).manual_seed(0)
shapes = [(1, 128256), (1, 49152), (4, 49152), (8, 49152), (32, 49152), (1, 12288), (4, 12288)]
shapes = ([(2, 5000)] if CPU else shapes) if wanted("argmax") else []
for R, V in shapes:
    x = (3 * torch.randn(R, V, generator=g, device=DEV)).to(DT)
    ref = x.argmax(-1)
    row = {"argmax": f"{R}x{V}", "torch_us": round(per_call_us(lambda: x.argmax(-1)), 2)}
    default = amk.CHUNK
    for chunk in (1024, 2048, 4096, 8192) if not CPU else (1024,):
        amk.CHUNK = chunk
        row[f"equal_{chunk}"] = bool(torch.equal(amk.argmax_rows(x), ref))
        row[f"chunk_{chunk}_us"] = round(per_call_us(lambda: amk.argmax_rows(x)), 2)
    amk.CHUNK = default
    emit(row)


def cold_us(call, w: torch.Tensor) -> float:
    """Time per call of call(weight) with copies of w taken in turn (> 256 MB in all on the GPU, so that L2 holds
    none of them), as a decode step meets its weights; the plain per-call times above reread one weight from L2."""
    copies = [w.clone() for _ in range(max(2, (256 << 20) // (w.numel() * w.element_size()) if not CPU else 2))]
    turn = [0]

    def one():
        turn[0] += 1
        return call(copies[turn[0] % len(copies)])

    return per_call_us(one)


def sweep(M: int, N: int, K: int) -> list[tuple[int, int]]:
    """(BLOCK_N, warps) pairs of the few-row sweeps: the one-row default only at M = 1 (tuned in session 10)."""
    if CPU:
        return [(4, 1)]
    if M == 1:
        return [nlk._blocks(1, N, K, False)[1::2]]
    return [(bn, warps) for bn in (1, 2, 4) for warps in (1, 2)]


linears = [("o_proj", 576, 576), ("down_proj", 1536, 576)] if not CPU else [("tiny", 96, 40)]
for name, K, N in linears if wanted("linear") else []:
    w = (torch.randn(N, K, generator=g, device=DEV) / K ** 0.5).to(DT)
    for M in (1, 2, 4, 8):
        x = torch.randn(M, K, generator=g, device=DEV).to(DT)
        ref = F.linear(x, w)
        ulp = ref.float().abs().clamp_min(ref.float().abs().mean().item()) * 2 ** -7
        bk = 1 << (K - 1).bit_length()
        row = {"linear": name, "M": M, "K": K, "N": N, "cublas_cold_us": round(cold_us(lambda ww: F.linear(x, ww), w), 2)}
        if M <= nlk.MAX_ROWS:
            row["default_blocks"] = list(nlk._blocks(M, N, K, False, False))
            row["kernel_default_cold_us"] = round(cold_us(lambda ww: nlk.linear_rows(x, ww), w), 2)
        results = []
        for bn, warps in sweep(M, N, K):
            for loop in (False, True):
                blocks = (max(M, 1), bn, bk, warps, loop)
                try:
                    y = nlk.linear_rows(x, w, blocks)
                    diff = ((y.float() - ref.float()).abs() / ulp).max().item()
                    results.append((cold_us(lambda ww: nlk.linear_rows(x, ww, blocks), w), [bn, warps, loop],
                                    round(diff, 2)))
                except Exception as e:  # noqa: BLE001  (a block Triton cannot build: skipped)
                    print(f"  skip {blocks}: {type(e).__name__}", flush=True)
        results.sort(key=lambda r: r[0])
        row["sweep_cold_us"] = [[round(t, 2), c, dd] for t, c, dd in results[:5]]
        emit(row)


for R, V, k in ([(1, 12288, 4), (4, 12288, 4), (32, 12288, 4), (4, 12288, 8), (4, 49152, 4)] if not CPU else
                [(4, 3000, 4)]) if wanted("topk") else []:
    x = (3 * torch.randn(R, V, generator=g, device=DEV)).to(DT)
    ref_logp, ref_ids = torch.log_softmax(x.float(), dim=-1).topk(k, dim=-1)
    row = {"topk": f"{R}x{V} k={k}",
           "torch_us": round(per_call_us(lambda: torch.log_softmax(x.float(), -1).topk(k)), 2)}
    split, chunk = tkk.SPLIT, tkk.CHUNK
    tkk.SPLIT = 1 << 30  # the one-program-per-row kernel
    one_ids, logp = tkk.logsoftmax_topk(x, k)
    row["one_program_equal"] = bool(torch.equal(one_ids, ref_ids))  # bf16 ties: torch's topk orders them freely
    row["one_program_us"] = round(per_call_us(lambda: tkk.logsoftmax_topk(x, k)), 2)
    tkk.SPLIT = split
    for c in (512, 1024, 2048) if not CPU else (1024,):
        tkk.CHUNK = c
        ids, logp = tkk.logsoftmax_topk(x, k)
        row[f"chunk_{c}_equal"] = bool(torch.equal(ids, ref_ids))
        row[f"chunk_{c}_equal_one_program"] = bool(torch.equal(ids, one_ids))  # ties to the smaller index in both
        row[f"chunk_{c}_max_logp_diff"] = float((logp - ref_logp).abs().max())
        row[f"chunk_{c}_us"] = round(per_call_us(lambda: tkk.logsoftmax_topk(x, k)), 2)
    tkk.CHUNK = chunk
    emit(row)



norm_shapes = [("qkv", 576, 960, False), ("gate_up", 576, 1536, True)] if not CPU else [("tiny", 96, 40, True)]
for name, K, N, gated in norm_shapes if wanted("norm_linear") else []:
    w = (torch.randn(2 * N if gated else N, K, generator=g, device=DEV) / K ** 0.5).to(DT)
    nw = (1 + 0.1 * torch.randn(K, generator=g, device=DEV)).to(DT)
    for M in (1, 2, 4, 8):
        h = torch.randn(M, K, generator=g, device=DEV).to(DT)
        d = torch.randn(M, K, generator=g, device=DEV).to(DT)
        ref = nlk.add_norm_linear_reference(h, d, nw, 1e-5, w, gated)[1]
        ulp = ref.float().abs().clamp_min(ref.float().abs().mean().item()) * 2 ** -7
        bk = 1 << (K - 1).bit_length()
        row = {"norm_linear": name, "M": M,
               "torch_cold_us": round(cold_us(lambda ww: nlk.add_norm_linear_reference(h, d, nw, 1e-5, ww, gated), w), 2)}
        if M <= nlk.MAX_ROWS:
            default = nlk._blocks(M, N, K, gated)
            row["default_blocks"] = list(default)
            row["default_cold_us"] = round(cold_us(lambda ww: nlk.add_norm_linear(h, d, nw, 1e-5, ww, gated), w), 2)
        results = []
        for bn, warps in sweep(M, N, K):
            for loop in (False, True):
                blocks = (M, bn, bk, warps, loop)
                try:
                    y = nlk.add_norm_linear(h, d, nw, 1e-5, w, gated, blocks)[1]
                    diff = ((y.float() - ref.float()).abs() / ulp).max().item()
                    results.append((cold_us(lambda ww: nlk.add_norm_linear(h, d, nw, 1e-5, ww, gated, blocks), w),
                                    [bn, warps, loop], round(diff, 2)))
                except Exception as e:  # noqa: BLE001  (a block Triton cannot build: skipped)
                    print(f"  skip {blocks}: {type(e).__name__}", flush=True)
        results.sort(key=lambda r: r[0])
        row["sweep_cold_us"] = [[round(t, 2), c, dd] for t, c, dd in results[:5]]
        emit(row)


gemv_shapes = [("8b qkv", 4096, 6144), ("8b o_proj", 4096, 4096), ("8b down", 14336, 4096)] if not CPU else \
    [("tiny", 300, 40)]
gemv_cfgs = [(bn, bk, w, st) for bn in (2, 4, 8) for bk in (512, 1024, 2048) for w in (2, 4) for st in (3, 4)]
gemv_cfgs = gemv_cfgs if not CPU else [(16, 128, 4, 2)]
for name, K, N in gemv_shapes if wanted("gemv") else []:
    w = (torch.randn(N, K, generator=g, device=DEV) / K ** 0.5).to(DT)
    x = torch.randn(1, K, generator=g, device=DEV).to(DT)
    ref = F.linear(x, w)
    ulp = ref.float().abs().clamp_min(ref.float().abs().mean().item()) * 2 ** -7
    nbytes = w.numel() * w.element_size()
    t_cublas = cold_us(lambda ww: F.linear(x, ww), w)
    row = {"gemv": name, "K": K, "N": N, "MB": round(nbytes / 1e6, 1), "cublas_cold_us": round(t_cublas, 2),
           "cublas_GBps": round(nbytes / t_cublas / 1e3, 1),
           "max_diff_bf16_steps": round(((gvk.gemv_rows(x, w).float() - ref.float()).abs() / ulp).max().item(), 2)}
    results = []
    for cfg in gemv_cfgs:
        try:
            results.append((cold_us(lambda ww: gvk.gemv_rows(x, ww, cfg), w), cfg))
        except Exception as e:  # noqa: BLE001  (a configuration Triton cannot build: skipped)
            print(f"  skip {cfg}: {type(e).__name__}", flush=True)
    results.sort(key=lambda r: r[0])
    if results:
        row.update({"kernel_best_us": round(results[0][0], 2), "kernel_best_cfg": list(results[0][1]),
                    "kernel_best_GBps": round(nbytes / results[0][0] / 1e3, 1),
                    "next_best": [[round(t, 2), list(c)] for t, c in results[1:4]]})
    emit(row)
