"""Prefills beside the running rows' steps (EngineConfig.side_prefill_rows) against admissions that pause them.

The bench's continuous path (bench.runs.ConfigRun: reserve, warm-up, prefill pass, then the timed `generate` of the
first MT-bench turns, 256 new tokens, greedy), per rows and configuration (plain decoding, then the `--spec auto`
policy's shape with the shipped drafter), with side prefills off (0) and on (4), in the order given by `--order`
(repeat a value for several runs). Per run: tok/s, the speculative speedup over the same side setting's plain run,
tau, prefills (and how many beside a step); then, per rows and configuration, how many answers the two settings
share token for token, and per run how many equal the first plain run's with side prefills off (the answers
that differ: (index, first differing token)). In float32 every answer must be the same (the same rows' arithmetic; only the time a
request joins moves); in bf16 the batch buckets a step runs in change with admission timing and near-ties flip.

usage: python benchmarks/side_prefill_check.py OUT_DIR GGUF [--rows 8,32] [--dtype bfloat16|float32]
       [--order 0,4,4,0] [--limit 80] [--no-spec | --no-plain]            (PYTHONPATH=src; CUDA)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglespec.assets import default_drafter_path
from eaglespec.bench.datasets import encode, load_prompt_set
from eaglespec.bench.drafters import DrafterPool
from eaglespec.bench.runs import AUTO, ConfigRun, RunConfig
from eaglespec.bench.setup import load_bench_model
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("gguf")
ap.add_argument("--rows", default="8,32")
ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
ap.add_argument("--order", default="0,4,4,0", help="side_prefill_rows of each run, in order")
ap.add_argument("--limit", type=int, default=80)
ap.add_argument("--no-spec", action="store_true", help="plain decoding only")
ap.add_argument("--no-plain", action="store_true", help="the speculative configuration only")
ap.add_argument("--device", default="cuda", help="cuda (cpu: a check of the script itself; no side prefills)")
args = ap.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
dev = torch.device(args.device)
dtype = getattr(torch, args.dtype)
model = load_bench_model(args.gguf, None, dev, dtype)
target, tok = model.loaded.model, model.loaded.tokenizer
prompts = [encode(tok, i.first, True)[0] for i in load_prompt_set("mt-bench")[: args.limit]]
params = SamplingParams(max_new_tokens=256, temperature=0.0)
pool = DrafterPool(target, dev, dtype)
auto = RunConfig.of("drafter", str(default_drafter_path()), AUTO)
rows_out: list[dict] = []
answers: dict[tuple, list[list[int]]] = {}  # (rows, config, side) -> the first run's answers

for bs in [int(x) for x in args.rows.split(",")]:
    configs = [] if args.no_plain else [RunConfig.plain()]
    if not args.no_spec:
        resolved, why = auto.resolved(target, dev.type, bs, 0.0)
        configs += [resolved] if resolved is not None else []
    for side in [int(x) for x in args.order.split(",")]:
        plain_tps = None
        for cfg in configs:
            drafter = pool.get(cfg.drafter) if cfg.speculative else None
            cr = ConfigRun(target, tok, cfg, bs, EngineConfig(side_prefill_rows=side), drafter, "continuous")
            cr.reserve(prompts, params)
            cr.warmup(prompts, params, 1)
            cr.prefill_pass([prompts], params)
            cr.run(prompts, params)
            rec = cr.record()
            name = "plain" if not cfg.speculative else "auto"
            same = sum(a == b for a, b in zip(rec.outputs, answers.get((bs, name, side), rec.outputs)))
            answers.setdefault((bs, name, side), rec.outputs)
            ref = answers.get((bs, "plain", 0), answers[(bs, name, side)])  # plain decoding's, else the first run's
            diff = [i for i, (a, b) in enumerate(zip(rec.outputs, ref)) if a != b]
            first = [next((j for j, (x, y) in enumerate(zip(rec.outputs[i], ref[i])) if x != y),
                          min(len(rec.outputs[i]), len(ref[i]))) for i in diff]
            plain_tps = rec.tok_per_s if not cfg.speculative else plain_tps
            row = {"rows": bs, "config": name, "shape": cfg.name, "side": side, "tok_s": round(rec.tok_per_s, 1),
                   "speedup": round(rec.tok_per_s / plain_tps, 3) if cfg.speculative and plain_tps else None,
                   "tau": round(rec.stats.accept_length_mean, 3) if rec.stats.verify_steps else None,
                   "seconds": round(rec.seconds, 4), "prefills": rec.steps.get("prefill", 0),
                   "beside": rec.steps.get("prefill beside", 0), "phases": {k: round(v, 4) for k, v in
                                                                          rec.phases.items()},
                   "equal_to_plain": len(rec.outputs) - len(diff), "differ": list(zip(diff, first)),
                   "equal_to_first_run": same}
            print(json.dumps(row), flush=True)
            rows_out.append(row)
            (out / "side_prefill_check.json").write_text(json.dumps(rows_out, indent=1))
            cr.close()
            del cr

print(f"\n{args.dtype}, MT-bench 1-{args.limit}, 256 new tokens, continuous batching")
print("| rows | config | side rows | tok/s | speedup | tau | seconds | prefills (beside) | equal to plain (side 0) "
      "| equal to this setting's first run |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows_out:
    sp = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
    print(f"| {r['rows']} | {r['config']} | {r['side']} | {r['tok_s']:,.1f} | {sp} | {r['tau'] or '-'} | "
          f"{r['seconds']} | {r['prefills']} ({r['beside']}) | {r['equal_to_plain']} {r['differ'][:4]} | "
          f"{r['equal_to_first_run']} |")
print("\n| rows | config | answers equal, side 4 vs side 0 | spec vs plain (side 0 / side 4) |")
print("| ---: | --- | ---: | ---: |")
for (bs, name, side), outs in answers.items():
    if side != 0 or (bs, name, 4) not in answers:
        continue
    other = answers[(bs, name, 4)]
    same = sum(a == b for a, b in zip(outs, other))
    vs = "-"
    if name == "auto" and (bs, "plain", 0) in answers and (bs, "plain", 4) in answers:
        v0 = sum(a == b for a, b in zip(outs, answers[(bs, "plain", 0)]))
        v4 = sum(a == b for a, b in zip(other, answers[(bs, "plain", 4)]))
        vs = f"{v0}/{len(outs)} / {v4}/{len(outs)}"
    print(f"| {bs} | {name} | {same}/{len(outs)} | {vs} |")
