"""What the GPU probe scripts of benchmarks/ share (step_kernels_check, tree_draft_probe, small_kernels_check), so
that each states only what it measures:

- `--cpu`: Triton's interpreter (set here, before any kernel is built), float32, tiny shapes: a check of the script
  itself on a machine without a GPU;
- OUT: the first argument that is not a flag (created); DEV / DT: cuda and bf16, or cpu and float32;
- `Emitter(name)`: called with a result row, prints it as JSON and rewrites OUT/name with every row so far (a call
  cut short by its time limit still leaves its rows);
- `per_call_us(fn, calls)`: time of one call in a CUDA graph of `calls` calls (eaglespec.bench.graph_timing);
- `replay_ms(graphs, n, warmup)`: ms per replay of the captured graphs in order (after `warmup` untimed rounds);
- `stepped_engine(model, drafter, spec)`: a one-row engine without overlap that has decoded (or speculated) 30 steps
  after a 128-token prompt: mid-generation, so that `engine.runner.graphs.captured(kind, 1, length, True)` gives the
  graphs of its current length to replay and profile alone (each replay moves its state on by one step).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

CPU = "--cpu" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from eaglespec.bench.graph_timing import per_call_us as _graph_per_call_us  # noqa: E402
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

OUT = Path([a for a in sys.argv[1:] if not a.startswith("--")][0])
OUT.mkdir(parents=True, exist_ok=True)
DEV = torch.device("cpu" if CPU else "cuda")
DT = torch.float32 if CPU else torch.bfloat16


class Emitter:
    def __init__(self, name: str) -> None:
        self.path = OUT / name
        self.rows: list[dict] = []

    def __call__(self, row: dict) -> None:
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        self.path.write_text(json.dumps(self.rows, indent=1))


def per_call_us(fn, calls: int = 50) -> float:
    return _graph_per_call_us(fn, calls, DEV)


def replay_ms(graphs: list[torch.cuda.CUDAGraph], n: int = 200, warmup: int = 20) -> float:
    for _ in range(warmup):
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t) / n


def stepped_engine(model: torch.nn.Module, drafter: torch.nn.Module | None = None, spec: SpecConfig | None = None,
                   steps: int = 30, cache: int = 2048) -> Engine:
    e = Engine(model, None, EngineConfig(overlap=False, cuda_graphs=not CPU), drafter=drafter, spec=spec)
    e.reserve(1, cache)
    e.add_request(list(range(100, 228)), SamplingParams(max_new_tokens=cache - 256, ignore_eos=True))
    for _ in range(steps):
        e.step()
    if not CPU:
        torch.cuda.synchronize()
    return e
