"""What a speculative step costs besides the target's verify, phase by phase and kernel by kernel, at 1, 8 and 32 rows.

The speedup over plain decoding is bounded by tau x (decode step) / (draft + verify + commit): the draft and commit
phases (the drafter's forwards, the tree's bookkeeping, the KV compaction) are costs only speculation pays. Random
SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL as the environment says), engines of 1, 8 and 32 rows
stepped 30 steps after 128-token prompts; for each (rows, spec): the three phase graphs replayed in order 50 times
(ms each, by CUDA events), then each phase graph replayed alone under torch.profiler (draft and greedy verify leave
the state as they found it; commit moves it on by one step per replay, which the 2,048-position cache allows), its
kernels charged by `probe_script.kernel_advance`; and the plain decode graph of the same rows for comparison.

usage: python benchmarks/spec_phase_trace.py OUT_DIR [--only=1|8|32] [--case=ROWS:S,K,D ...]
(`--case` replaces the default cases; rows 1, 8 and 32 only; `--draft-vocab=N`: the random drafter's head, default
random_model.DRAFT_VOCAB (the shipped drafter has 12,288); `--temperature=T`: sampled steps, T > 0, with
`--top-p=P` / `--top-k=K` filtering them)
"""

from __future__ import annotations

import json
import sys

from probe_script import (OUT, current_graphs, kernel_advance, option, print_advance, random_pair,  # noqa: E402
                          stepped_engine)

import torch  # noqa: E402

from eaglespec.bench.runs import shape_label  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.spec_schedule import parse_spec  # noqa: E402

TEMP = next((float(a.split("=")[1]) for a in sys.argv if a.startswith("--temperature=")), 0.0)
TOP_P = next((float(a.split("=")[1]) for a in sys.argv if a.startswith("--top-p=")), 1.0)
TOP_K = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--top-k=")), 0)
ONLY = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--only=")), None)
m, d = random_pair(draft_vocab=int(option("draft-vocab", "0")) or None)
results: list[dict] = []
cases = [(1, SpecConfig(3, 1, 4)), (1, SpecConfig(4, 4, 16)), (8, SpecConfig(4, 4, 16)), (8, SpecConfig(3, 1, 4)),
         (32, SpecConfig(3, 1, 4)), (32, SpecConfig(2, 1, 3))]
picked = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--case=")]
if picked:
    cases = [(int(c.split(":")[0]), parse_spec(c.split(":", 1)[1], "--case")) for c in picked]


def phase_ms(graphs: list, n: int = 50) -> dict:
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in graphs]
          for _ in range(n)]
    for _ in range(5):
        for _, g in graphs:
            g.replay()
    torch.cuda.synchronize()
    for i in range(n):
        for j, (_, g) in enumerate(graphs):
            ev[i][j][0].record()
            g.replay()
            ev[i][j][1].record()
    torch.cuda.synchronize()
    return {name: round(sum(ev[i][j][0].elapsed_time(ev[i][j][1]) for i in range(n)) / n, 4)
            for j, (name, _) in enumerate(graphs)}


for rows in (1, 8, 32):
    if ONLY is not None and rows != ONLY:
        continue
    e = stepped_engine(m, rows=rows, temperature=TEMP, top_p=TOP_P, top_k=TOP_K)
    g = current_graphs(e, "decode", rows, TEMP == 0)
    results.append({"rows": rows, "graph": "decode", "ms": phase_ms(g)[g[0][0]], **kernel_advance(g[0][1])})
    del e
    for r, spec in cases:
        if r != rows:
            continue
        e = stepped_engine(m, d, spec, rows=rows, temperature=TEMP, top_p=TOP_P, top_k=TOP_K)
        graphs = current_graphs(e, "spec", rows, TEMP == 0)
        ms = phase_ms(graphs)
        name = shape_label(spec)
        for gname, graph in graphs:
            results.append({"rows": rows, "graph": f"{name} {gname}", "ms": ms[gname], **kernel_advance(graph)})
        del e
    torch.cuda.empty_cache()
(OUT / "spec_phase_trace.json").write_text(json.dumps(results, indent=1))
for r in results:
    print_advance(f"{r['rows']} rows, {r['graph']}: {r['ms']} ms by events", r)
