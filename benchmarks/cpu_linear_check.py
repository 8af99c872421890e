"""What a CPU's few-row projections cost through F.linear, the weight-major product and oneDNN's packed weight
(layers/cpu_linear.py), and what that makes of SmolLM2's forward of T tokens against one of 1 token: the measurement
behind `transforms.use_cpu_linear`, `cpu_linear.PAD_ROWS` and `cpu_linear.PACKED_MIN_ROWS`.

1. GEMMs of SmolLM2's shapes (fused q/k/v, fused gate/up, down_proj, the 49,152-row lm_head) over cold weights (30
   copies per shape, 3 for the lm_head, cycled; best of 5 passes), us per call: F.linear(x, W), W @ x^T for the
   same rows (1 and 3 rows as `weight_major_linear` computes them: padded to 2 and 4), and the packed copy
   (`pack_weight`, `packed_linear`).
2. The embedded SmolLM2's cache-free forward (float32, as `prepare_for_inference` leaves it on the CPU, fused) of T =
   1..8 tokens: ms for T = 1 and the ratio for the others (the fastest of 5 each; engine/verify_cost.py's load-time
   measurement takes the median of rounds' ratios instead), as the engine runs it (the load's timing,
   `cpu_linear.direct_rows`, choosing the few-row product),
   with session 61's fixed policy (weight-major at 1-2 rows, the packed copies from 3; `cpu_linear.MEASURE` off),
   weight-major alone (`transforms.CPU_PACK_MAX_SHARE` 0) and F.linear alone (`transforms.CPU_WEIGHT_MAJOR` False).
   This machine's timings vary: alternate runs before trusting a 5% change.

usage: python benchmarks/cpu_linear_check.py [--threads N]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from eaglespec.engine import transforms
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.engine.verify_cost import _forward_s
from eaglespec.layers import cpu_linear
from eaglespec.layers.cpu_linear import pack_weight, packed_linear, weight_major_linear
from eaglespec.loading.checkpoint import load_model

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=torch.get_num_threads())
args = ap.parse_args()
torch.set_num_threads(args.threads)
print(f"torch {torch.__version__}, {args.threads} threads")


def best_us(calls: list, passes: int = 5) -> float:
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        for f in calls:
            f()
        best = min(best, (time.perf_counter() - t0) / len(calls) * 1e6)
    return best


print("\n| projection (N x K) | rows | F.linear us | weight-major us | packed us |")
print("| --- | ---: | ---: | ---: | ---: |")
for name, (n, k) in {"q/k/v": (960, 576), "gate/up": (3072, 576), "down_proj": (576, 1536),
                     "lm_head": (49152, 576)}.items():
    ws = [torch.randn(n, k) for _ in range(3 if name == "lm_head" else 30)]
    ps = [pack_weight(w) for w in ws]
    for rows in (1, 2, 3, 4, 8):
        x = torch.randn(rows, k)
        a = best_us([lambda w=w: F.linear(x, w) for w in ws])
        b = best_us([lambda w=w: weight_major_linear(x, w) for w in ws])
        c = best_us([lambda p=p: packed_linear(x, p, None, n) for p in ps]) if ps[0] is not None else float("nan")
        print(f"| {name} {n} x {k} | {rows} | {a:,.0f} | {b:,.0f} | {c:,.0f} |", flush=True)
    del ws, ps


def fastest(model: torch.nn.Module, tokens: int, repeats: int) -> float:
    ids = torch.zeros(1, tokens, dtype=torch.long)
    _forward_s(model, ids)
    return min(_forward_s(model, ids) for _ in range(repeats))


print("\n| projections | T = 1 ms | T = 2 | 3 | 4 | 5 | 8 |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
share = transforms.CPU_PACK_MAX_SHARE
# (label, CpuLinear at all, packed copies' memory share, timed at load): as the engine runs it (the load's timing
# picks F.linear or weight-major at 1-2 rows and how far F.linear goes before the copies: `cpu_linear.direct_rows`),
# session 61's fixed policy, weight-major alone, F.linear alone (plain nn.Linear)
for label, weight_major, pack, measure in (("as the engine runs it", True, share, True),
                                           ("weight-major at 1-2 rows, packed from 3 (untimed)", True, share, False),
                                           ("weight-major", True, 0.0, False), ("F.linear", False, 0.0, False)):
    transforms.CPU_WEIGHT_MAJOR, transforms.CPU_PACK_MAX_SHARE = weight_major, pack
    cpu_linear.MEASURE = measure
    m = prepare_for_inference(load_model(None, device="cpu", dtype="float32").model, torch.device("cpu"), None, None)
    chosen = {x.direct_rows for x in m.modules() if isinstance(x, cpu_linear.CpuLinear)}
    if measure:
        label += f" (F.linear up to {max(chosen)} rows)" if max(chosen) else " (weight-major at 1-2 rows)"
    with torch.no_grad():
        one = fastest(m, 1, 5)
        ratios = [fastest(m, t, 5) / one for t in (2, 3, 4, 5, 8)]
    print(f"| {label} | {one * 1e3:.1f} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |", flush=True)
    del m
