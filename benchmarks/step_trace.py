"""Where does a step's time go, kernel by kernel, with and without programmatic dependent launch (layers/pdl.py)?

A profiler's per-kernel durations stop adding up once kernels overlap: with PDL a kernel starts while the one before
it runs and its duration includes its wait. Here each kernel is charged what it adds to the step: the time from the
previous kernel's end to its own end (its "advance"; at most its duration, less when it overlapped). Summed by kernel
name, the advances add up to the graph's span.

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, batch 1, a 128-token prompt then 30 steps), the
graphs replayed alone, 20 times each under torch.profiler: the decode graph, and the verify graphs of a chain of 4
(S3 K1 D4) and of 8 tokens (S7 K1 D8); PDL off, then on (`pdl.ENABLED`, engines built after the switch).

usage: python benchmarks/step_trace.py OUT_DIR [SHAPE=smollm2-135m] [--pdl-only]   (--pdl-only: PDL on only, for
large shapes whose engines take long to build; the JSON is rewritten after each graph)
"""

from __future__ import annotations

import json
import sys

from probe_script import OUT, kernel_advance, print_advance, random_pair, stepped_engine  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import pdl  # noqa: E402

SHAPE = next((a for a in sys.argv[2:] if not a.startswith("--")), "smollm2-135m")
m, d = random_pair(SHAPE)
results: list[dict] = []


for on in ((True,) if "--pdl-only" in sys.argv else (False, True)):
    pdl.ENABLED = on
    e = stepped_engine(m)
    g = e.runner.graphs.captured("decode", 1, e.runner.host_len[0] + 64, True)
    results.append({"pdl": on, "graph": "decode", **kernel_advance(g[0][1])})
    (OUT / f"step_trace_{SHAPE}.json").write_text(json.dumps(results, indent=1))
    del e
    for spec in (SpecConfig(3, 1, 4), SpecConfig(7, 1, 8)):
        e = stepped_engine(m, d, spec)
        graphs = dict(e.runner.graphs.captured("spec", 1, e.runner.host_len[0] + 64, True))
        results.append({"pdl": on, "graph": f"verify S{spec.steps}K1D{spec.draft_tokens}", **kernel_advance(graphs["verify"])})
        (OUT / f"step_trace_{SHAPE}.json").write_text(json.dumps(results, indent=1))
        del e
    torch.cuda.empty_cache()
pdl.ENABLED = None
(OUT / f"step_trace_{SHAPE}.json").write_text(json.dumps(results, indent=1))
for r in results:
    print_advance(f"{r['graph']}, PDL {'on' if r['pdl'] else 'off'}", r, 12)
