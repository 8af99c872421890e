"""What the GPU probe scripts of benchmarks/ share (step_kernels_check, tree_draft_probe, small_kernels_check), so
that each states only what it measures:

- `--cpu`: Triton's interpreter (set here, before any kernel is built), float32, tiny shapes: a check of the script
  itself on a machine without a GPU;
- OUT: the first argument that is not a flag (created); DEV / DT: cuda and bf16 (float32 with `--float32`), or cpu
  and float32;
- `option(name, default)`: the value of a `--name=VALUE` argument, or default;
- `Emitter(name)`: called with a result row, prints it as JSON and rewrites OUT/name with every row so far (a call
  cut short by its time limit still leaves its rows);
- `per_call_us(fn, calls)`: time of one call in a CUDA graph of `calls` calls (eaglespec.bench.graph_timing);
- `replay_ms(graphs, n, warmup)`: ms per replay of the captured graphs in order (after `warmup` untimed rounds);
- `TimedRounds(graphs, n)`: the events of `n` rounds of (name, graph) pairs; `.run()` enqueues the rounds, each
  replay between CUDA events and host clocks, without a synchronisation; after one, `.event_ms(j)` is graph j's mean
  ms by events and `.host[j]` its host seconds in `replay()`, summed;
- `stepped_engine(model, drafter, spec, rows=1)`: an engine of `rows` rows without overlap that has decoded (or
  speculated) 30 steps after a 128-token prompt per row: mid-generation, so that `current_graphs(engine, kind,
  rows)` gives the graphs of its current length bucket to replay and profile alone (each replay moves its state on
  by one step);
- `generated_tokens(model, drafter, spec, n)` / `agreement(out, base)`: a one-row engine's greedy tokens after the
  128-token prompt, and how many positions two such runs share ("k/n": bf16 near-ties flip with a kernel's sums);
- `random_pair(shape, draft_vocab)`: a random bf16 target of a named shape and a random drafter for it (draft
  vocabulary: random_model.DRAFT_VOCAB unless given), both in the inference form CUDA runs (the GPU probes' usual
  subjects);
- `print_advance(title, result, top)`: `kernel_advance`'s result as lines of text;
- `decode_graph_ms(model, rows)` / `spec_graph_ms(model, drafter, spec, rows)`: ms per replay of a stepped engine's
  decode graph / of its verify graph and of its whole speculative step (draft, verify, commit in order);
- `draft_step_ms(model, drafter, cases, look)`: per (spec, rows) of `cases` (default DRAFT_CASES: chains of 3 at 1,
  8 and 32 rows, a tree S4 K4 D16 at 1 row), ms per replay of a stepped engine's draft graph and of its whole step,
  keyed "rows{R}_S{S}K{K}D{D}_draft_ms" / "_step_ms"; `look(spec, rows, graphs)` may add entries first;
- `kernel_advance(graph, reps)`: where a graph's time goes, kernel by kernel, as "advances" (step_trace.py's
  accounting: each kernel is charged the time from the previous kernel's end to its own end, so the shares add up to
  the graph's span even when programmatic dependent launch overlaps kernels); per kernel family, and for the last
  replay kernel by kernel in order (`advance_sequence`).
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
DT = torch.float32 if CPU or "--float32" in sys.argv else torch.bfloat16


def option(name: str, default: str) -> str:
    return next((a.split("=", 1)[1] for a in sys.argv if a.startswith(f"--{name}=")), default)


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


class TimedRounds:
    def __init__(self, graphs: list, n: int) -> None:
        self.graphs, self.n = graphs, n
        self.ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in graphs]
                   for _ in range(n)]
        self.host = [0.0] * len(graphs)

    def run(self) -> "TimedRounds":
        for i in range(self.n):
            for j, (_, g) in enumerate(self.graphs):
                self.ev[i][j][0].record()
                t = time.perf_counter()
                g.replay()
                self.host[j] += time.perf_counter() - t
                self.ev[i][j][1].record()
        return self

    def event_ms(self, j: int) -> float:
        return sum(self.ev[i][j][0].elapsed_time(self.ev[i][j][1]) for i in range(self.n)) / self.n


def stepped_engine(model: torch.nn.Module, drafter: torch.nn.Module | None = None, spec: SpecConfig | None = None,
                   steps: int = 30, cache: int = 2048, rows: int = 1, temperature: float = 0.0,
                   top_p: float = 1.0, top_k: int = 0) -> Engine:
    e = Engine(model, None, EngineConfig(overlap=False, cuda_graphs=not CPU, max_batch_size=rows), drafter=drafter,
               spec=spec)
    e.reserve(rows, cache)
    for i in range(rows):  # rows decode in lockstep after one prefill of equal-length prompts
        e.add_request(list(range(100 + i, 228 + i)), SamplingParams(max_new_tokens=cache - 256, ignore_eos=True,
                                                                    temperature=temperature, top_p=top_p,
                                                                    top_k=top_k))
    for _ in range(steps):
        e.step()
    if not CPU:
        torch.cuda.synchronize()
    return e


def current_graphs(e: Engine, kind: str, rows: int, greedy: bool = True) -> list:
    """A stepped engine's captured graphs of `kind` ("decode" / "spec") for `rows` rows at its current length
    bucket (greedy or sampled), as (name, graph) pairs in launch order (each replay moves the state on by one
    step)."""
    return e.runner.graphs.captured(kind, rows, max(e.runner.host_len) + 64, greedy)


def generated_tokens(model: torch.nn.Module, drafter: torch.nn.Module | None = None, spec: SpecConfig | None = None,
                     n: int = 256) -> list[int]:
    """The `n` tokens a one-row engine generates greedily after the probes' 128-token prompt (ids 100..227)."""
    e = Engine(model, None, EngineConfig(max_batch_size=1), drafter=drafter, spec=spec)
    out = e.generate([list(range(100, 228))], SamplingParams(max_new_tokens=n, ignore_eos=True))[0].token_ids
    del e
    return out


def agreement(out: list[int], base: list[int]) -> str:
    """How many positions of `out` equal `base`'s, as "k/n"."""
    return f"{sum(a == b for a, b in zip(out, base))}/{len(base)}"


def short_kernel_name(name: str) -> str:
    """A kernel's family: our Triton kernels and cuBLAS by a key of their name, others by their first 40 letters."""
    for key in ("add_norm_linear", "split_kernel", "combine_kernel", "rope_store", "gemv", "nvjet", "chunk_max",
                "row_max", "topk", "tree_", "elementwise", "reduce_kernel", "indexSelect", "index_elementwise",
                "scatter", "gather", "cunn_", "triton_"):
        if key in name:
            return key
    return name[:40]


def kernel_advance(graph: "torch.cuda.CUDAGraph", reps: int = 20) -> dict:
    """Replay `graph` `reps` times under torch.profiler; per kernel family: calls, advance and duration (us per
    replay), and the span, kernel count and overlaps per replay (module docstring)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                      if ev.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
    per = len(kernels) // reps
    advance: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # advance, duration, calls
    overlapped = 0
    span = 0.0
    steps: list[float] = []  # the last replay's advance per kernel, in order
    for r in range(reps):
        ks = kernels[r * per:(r + 1) * per]
        span += ks[-1][1] - ks[0][0]
        prev_end = ks[0][0]
        steps = []
        for s, e, name in ks:
            a = advance[short_kernel_name(name)]
            steps.append(max(0.0, e - max(prev_end, s)) + max(0.0, s - prev_end))  # idle before it counts to it
            a[0] += steps[-1]
            a[1] += e - s
            a[2] += 1
            overlapped += s < prev_end
            prev_end = max(prev_end, e)
    rows = sorted(advance.items(), key=lambda kv: -kv[1][0])
    last = kernels[(reps - 1) * per:]
    return {"kernels": per, "span_us": round(span / reps, 1), "overlapped_per_replay": round(overlapped / reps, 1),
            "sequence": [f"{(e - s):.1f} {name[:90]}" for s, e, name in last],  # the last replay, in order
            "advance_sequence": [f"{a:.1f} {name[:60]}" for a, (_, _, name) in zip(steps, last)],
            "by_kernel": [{"name": k, "calls": round(v[2] / reps, 1), "advance_us": round(v[0] / reps, 1),
                           "duration_us": round(v[1] / reps, 1)} for k, v in rows]}


def random_pair(shape: str = "smollm2-135m", draft_vocab: int | None = None) -> tuple[torch.nn.Module, torch.nn.Module]:
    from eaglespec.bench.random_model import DRAFT_VOCAB, random_drafter, random_model
    from eaglespec.engine.transforms import prepare_for_inference

    m = random_model(shape, DEV, DT, 0).model
    prepare_for_inference(m, DEV, None, None)
    d = random_drafter(m.config, DEV, DT, 0, draft_vocab or DRAFT_VOCAB)
    prepare_for_inference(d, DEV, None, None)
    return m, d


def print_advance(title: str, r: dict, top: int = 14) -> None:
    print(f"\n== {title}: {r['kernels']} kernels, span {r['span_us']} us, {r['overlapped_per_replay']} start before "
          "the previous ends")
    for k in r["by_kernel"][:top]:
        print(f"  {k['name']:<40} {k['calls']:6.1f} calls  advance {k['advance_us']:8.1f} us  "
              f"(duration {k['duration_us']:8.1f})")


def decode_graph_ms(model: torch.nn.Module, rows: int = 1) -> float:
    e = stepped_engine(model, rows=rows)
    t = replay_ms([g for _, g in current_graphs(e, "decode", rows)])
    del e
    return round(t, 4)


def spec_graph_ms(model: torch.nn.Module, drafter: torch.nn.Module, spec: SpecConfig,
                  rows: int = 1) -> tuple[float, float]:
    e = stepped_engine(model, drafter, spec, rows=rows)
    graphs = current_graphs(e, "spec", rows)
    verify, step = replay_ms([dict(graphs)["verify"]]), replay_ms([g for _, g in graphs])
    del e
    return round(verify, 4), round(step, 4)


DRAFT_CASES = ((SpecConfig(3, 1, 4), 1), (SpecConfig(3, 1, 4), 8), (SpecConfig(3, 1, 4), 32), (SpecConfig(4, 4, 16), 1))


def draft_step_ms(model: torch.nn.Module, drafter: torch.nn.Module, cases=DRAFT_CASES, look=None) -> dict:
    row: dict = {}
    for spec, rows in cases:
        e = stepped_engine(model, drafter, spec, rows=rows)
        graphs = current_graphs(e, "spec", rows)
        key = f"rows{rows}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
        if look is not None:
            row.update(look(spec, rows, graphs))
        row[f"{key}_draft_ms"] = round(replay_ms([dict(graphs)["draft"]]), 4)
        row[f"{key}_step_ms"] = round(replay_ms([g for _, g in graphs]), 4)
        del e
    return row
