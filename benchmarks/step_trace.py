"""Where does a step's time go, kernel by kernel, with and without programmatic dependent launch (layers/pdl.py)?

A profiler's per-kernel durations stop adding up once kernels overlap: with PDL a kernel starts while the one before
it runs and its duration includes its wait. Here each kernel is charged what it adds to the step: the time from the
previous kernel's end to its own end (its "advance"; at most its duration, less when it overlapped). Summed by kernel
name, the advances add up to the graph's span.

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, batch 1, a 128-token prompt then 30 steps), the
graphs replayed alone, 20 times each under torch.profiler: the decode graph, and the verify graphs of a chain of 4
(S3 K1 D4) and of 8 tokens (S7 K1 D8); PDL off, then on (`pdl.ENABLED`, engines built after the switch).

usage: python benchmarks/step_trace.py OUT_DIR [SHAPE=smollm2-135m]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from probe_script import OUT, stepped_engine  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from eaglespec.bench.random_model import random_drafter, random_model  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.transforms import prepare_for_inference  # noqa: E402
from eaglespec.layers import pdl  # noqa: E402

SHAPE = next((a for a in sys.argv[2:] if not a.startswith("--")), "smollm2-135m")
dev = torch.device("cuda")
REPS = 20
m = random_model(SHAPE, dev, torch.bfloat16, 0).model
prepare_for_inference(m, dev, None, None)
d = random_drafter(m.config, dev, torch.bfloat16, 0)
prepare_for_inference(d, dev, None, None)
results: list[dict] = []


def short(name: str) -> str:
    for key in ("add_norm_linear", "split_kernel", "combine_kernel", "rope_store", "gemv", "nvjet", "chunk_max",
                "row_max", "elementwise", "reduce_kernel", "indexSelect", "triton_"):
        if key in name:
            return key
    return name[:40]


def trace(graph: torch.cuda.CUDAGraph) -> dict:
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                      if ev.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[0])
    per = len(kernels) // REPS
    advance: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])  # advance, duration, calls
    overlapped = 0
    span = 0.0
    for r in range(REPS):
        ks = kernels[r * per:(r + 1) * per]
        span += ks[-1][1] - ks[0][0]
        prev_end = ks[0][0]
        for s, e, name in ks:
            a = advance[short(name)]
            a[0] += max(0.0, e - max(prev_end, s)) + max(0.0, s - prev_end)  # idle before it counts to it
            a[1] += e - s
            a[2] += 1
            overlapped += s < prev_end
            prev_end = max(prev_end, e)
    rows = sorted(advance.items(), key=lambda kv: -kv[1][0])
    return {"kernels": per, "span_us": round(span / REPS, 1), "overlapped_per_replay": round(overlapped / REPS, 1),
            "by_kernel": [{"name": k, "calls": round(v[2] / REPS, 1), "advance_us": round(v[0] / REPS, 1),
                           "duration_us": round(v[1] / REPS, 1)} for k, v in rows]}


for on in (False, True):
    pdl.ENABLED = on
    e = stepped_engine(m)
    g = e.runner.graphs.captured("decode", 1, e.runner.host_len[0] + 64, True)
    results.append({"pdl": on, "graph": "decode", **trace(g[0][1])})
    del e
    for spec in (SpecConfig(3, 1, 4), SpecConfig(7, 1, 8)):
        e = stepped_engine(m, d, spec)
        graphs = dict(e.runner.graphs.captured("spec", 1, e.runner.host_len[0] + 64, True))
        results.append({"pdl": on, "graph": f"verify S{spec.steps}K1D{spec.draft_tokens}", **trace(graphs["verify"])})
        del e
    torch.cuda.empty_cache()
pdl.ENABLED = None
(OUT / f"step_trace_{SHAPE}.json").write_text(json.dumps(results, indent=1))
for r in results:
    print(f"\n== {r['graph']}, PDL {'on' if r['pdl'] else 'off'}: {r['kernels']} kernels, span {r['span_us']} us, "
          f"{r['overlapped_per_replay']} start before the previous ends")
    for k in r["by_kernel"][:12]:
        print(f"  {k['name']:<28} {k['calls']:6.1f} calls  advance {k['advance_us']:8.1f} us  "
              f"(duration {k['duration_us']:8.1f})")
