"""Why does the host wait while a speculative step's graphs replay? (step_anatomy, 2026-11-30: launching a plain
decode step's graph costs the host 0.004 ms, launching the draft/verify/commit graphs of a chain step 1.6 of its
1.7 ms, so the host cannot run ahead of the GPU there and overlap gains little.)

For a random-weight SmolLM2-135M shape with a random drafter (bf16, CUDA graphs, batch 1, chain S3 K1 D4): the host
time of each graph's `replay()` call on its own (mean over 100 steps, no synchronisation between steps), and a
torch.profiler table and trace of 20 steps' replays (which nodes each graph holds), then the same three phases
captured as one graph, and two instances of the three graphs alternated. Findings (docs/benchmarks.md, "Session
5"): the verify graph's launch blocks for about its GPU time; it holds a memset node per layer (cuDNN's multi-token
attention kernel); merging or alternating the graphs does not help.

usage: python benchmarks/replay_probe.py OUT_DIR [--no-cudnn-sdpa]   (--no-cudnn-sdpa: PyTorch's cuDNN attention
       backend off, process-wide: its multi-token kernel adds a memset node per call to the graphs)
"""

from __future__ import annotations

import json
import sys
import time

import torch

from probe_script import OUT, random_pair, stepped_engine

from eaglespec.config import SpecConfig
if "--no-cudnn-sdpa" in sys.argv:
    torch.backends.cuda.enable_cudnn_sdp(False)
m, d = random_pair()
rows = {}


def replays(step, n: int) -> dict:
    """Host time to enqueue n steps (`step(i)` launches step i) and their time until the GPU is done."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(n):
        step(i)
    enqueue = time.perf_counter() - t
    torch.cuda.synchronize()
    total = time.perf_counter() - t
    return {"enqueue_ms_per_step": round(1e3 * enqueue / n, 4), "gpu_ms_per_step": round(1e3 * total / n, 4)}


for kind, spec in (("decode", None), ("spec", SpecConfig(3, 1, 4))):
    e = stepped_engine(m, d if spec else None, spec)
    run = e.runner
    key = run.graphs.key(kind, 1, run.host_len[0] + 64, True)
    graphs = run.graphs.captured(kind, 1, run.host_len[0] + 64, True)
    torch.cuda.synchronize()
    host = {name: 0.0 for name, _ in graphs}
    n = 100
    t_all = time.perf_counter()
    for _ in range(n):
        for name, g in graphs:
            t = time.perf_counter()
            g.replay()
            host[name] += time.perf_counter() - t
    enqueue = time.perf_counter() - t_all
    torch.cuda.synchronize()
    total = time.perf_counter() - t_all
    rows[kind] = {"host_ms_per_replay": {k: round(1e3 * v / n, 4) for k, v in host.items()},
                  "enqueue_ms_per_step": round(1e3 * enqueue / n, 4), "gpu_ms_per_step": round(1e3 * total / n, 4)}
    print(kind, json.dumps(rows[kind]), flush=True)
    print("cudnn sdpa:", torch.backends.cuda.cudnn_sdp_enabled(), flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            for _, g in graphs:
                g.replay()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
    (OUT / f"profile_{kind}.txt").write_text(table)
    print(table, flush=True)
    prof.export_chrome_trace(str(OUT / f"trace_{kind}.json"))
    if kind == "spec":  # the same three phases captured as ONE graph: does the host still wait?
        phases = run.graphs._phases(*key)
        g1 = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(g1, pool=run.graphs.pool):
            for _, fn in phases:
                fn()
        rows["spec merged"] = replays(lambda i: g1.replay(), n)
        print("spec merged", json.dumps(rows["spec merged"]), flush=True)
        # two instances of the 3 graphs alternated (if a launch waits for the previous launch of the same exec)
        run.graphs.graphs.pop(key)
        run.graphs._capture(key)
        other = run.graphs.graphs[key]

        def alternate(i: int) -> None:
            for _, g in (graphs if i % 2 else other):
                g.replay()

        rows["spec alternated"] = replays(alternate, n)
        print("spec alternated", json.dumps(rows["spec alternated"]), flush=True)
    del e
(OUT / "replay_probe.json").write_text(json.dumps(rows, indent=1))
