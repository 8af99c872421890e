"""Where does a continuous-batching MT-bench run spend its time, step by step, against the graphs it replays?

The bench's own path (bench.runs.ConfigRun: reserve, warm-up, prefill pass, then the timed `generate` of all 80
MT-bench first turns, 256 new tokens, bf16, continuous batching) with every `engine.step()` call timed on the host and
classified, and every graph launch recorded by its key (kind, batch bucket, length bucket). Afterwards each key's
graphs are replayed alone, so the run's wall time splits into:
- `graphs_s`: the sum over launched steps of their graphs' replay time (what the GPU needs at the lengths reached);
- the step calls by class: `prefill` (an admission: the pending step was read before, nothing in flight),
  `read_only` (a pending step read without launching the next: admissions coming), `launch_read` (steady overlap),
  `first_launch` (a launch with nothing pending: after a prefill);
- `prefill_graphs_s`: the prefill graphs' replay time (their keys: rows, length bucket).
Per length bucket of the speculative steps: count and replay ms (longer rows make attention and the mask dearer).

usage: python benchmarks/continuous_gap.py OUT_DIR GGUF [--rows 32,8] [--spec 3,1,4 --spec 5,2,8] [--limit N]
       [--no-timer]  (the bench turns the phase timer on; --no-timer measures without its events)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from eaglespec.assets import default_drafter_path
from eaglespec.bench.datasets import encode, load_prompt_set
from eaglespec.bench.drafters import DrafterPool
from eaglespec.bench.runs import ConfigRun, RunConfig
from eaglespec.bench.setup import load_bench_model, parse_spec
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("gguf")
ap.add_argument("--rows", default="32,8")
ap.add_argument("--spec", action="append", default=[])
ap.add_argument("--limit", type=int, default=80)
ap.add_argument("--no-timer", action="store_true")
ap.add_argument("--draft", default=str(default_drafter_path()))
args = ap.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
model = load_bench_model(args.gguf, None, dev, torch.bfloat16)
target, tok = model.loaded.model, model.loaded.tokenizer
items = load_prompt_set("mt-bench")[: args.limit]
prompts = [encode(tok, i.first, True)[0] for i in items]
params = SamplingParams(max_new_tokens=256, temperature=0.0)
pool = DrafterPool(target, dev, torch.bfloat16)
specs = [parse_spec(s) for s in (args.spec or ["3,1,4", "5,2,8"])]
configs = [RunConfig.plain()] + [RunConfig.of("drafter", args.draft, s) for s in specs]
rows_out = []


def replay_ms(graphs, n=50, warmup=5):
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


for bs in [int(x) for x in args.rows.split(",")]:
    for cfg in configs:
        drafter = pool.get(cfg.drafter) if cfg.speculative else None
        cr = ConfigRun(target, tok, cfg, bs, EngineConfig(), drafter, "continuous")
        cr.timer.enabled = not args.no_timer
        cr.reserve(prompts, params)
        cr.warmup(prompts, params, 1)
        cr.prefill_pass([prompts], params)
        e = cr.engine
        graphs = e.runner.graphs
        launches: list[tuple] = []
        calls: dict[str, list[float]] = defaultdict(list)
        orig_run, orig_prefill, orig_step = graphs.run, graphs.prefill, e.step

        def run(kind, n_rows, longest, greedy, _o=orig_run):
            launches.append(graphs.key(kind, n_rows, longest, greedy))
            return _o(kind, n_rows, longest, greedy)

        def prefill(rows, ps, greedy, _o=orig_prefill):
            Tb = graphs.prefill_bucket(max(len(p) for p in ps), len(rows))
            launches.append(("prefill", len(rows), Tb, greedy))
            return _o(rows, ps, greedy)

        def step(_o=orig_step):
            pending, may = e._pending is not None, e.scheduler.may_admit()
            cls = ("read_only" if may else "launch_read") if pending else ("prefill" if may else "first_launch")
            t = time.perf_counter()
            r = _o()
            calls[cls].append(time.perf_counter() - t)
            return r

        graphs.run, graphs.prefill, e.step = run, prefill, step
        torch.cuda.synchronize()
        cr.run(prompts, params)
        rec = cr.record()
        graphs.run, graphs.prefill, e.step = orig_run, orig_prefill, orig_step
        keys = Counter(launches)
        # every row inert first (length 0, inactive): replays then write only near position 0; prefill graphs last
        # (a prefill replay makes its static rows active again)
        e.runner.active.zero_()
        e.runner.seq_len.zero_()
        order = sorted((k for k in keys if k in graphs.graphs), key=lambda k: k[0] == "prefill")
        ms = {k: replay_ms([g for _, g in graphs.graphs[k]]) for k in order}
        graphs_s = sum(keys[k] * ms[k] for k in ms if k[0] != "prefill") / 1e3
        prefill_s = sum(keys[k] * ms[k] for k in ms if k[0] == "prefill") / 1e3
        by_len = defaultdict(lambda: [0, 0.0])
        for k in ms:
            if k[0] != "prefill":
                by_len[f"{k[0]} B{k[1]} L{k[2]}"][0] += keys[k]
                by_len[f"{k[0]} B{k[1]} L{k[2]}"][1] = round(ms[k], 4)
        steps = sum(keys[k] for k in keys if k[0] != "prefill")
        row = {"rows": bs, "config": cfg.name, "timer": not args.no_timer, "wall_s": round(rec.seconds, 4),
               "tok_s": round(rec.tok_per_s, 1), "tau": round(rec.stats.accept_length_mean, 3)
               if rec.stats.verify_steps else None, "steps": steps, "graphs_s": round(graphs_s, 4),
               "prefill_graphs_s": round(prefill_s, 4), "prefills": sum(keys[k] for k in keys if k[0] == "prefill"),
               "outside_s": round(rec.seconds - graphs_s - prefill_s, 4),
               "calls": {c: [len(v), round(sum(v), 4)] for c, v in calls.items()},
               "by_bucket": dict(by_len),
               "prefill_keys": {f"R{k[1]} T{k[2]}": [keys[k], round(ms[k], 3)] for k in ms if k[0] == "prefill"}}
        print(json.dumps(row), flush=True)
        rows_out.append(row)
        (out / "continuous_gap.json").write_text(json.dumps(rows_out, indent=1))
        cr.close()
        del cr, e
        torch.cuda.empty_cache()

print("\n| rows | config | tok/s | tau | wall s | graphs s | prefill graphs s | outside s | steps | prefills |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows_out:
    print(f"| {r['rows']} | {r['config']} | {r['tok_s']} | {r['tau']} | {r['wall_s']} | {r['graphs_s']} | "
          f"{r['prefill_graphs_s']} | {r['outside_s']} | {r['steps']} | {r['prefills']} |")
sys.stdout.flush()
