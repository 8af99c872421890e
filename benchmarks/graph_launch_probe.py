"""Is a phase graph's time by CUDA events the GPU's, or the host's launch showing through? (Session 64 saw a one-row
decode graph replay in 0.475-0.481 ms by events against 0.429 for a graph with the same kernels in the same span:
docs/benchmarks.md, "Session 64".)

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs), engines of one row stepped 30 steps after a
128-token prompt; for the plain decode graph and for each phase graph of the chain S3 K1 D4 (draft, verify, commit),
ms per replay measured six ways:

- `events`: events around each replay, the graphs replayed back to back (spec_phase_trace's figure): if the host
  enqueues a replay more slowly than the GPU runs the one before, the GPU waits inside the events and it counts;
- `events_ahead`: the same after a 50 ms sleep kernel, so that the host has enqueued every replay before the GPU
  reaches the first: the GPU's own time, the host's launch hidden;
- `host`: the host's time in `replay()` (the enqueue, during that sleep);
- `wall_loop`: wall time of 200 rounds back to back, then one synchronisation (throughput);
- `wall_sync`: wall time of one round followed by a synchronisation (what a step with its host wait pays);
- `span`: torch.profiler's first kernel start to last kernel end (`probe_script.kernel_advance`).

The difference events - events_ahead is the host's share; span against events_ahead the graph's launch on the GPU.

usage: python benchmarks/graph_launch_probe.py OUT_DIR [--draft-vocab=N]   (under with_setting.py for a policy's
other setting)
"""

from __future__ import annotations

import json
import time

from probe_script import OUT, TimedRounds, current_graphs, kernel_advance, option, random_pair, stepped_engine

import torch

from eaglespec.config import SpecConfig

SLEEP_CYCLES = 100_000_000  # ~50-60 ms at the H100's / H200's clocks: longer than enqueueing 50 rounds


def measure(graphs: list, n: int = 50) -> dict:
    """The six figures (module docstring) of `graphs` [(name, graph)] replayed in order, per graph name."""
    res: dict[str, dict] = {name: {} for name, _ in graphs}
    for _ in range(10):
        for _, g in graphs:
            g.replay()
    torch.cuda.synchronize()
    for ahead in (False, True):
        rounds = TimedRounds(graphs, n)
        if ahead:
            torch.cuda._sleep(SLEEP_CYCLES)
        rounds.run()
        torch.cuda.synchronize()
        for j, (name, _) in enumerate(graphs):
            res[name]["events_ahead" if ahead else "events"] = round(rounds.event_ms(j), 4)
            if ahead:
                res[name]["host"] = round(1e3 * rounds.host[j] / n, 4)
    for name, g in graphs:  # each graph alone, for the wall figures
        t = time.perf_counter()
        for _ in range(200):
            g.replay()
        torch.cuda.synchronize()
        res[name]["wall_loop"] = round(1e3 * (time.perf_counter() - t) / 200, 4)
        walls = []
        for _ in range(100):
            t = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
        res[name]["wall_sync"] = round(1e3 * sorted(walls)[50], 4)  # median
        adv = kernel_advance(g)
        res[name]["span"] = round(adv["span_us"] / 1e3, 4)
        res[name]["kernels"] = adv["kernels"]
        res[name]["first"] = adv["sequence"][0][:70]
    return res


m, d = random_pair(draft_vocab=int(option("draft-vocab", "0")) or None)
out = {}
e = stepped_engine(m)
out.update({f"plain_{k}": v for k, v in measure(current_graphs(e, "decode", 1)).items()})
del e
e = stepped_engine(m, d, SpecConfig(3, 1, 4))
out.update({f"chain_{k}": v for k, v in measure(current_graphs(e, "spec", 1)).items()})
(OUT / "graph_launch.json").write_text(json.dumps(out, indent=1))
keys = ("events", "events_ahead", "host", "wall_loop", "wall_sync", "span", "kernels")
print("graph            " + " ".join(f"{k:>12}" for k in keys) + "  first kernel")
for name, r in out.items():
    print(f"{name:<16} " + " ".join(f"{r[k]:>12}" for k in keys) + f"  {r['first']}")
