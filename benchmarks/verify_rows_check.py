"""What does a step's row count cost, off the multiples of 16? Session 28 found an 8-row tree S4 K4 D7 (56 rows a
verify) slower than S4 K4 D8 (64 rows) on MT-bench: 0.911 against 0.828 ms a verify. The cause was the tensor-core
projection's row-masked loads (`layers/norm_linear_dot_kernel.py`: Triton specialises M when it is a multiple of
16). At 52245bf this probe ran the masked loads and the row-clamped ones side by side (`--clamp`, and `--graphs`
alternating both); the commit after it made the clamped loads the kernel's only form. This version measures the kernel
as it is.

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL; probe_script):
- the target's head alone (cuBLAS, [M, 576] x [576, 49152]) and SmolLM2's q/k/v, gate/up and down projections
  (the tensor-core kernel), us per call in a graph of 50 calls, at M = 8..128 / 16..64;
- `--graphs`: ms per replay of decode graphs of 1, 8 and 24 rows, and the verify graph and whole step of a one-row
  chain of 8 (S7 K1 D8), an 8-row tree S4 K4 D8 and a 32-row S5 K2 D8;
- otherwise: the verify graph and whole step of 8-row trees S4 K4 D7 / D8 (ms per replay), and where each verify
  graph's time goes by kernel family (advance, us per replay).

usage: python benchmarks/verify_rows_check.py OUT_DIR [--graphs | --projections] [--cpu]
"""

from __future__ import annotations

import sys

from probe_script import (CPU, DEV, DT, Emitter, current_graphs, decode_graph_ms, kernel_advance,  # noqa: E402
                          per_call_us, print_advance, random_pair, replay_ms, spec_graph_ms, stepped_engine)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers.norm_linear_kernel import add_norm_linear, linear_rows  # noqa: E402

emit = Emitter("verify_rows_check.json")
if "--graphs" in sys.argv:
    m, d = random_pair()
    row = {}
    for rows in (1, 8, 24):
        row[f"decode{rows}_ms"] = decode_graph_ms(m, rows)
    for spec, rows in ((SpecConfig(7, 1, 8), 1), (SpecConfig(4, 4, 8), 8), (SpecConfig(5, 2, 8), 32)):
        key = f"rows{rows}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
        row[f"{key}_verify_ms"], row[f"{key}_step_ms"] = spec_graph_ms(m, d, spec, rows=rows)
    emit(row)
    raise SystemExit

V, H, FF = (49152, 576, 1536) if not CPU else (512, 64, 96)
w = (torch.randn(V, H) / H ** 0.5).to(DEV, DT)
head = {}
for M in (8, 16, 24, 32, 40, 48, 56, 60, 63, 64, 65, 72, 80, 96, 112, 128):
    x = torch.randn(M, H).to(DEV, DT)
    head[M] = round(per_call_us(lambda: F.linear(x, w)), 2)
emit({"head_us": head})

for name, (K, N, kind) in {"qkv": (H, 960 if not CPU else 40, "norm"), "gate_up": (H, FF, "gated"),
                           "down": (FF, H, "plain")}.items():
    us = {}
    for M in (16, 24, 32, 40, 48, 52, 56, 60, 63, 64):
        x, dd = torch.randn(M, 1, K).to(DEV, DT), torch.randn(M, 1, K).to(DEV, DT)
        nw = torch.ones(K).to(DEV, DT)
        wp = (torch.randn(2 * N if kind == "gated" else N, K) / K ** 0.5).to(DEV, DT)
        fn = (lambda: linear_rows(x, wp)) if kind == "plain" else (
            lambda: add_norm_linear(x, dd, nw, 1e-5, wp, kind == "gated"))
        us[M] = round(per_call_us(fn), 2)
    emit({"projection": name, "us": us})

if not CPU and "--projections" not in sys.argv:
    m, d = random_pair()
    for D in (8, 7, 8, 7):
        e = stepped_engine(m, d, SpecConfig(4, 4, D), rows=8)
        graphs = current_graphs(e, "spec", 8)
        verify = dict(graphs)["verify"]
        row = {"shape": f"S4K4D{D}", "verify_ms": round(replay_ms([verify]), 4),
               "step_ms": round(replay_ms([g for _, g in graphs]), 4)}
        adv = kernel_advance(verify)
        print_advance(f"8 rows S4 K4 D{D} verify", adv, top=12)
        row["verify_by_kernel"] = adv["by_kernel"][:16]
        emit(row)
        del e
