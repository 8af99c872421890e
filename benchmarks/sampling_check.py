"""The sampling-distribution kernel on the GPU (layers/sampling_kernel.py) against the PyTorch path it replaces:
agreement and time per call, for SmolLM2's vocabulary (49,152), a draft vocabulary (12,288) and Llama-3's (128,256),
at the row counts of decode (1, 8, 32 rows) and of verify (x 4 / x 8 tokens), bf16 logits.
Per (V, rows, case): max |p_kernel - p_torch|, whether their supports match (ties aside), us per call of the kernel
in a CUDA graph of 20 calls (what a captured step pays) and eagerly, and of the PyTorch path eagerly (CUDA events,
50 calls after 5 warm-ups). Cases: "T" (temperature 1 only), "T+p" (top-p 0.9), "T+k" (top-k 50), "T+k+p" (top-k
50, top-p 0.9), "greedy" (temperature 0).

usage: python benchmarks/sampling_check.py OUT_DIR [--rows=1,8,32] [--vocab=49152,12288] [--no-torch]
(PYTHONPATH=src; --no-torch: no PyTorch timing, for an A/B of two trees' kernels)
"""

from __future__ import annotations

import json
import sys

from probe_script import OUT, per_call_us  # noqa: E402

import torch  # noqa: E402

from eaglespec.layers import sampling_kernel  # noqa: E402
from eaglespec.layers.sampling import target_probs_reference  # noqa: E402


def arg(name: str, default: str) -> list[int]:
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return [int(v) for v in a.split("=", 1)[1].split(",")]
    return [int(v) for v in default.split(",")]


def us_per_call(fn, n: int = 50) -> float:
    for _ in range(5):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return round(a.elapsed_time(b) * 1000 / n, 1)


CASES = {"T": (1.0, 0, 1.0), "T+p": (1.0, 0, 0.9), "T+k": (1.0, 50, 1.0), "T+k+p": (0.8, 50, 0.9),
         "greedy": (0.0, 0, 1.0)}
rows_out = []
g = torch.Generator(device="cuda").manual_seed(0)
for V in arg("vocab", "49152,12288,128256"):
    for N in arg("rows", "1,4,8,32,128,256"):
        x = (torch.randn(N, V, device="cuda", generator=g) * 3).to(torch.bfloat16)
        for case, (t, k, p) in CASES.items():
            T = torch.full((N,), t, device="cuda")
            K = torch.full((N,), k, device="cuda", dtype=torch.int64)
            P = torch.full((N,), p, device="cuda")
            got = sampling_kernel.target_probs(x, T, K, P)
            ref = target_probs_reference(x, T, K, P)
            row = {"V": V, "rows": N, "case": case, "max_abs": float((got - ref).abs().max()),
                   "support_mismatch": int(((got > 0) != (ref > 0)).sum()),
                   "graph_us": round(per_call_us(lambda: sampling_kernel.target_probs(x, T, K, P), 20), 1),
                   "kernel_us": us_per_call(lambda: sampling_kernel.target_probs(x, T, K, P)),
                   "torch_us": None if "--no-torch" in sys.argv else
                   us_per_call(lambda: target_probs_reference(x, T, K, P))}
            rows_out.append(row)
            print(json.dumps(row), flush=True)
(OUT / "sampling_check.json").write_text(json.dumps(rows_out, indent=1))
print("\n| V | rows | case | kernel us (graph) | kernel us (eager) | torch us | max abs diff | support mismatches |")
print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
for r in rows_out:
    print(f"| {r['V']} | {r['rows']} | {r['case']} | {r['graph_us']} | {r['kernel_us']} | {r['torch_us']} | "
          f"{r['max_abs']:.2e} | {r['support_mismatch']} |")
