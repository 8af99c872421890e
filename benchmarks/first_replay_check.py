"""Does a CUDA graph's first replay cost more than its later ones? CUDA uploads an instantiated graph to the device on
its first launch unless it was uploaded before (cudaGraphUpload). The engine captures graphs per (kind, batch
bucket, length bucket) up front, so a run replays some of them first while it is timed or serving (a length bucket
reached late, a batch bucket that the run's tail drains through).

Random SmolLM2-135M weights and a random drafter (bf16, probe_script.stepped_engine: 128-token prompts, 5 steps).
Per engine (plain decoding and S5 K2 D8 at 32 rows, S3 K1 D4 at 1 row): the graphs of the 1,024-position length
bucket, captured now and never replayed, and the one-row prefill graphs of 256 and 512 prompt tokens. Each graph is
replayed three times, each replay after a device synchronisation, and timed on the host (the `replay()` call, then
to the end of the synchronisation) and on the device (CUDA events around the replay). Session 27 (H200): the first
replay cost 0.1-0.6 ms more than later ones (docs/benchmarks.md); benchmarks/graph_first_use.py counts how many graphs
a timed MT-bench run replays first (few: the engine captures up front, and the bench's warm-up replays most).

usage: python benchmarks/first_replay_check.py OUT_DIR [--cpu]       (PYTHONPATH=src; --cpu checks the script only)
"""

from __future__ import annotations

import time

from probe_script import CPU, Emitter, random_pair, stepped_engine  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402

emit = Emitter("first_replay_check.json")
m, d = random_pair()
REPLAYS = 3


def timed(fn) -> dict:
    """Host us of the call, host us to the end of the work, device us between events (one replay)."""
    if CPU:
        t = time.perf_counter()
        fn()
        return {"call_us": round(1e6 * (time.perf_counter() - t), 1), "done_us": None, "device_us": None}
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    a.record()
    fn()
    b.record()
    call = time.perf_counter() - t
    torch.cuda.synchronize()
    done = time.perf_counter() - t
    return {"call_us": round(1e6 * call, 1), "done_us": round(1e6 * done, 1),
            "device_us": round(1e3 * a.elapsed_time(b), 1)}


totals: dict[str, float] = {}
for rows, spec in ((32, None), (32, SpecConfig(5, 2, 8)), (1, SpecConfig(3, 1, 4))):
    e = stepped_engine(m, d if spec else None, spec, steps=5, rows=rows)
    graphs = e.runner.graphs
    kind = "spec" if spec else "decode"
    label = f"{rows} rows {'S%d K%d D%d' % (spec.steps, spec.topk, spec.draft_tokens) if spec else 'plain'}"
    cases = []
    if graphs is not None:
        phases = graphs.captured(kind, rows, 700, True)  # the 1,024-position bucket: captured now, not yet replayed
        cases += [(f"{kind} {name}", g.replay) for name, g in phases]
    for n in (200, 400):  # one-row prefill graphs of the 256 and 512 buckets (the probe's prompts took 128)
        if graphs is None:
            cases.append((f"prefill {n} tokens", lambda n=n, e=e: e.runner.prefill([0], [list(range(1, n + 1))], True)))
            continue
        key = ("prefill", 1, graphs.prefill_bucket(n), True, False)
        graphs._prefill_inputs(key, [list(range(1, n + 1))], [0])  # into row 0 (a probe: its decode is random anyway)
        graphs._capture(key)  # captured now, replayed first below
        cases.append((f"prefill {n} tokens", graphs.graphs[key][0][1].replay))
    for what, fn in cases:
        runs = [timed(fn) for _ in range(REPLAYS)]
        row = {"engine": label, "graph": what, "replays": runs}
        if not CPU:
            row["first_extra_done_us"] = round(runs[0]["done_us"] - min(r["done_us"] for r in runs[1:]), 1)
            totals[label] = totals.get(label, 0.0) + row["first_extra_done_us"]
        emit(row)
    del e

print("\n| engine | graph | first: call / done / device us | second | third |")
print("| --- | --- | --- | --- | --- |")
for r in emit.rows:
    cells = [f"{x['call_us']} / {x['done_us']} / {x['device_us']}" for x in r["replays"]]
    print(f"| {r['engine']} | {r['graph']} | " + " | ".join(cells) + " |")
for k, v in totals.items():
    print(f"{k}: the first replays cost {v:.1f} us more than later ones, summed over its graphs")

