"""Which CUDA graphs does a timed continuous MT-bench run replay for the first time? (CUDA uploads a graph on its
first launch, 0.1-0.6 ms on the H200: benchmarks/first_replay_check.py.)

The bench's continuous path (bench.runs.ConfigRun.prepare, then the timed `generate` of the first MT-bench turns, 256
new tokens, greedy) at `--rows`, for plain decoding and the `--spec` shape with the shipped drafter. The graph keys
((kind, batch bucket, length bucket, greedy) of the steps, (prefill, rows, prompt bucket, greedy) of the prefills)
that the untimed part used are set apart from those the timed run uses first. On the CPU the static graph path runs
without graphs (`GraphCache(capture=False)`), which takes the same keys, so this needs no GPU: an engine captures
every step key up front (reserve / warmup), but each key below is replayed first inside the timed run.

usage: python benchmarks/graph_first_use.py OUT_DIR GGUF [--rows 32] [--spec auto|S,K,D|SCHEDULE] [--limit 80]
       [--device cpu] [--dtype float32] [--no-plain]                                (PYTHONPATH=src)
(on the CPU `auto` decodes plainly past one row: give the H200's schedule, 1:3,1,4/8:4,4,8/16:3,1,4/32:5,2,8)
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from eaglespec.assets import default_drafter_path
from eaglespec.bench.datasets import encode, load_prompt_set
from eaglespec.bench.drafters import DrafterPool
from eaglespec.bench.runs import AUTO, ConfigRun, RunConfig
from eaglespec.bench.setup import load_bench_model
from eaglespec.config import EngineConfig
from eaglespec.spec_schedule import parse_spec
from eaglespec.engine.cuda_graphs import GraphCache
from eaglespec.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("gguf")
ap.add_argument("--rows", type=int, default=32)
ap.add_argument("--spec", default="auto")
ap.add_argument("--limit", type=int, default=80)
ap.add_argument("--device", default="cpu")
ap.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
ap.add_argument("--no-plain", action="store_true", help="the speculative configuration only")
args = ap.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
dev = torch.device(args.device)
model = load_bench_model(args.gguf, None, dev, getattr(torch, args.dtype))
target, tok = model.loaded.model, model.loaded.tokenizer
prompts = [encode(tok, i.first, True)[0] for i in load_prompt_set("mt-bench")[: args.limit]]
params = SamplingParams(max_new_tokens=256, temperature=0.0)
pool = DrafterPool(target, dev, getattr(torch, args.dtype))
spec = RunConfig.of("drafter", str(default_drafter_path()), AUTO if args.spec == AUTO else parse_spec(args.spec))
resolved, _ = spec.resolved(target, dev.type, args.rows, params)
rows_out = []
if resolved is None:  # `auto` decodes plainly here (the CPU past one row): name the shape, e.g. the H200's schedule
    raise SystemExit(f"--spec {args.spec} decodes plainly at {args.rows} rows on {dev.type}; give S,K,D or a schedule")
for cfg in ([] if args.no_plain else [RunConfig.plain()]) + [resolved]:
    drafter = pool.get(cfg.drafter) if cfg.speculative else None
    cr = ConfigRun(target, tok, cfg, args.rows, EngineConfig(), drafter, "continuous")
    runner = cr.engine.runner
    if dev.type == "cpu":
        runner.graphs = GraphCache(runner, capture=False)
    graphs = runner.graphs
    used: Counter = Counter()  # key -> replays
    run_step, run_prefill = graphs.run, graphs.prefill

    def counted_run(kind, n_rows, longest, greedy, lp=None, graphs=graphs, used=used, run_step=run_step):
        used[graphs.key(kind, n_rows, longest, greedy, lp)] += 1
        return run_step(kind, n_rows, longest, greedy, lp)

    def counted_prefill(rows, prompts_, greedy, lp=None, graphs=graphs, used=used, run_prefill=run_prefill):
        used[("prefill", len(rows), graphs.prefill_bucket(max(len(p) for p in prompts_), len(rows)), greedy,
              lp)] += 1
        return run_prefill(rows, prompts_, greedy, lp)

    graphs.run, graphs.prefill = counted_run, counted_prefill
    cr.prepare([prompts], params)
    used_before = Counter(used)  # the keys replayed before the timed run, and how often
    cr.run(prompts, params)
    first = sorted((k for k in used if k not in used_before), key=str)
    row = {"config": cfg.name, "rows": args.rows, "keys_untimed": len(used_before), "keys_timed": len(used),
           "first_in_timed_run": [list(map(str, k)) for k in first],
           "replays_of_those": sum(used[k] for k in first),
           "timed_replays": sum(used.values()) - sum(used_before.values())}
    print(json.dumps(row), flush=True)
    rows_out.append(row)
    (out / "graph_first_use.json").write_text(json.dumps(rows_out, indent=1))
    cr.close()
    del cr
for r in rows_out:
    kinds = Counter(k[0] for k in r["first_in_timed_run"])
    print(f"{r['config']} at {r['rows']} rows: {len(r['first_in_timed_run'])} graph keys first replayed in the timed "
          f"run ({dict(kinds)}) of {r['keys_timed']} it used; {r['timed_replays']} replays in all")
