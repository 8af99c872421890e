"""Why an eager step of this engine costs ~20 ms on the H200 (session 50: constrained steps ran eagerly at 46 tok/s for
SmolLM2, against 1,460 through graphs; session 1 measured eager bf16 decoding at 47.7 ms a step). Eager steps remain
what MoE targets (no graphs yet) and `--no-cuda-graphs` run.

    python benchmarks/eager_step_probe.py GGUF [--cpu]

For the embedded SmolLM2 (bf16 on CUDA; `--cpu`: float32, a smoke run of the script), one row, a 20-token prompt,
plain greedy decoding without CUDA graphs, compiled (the CUDA default) and not: ms per decode step (steps 33-64 of a
64-token answer: the first steps pay first uses), then torch.profiler over 8 steps of each: the operators with the
most host time and with the most device time, and the step's device time against its host time. Prints tables.
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from eaglespec import api
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams

CPU = "--cpu" in sys.argv
GGUF = next((a for a in sys.argv[1:] if not a.startswith("--")), None)
DEV = "cpu" if CPU else "cuda"
PROMPT = "Write a short story about a robot who learns to paint."


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def steps_ms(eng, n_skip: int, n: int) -> float:
    """ms per decode step over steps n_skip+1..n_skip+n of one answer (the engine stepped by hand)."""
    req = eng.add_request(PROMPT, SamplingParams(max_new_tokens=n_skip + n + 1, ignore_eos=True))
    while len(req.output_ids) < n_skip:
        eng.step()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        eng.step()
    sync()
    ms = 1e3 * (time.perf_counter() - t0) / n
    while eng.has_work():
        eng.step()
    return ms


def main() -> int:
    rows = []
    for compiled in (True, False):
        cfg = EngineConfig(device=DEV, max_batch_size=1, cuda_graphs=False, compile=compiled, overlap=False)
        eng = api.load(GGUF, draft=None, config=cfg)
        eng.reserve(1, 256)
        ms = steps_ms(eng, 32, 32)
        req = eng.add_request(PROMPT, SamplingParams(max_new_tokens=48, ignore_eos=True))
        while len(req.output_ids) < 32:
            eng.step()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
        sync()
        with profile(activities=acts) as prof:
            for _ in range(8):
                eng.step()
            sync()
        while eng.has_work():
            eng.step()
        name = "compiled" if compiled else "not compiled"
        rows.append((name, ms))
        key = "self_cuda_time_total" if DEV == "cuda" else "self_cpu_time_total"
        print(f"\n== {name}: {ms:.2f} ms per eager decode step", flush=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
        if DEV == "cuda":
            print(prof.key_averages().table(sort_by=key, row_limit=10, max_name_column_width=60))
        del eng
    print("\n| eager decode, one row | ms per step |\n| --- | ---: |")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
