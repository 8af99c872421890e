"""Two small kernels against the PyTorch calls they replace, on the GPU (session 10's decode profile found them):

1. argmax: layers/argmax_kernel.py (two stages over CHUNK-entry chunks) against torch.argmax, for the rows greedy
   decoding reduces (Llama-8B's 128,256-entry vocabulary, SmolLM2's 49,152 at 1-32 rows, a 12,288-entry draft
   vocabulary), bf16 logits; the ids must be equal; CHUNK swept.
2. linear_rows: layers/norm_linear_kernel.linear_rows (the few-row kernel without add and norm) against F.linear
   (cuBLAS) for SmolLM2's o_proj (576 -> 576), down_proj (1536 -> 576) and its drafter's fc (1728 -> 576) at 1, 2 and
   4 rows: largest difference in bf16 rounding steps, time of the default blocks and of a (BLOCK_N, warps) sweep.

Times: per call in a CUDA graph of 50 calls (eaglespec.bench.graph_timing), the engine's view.
3. the tensor-core kernel for 5-16 rows against the path it would replace, (BLOCK_N, BLOCK_K, warps, stages) swept.

usage: python benchmarks/small_kernels_check.py OUT_DIR [--cpu] [--mma]
       (--cpu: interpreter, tiny sweep: a script check; --mma: section 3 only)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CPU = "--cpu" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from eaglespec.bench.graph_timing import per_call_us  # noqa: E402
from eaglespec.layers import argmax_kernel as amk  # noqa: E402
from eaglespec.layers import norm_linear_kernel as nlk  # noqa: E402

OUT = Path([a for a in sys.argv[1:] if not a.startswith("--")][0])
OUT.mkdir(parents=True, exist_ok=True)
DEV = torch.device("cpu" if CPU else "cuda")
DT = torch.float32 if CPU else torch.bfloat16
rows: list[dict] = []


def emit(row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)
    (OUT / "small_kernels.json").write_text(json.dumps(rows, indent=1))


g = torch.Generator(device=DEV).manual_seed(0)
MMA_ONLY = "--mma" in sys.argv
shapes = [] if MMA_ONLY else [(1, 128256), (1, 49152), (4, 49152), (8, 49152), (32, 49152), (1, 12288), (4, 12288)] if not CPU else [(2, 5000)]
for R, V in shapes:
    x = (3 * torch.randn(R, V, generator=g, device=DEV)).to(DT)
    ref = x.argmax(-1)
    row = {"argmax": f"{R}x{V}", "torch_us": round(per_call_us(lambda: x.argmax(-1), 50, DEV), 2)}
    default = amk.CHUNK
    for chunk in (1024, 2048, 4096, 8192) if not CPU else (1024,):
        amk.CHUNK = chunk
        row[f"equal_{chunk}"] = bool(torch.equal(amk.argmax_rows(x), ref))
        row[f"chunk_{chunk}_us"] = round(per_call_us(lambda: amk.argmax_rows(x), 50, DEV), 2)
    amk.CHUNK = default
    emit(row)


def launch(x, w, bn, warps):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    bm = nlk._blocks(M, N, K, False)[0]
    nlk._kernel()[((N + bn - 1) // bn,)](x, x, x, w, x, y, M, N, 0.0, K=K, HAS_D=False, GATED=False, BLOCK_M=bm,
                                         BLOCK_N=bn, BLOCK_K=1 << (K - 1).bit_length(), NORM=False, num_warps=warps)
    return y


for name, K, N in [] if MMA_ONLY else [("o_proj", 576, 576), ("down_proj", 1536, 576), ("drafter fc", 1728, 576)] \
        if not CPU else [("tiny", 96, 40)]:
    w = (torch.randn(N, K, generator=g, device=DEV) / K ** 0.5).to(DT)
    for M in (1, 2, 4):
        x = torch.randn(M, K, generator=g, device=DEV).to(DT)
        ref = F.linear(x, w)
        y = nlk.linear_rows(x, w)
        ulp = ref.float().abs().clamp_min(ref.float().abs().mean().item()) * 2 ** -7
        best = (float("inf"), None)
        for bn in (1, 2, 4, 8, 16) if not CPU else (4,):
            for warps in (1, 2, 4) if not CPU else (1,):
                try:
                    t = per_call_us(lambda: launch(x, w, bn, warps), 50, DEV)
                except Exception as e:  # noqa: BLE001  (a block Triton cannot build: skipped)
                    print(f"  skip {bn},{warps}: {type(e).__name__}", flush=True)
                    continue
                best = min(best, (t, (bn, warps)), key=lambda b: b[0])
        emit({"linear": name, "M": M, "K": K, "N": N,
              "max_diff_bf16_steps": round(((y.float() - ref.float()).abs() / ulp).max().item(), 2),
              "cublas_us": round(per_call_us(lambda: F.linear(x, w), 50, DEV), 2),
              "kernel_default_us": round(per_call_us(lambda: nlk.linear_rows(x, w), 50, DEV), 2),
              "default_blocks": list(nlk._blocks(M, N, K, False)), "best_us": round(best[0], 2),
              "best_bn_warps": list(best[1]) if best[1] else None})

# 3. the tensor-core kernel for 5-16 rows (verify steps of 5-16 tokens at batch 1) against the path it would replace:
#    compiled add + RMSNorm, cuBLAS, compiled SiLU gating (q/k/v, gate/up) or cuBLAS alone (o_proj, down_proj)
import time  # noqa: E402

from eaglespec.layers.mlp import silu_mul  # noqa: E402
from eaglespec.layers.norm import add_rms_norm  # noqa: E402

add_norm = torch.compile(add_rms_norm, dynamic=True) if not CPU else add_rms_norm
act = torch.compile(silu_mul, dynamic=True) if not CPU else silu_mul


def mma(h, d, nw, w, gated, norm, cfg):
    M, K = h.shape
    N = w.shape[0] // 2 if gated else w.shape[0]
    h_out, y = torch.empty_like(h), torch.empty(M, N, dtype=h.dtype, device=h.device)
    bn, bk, warps, stages = cfg
    nlk._mma_kernel()[((N + bn - 1) // bn,)](h, d if d is not None else h, nw if norm else h, w, h_out, y, M, N,
                                             1e-5, K=K, HAS_D=d is not None, GATED=gated, NORM=norm,
                                             IEEE=h.dtype == torch.float32 or CPU, BLOCK_M=16, BLOCK_N=bn,
                                             BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return h_out, y


T0 = time.perf_counter()
for name, K, N, gated, norm in [("q/k/v", 576, 960, False, True), ("gate/up", 576, 1536, True, True),
                                ("o_proj", 576, 576, False, False), ("down_proj", 1536, 576, False, False)] \
        if not CPU else [("tiny", 96, 40, True, True)]:
    w = (torch.randn(2 * N if gated else N, K, generator=g, device=DEV) / K ** 0.5).to(DT)
    nw = (1 + 0.1 * torch.randn(K, generator=g, device=DEV)).to(DT)
    kp = 1 << (K - 1).bit_length()
    cfgs = [(bn, bk, warps, stages) for bn in (16, 32) for bk in (64, 128, kp) for warps in (2, 4)
            for stages in ((2, 3) if bk < kp else (1,))] if not CPU else [(16, 32, 1, 1)]
    for M in (5, 8, 16) if not CPU else (5,):
        h = torch.randn(M, K, generator=g, device=DEV).to(DT)
        d = torch.randn(M, K, generator=g, device=DEV).to(DT) if norm else None

        def replaced():
            if not norm:
                return F.linear(h, w)
            hh, x = add_norm(h, d, nw, 1e-5)
            y = F.linear(x, w)
            return hh, act(y) if gated else y

        ref = nlk.add_norm_linear_reference(h, d, nw, 1e-5, w, gated)[1] if norm else F.linear(h, w)
        best = (float("inf"), None, None)
        for cfg in cfgs:
            if time.perf_counter() - T0 > 200:
                break
            try:
                y = mma(h, d, nw, w, gated, norm, cfg)[1]
                t = per_call_us(lambda: mma(h, d, nw, w, gated, norm, cfg), 50, DEV)
            except Exception as e:  # noqa: BLE001
                print(f"  skip {cfg}: {type(e).__name__}", flush=True)
                continue
            if t < best[0]:
                ulp = ref.float().abs().clamp_min(ref.float().abs().mean().item()) * 2 ** -7
                best = (t, cfg, ((y.float() - ref.float()).abs() / ulp).max().item())
        emit({"mma": name, "M": M, "K": K, "N": N, "replaced_us": round(per_call_us(replaced, 50, DEV), 2),
              "best_us": round(best[0], 2), "best_cfg": list(best[1]) if best[1] else None,
              "max_diff_bf16_steps": round(best[2], 2) if best[2] is not None else None})
