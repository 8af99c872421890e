"""Where does a speculative step at 32 rows lose time outside its graphs? The engine's own steps against its graphs
replayed alone, in steady state and under continuous batching, with random weights (no checkpoint to stage).

Random SmolLM2-135M weights and a random drafter with a 12,288-token head, bf16, CUDA graphs, overlap on (the bench's
engine). Per engine (no-spec, chain S3 K1 D4, tree S5 K2 D8; 8 and 32 rows):
1. steady: `rows` requests of 128-token prompts that never stop (random weights ignore EOS; `ignore_eos`), 200
   `engine.step()` calls after 20 warm ones (every length bucket captured before: `Engine.warmup`): wall ms per step, against the step's graphs replayed alone at that
   length (decode, or draft + verify + commit);
2. continuous: 80 requests with prompts of 64-192 tokens and 64-256 new tokens (seeded; MT-bench's spread of answer
   lengths), all queued at once as the bench's continuous batching does (graphs captured before for 1..rows rows, as
   the bench does): wall seconds, tok/s, the steps by kind,
   and the time the host spends in `engine.step()` calls that prefill against those that decode / speculate.
With `--profile` the steady no-spec and chain engines at 32 rows also run 30 steps under torch.profiler: the GPU's
idle time between kernels per step, the host time per graph launch, and the host's longest calls.

usage: python benchmarks/engine_step_gap.py OUT_DIR [--profile]      (--cpu: a few steps, 2 rows, a check of the script)
"""

from __future__ import annotations

import random
import sys
import time

from probe_script import CPU, DEV, Emitter, random_pair, replay_ms  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402


def sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


def engine(m, d, spec, rows):
    return Engine(m, None, EngineConfig(max_batch_size=rows, cuda_graphs=not CPU, overlap=not CPU),
                  drafter=d if spec else None, spec=spec)


QUICK = CPU  # the CPU check: a few steps and requests


def steady(m, d, spec, rows, n=5 if QUICK else 200):
    e = engine(m, d, spec, rows)
    e.reserve(rows, 2048)
    e.warmup([rows])  # every length bucket captured now: the timed steps never capture
    for i in range(rows):
        e.add_request(list(range(100 + i, 228 + i)), SamplingParams(max_new_tokens=1500, ignore_eos=True))
    for _ in range(3 if QUICK else 20):
        e.step()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        e.step()
    sync()
    wall = 1e3 * (time.perf_counter() - t) / n
    g_ms = 0.0
    if not CPU:  # the graphs of the step's current length bucket, replayed alone
        graphs = e.runner.graphs.captured("spec" if spec else "decode", rows, max(e.runner.host_len) + 64, True)
        g_ms = replay_ms([g for _, g in graphs])
    return e, wall, g_ms


def continuous(m, d, spec, rows, n_req=4 if QUICK else 80, seed=0):
    rng = random.Random(seed)
    reqs = [(rng.randint(64, 192), rng.randint(2, 6) if QUICK else rng.randint(64, 256)) for _ in range(n_req)]
    e = engine(m, d, spec, rows)
    e.reserve(rows, 512)
    e.warmup(range(1, rows + 1))  # as the bench does
    # warm: one request through prefill and steps (graphs of the first buckets), not timed
    e.generate([list(range(5, 69))], SamplingParams(max_new_tokens=4 if QUICK else 32, ignore_eos=True))
    for i, (p, n) in enumerate(reqs):
        e.add_request([(7 * i + j) % 40000 + 10 for j in range(p)], SamplingParams(max_new_tokens=n, ignore_eos=True))
    host = {"prefill": 0.0, "step": 0.0}
    counts0 = dict(e.step_counts)
    sync()
    t0 = time.perf_counter()
    while e.has_work():
        admitting = e._pending is None and e.scheduler.may_admit()
        t = time.perf_counter()
        e.step()
        host["prefill" if admitting else "step"] += time.perf_counter() - t
    sync()
    wall = time.perf_counter() - t0
    steps = {k: v - counts0.get(k, 0) for k, v in e.step_counts.items()}
    return {"wall_s": round(wall, 3), "tok_s": round(sum(n for _, n in reqs) / wall, 1), "steps": steps,
            "host_prefill_calls_s": round(host["prefill"], 3), "host_step_calls_s": round(host["step"], 3)}


m, d = random_pair(draft_vocab=12288)
emit = Emitter("engine_step_gap.json")
shapes = {"no-spec": None, "S3K1D4": SpecConfig(3, 1, 4), "S5K2D8": SpecConfig(5, 2, 8)}
for rows in (2,) if QUICK else (8, 32):
    for name, spec in shapes.items():
        e, wall, g_ms = steady(m, d, spec, rows)
        row = {"rows": rows, "shape": name, "steady_engine_ms": round(wall, 4), "steady_graphs_ms": round(g_ms, 4),
               "outside_graphs_ms": round(wall - g_ms, 4)}
        if "--profile" in sys.argv and rows == 32 and name in ("no-spec", "S3K1D4") and not CPU:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(30):
                    e.step()
                sync()
            ks = sorted(((ev.time_range.start, ev.time_range.end) for ev in prof.events()
                         if ev.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
            idle, end = 0.0, ks[0][0]
            for s, t_end in ks:
                idle += max(0.0, s - end)
                end = max(end, t_end)
            row["profile_gpu_span_us_per_step"] = round((ks[-1][1] - ks[0][0]) / 30, 1)
            row["profile_gpu_idle_us_per_step"] = round(idle / 30, 1)
            launches = [a for a in prof.key_averages() if a.key == "cudaGraphLaunch"]
            if launches:  # host time per graph launch (a launch that waits for the GPU shows here)
                row["profile_graph_launch_us"] = round(launches[0].cpu_time_total / launches[0].count, 1)
            top = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
            (emit.path.parent / f"profile_cpu_{name}.txt").write_text(top)
        del e
        row.update({f"cont_{k}": v for k, v in continuous(m, d, spec, rows).items()})
        emit(row)
        torch.cuda.empty_cache() if not CPU else None
