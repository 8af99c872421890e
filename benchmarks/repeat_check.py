"""Are repeated runs of one configuration identical? Run-to-run determinism of continuous MT-bench runs.

The bench's continuous path (bench.runs.ConfigRun: reserve, warm-up, prefill pass, then the timed `generate` of the
first MT-bench turns, 256 new tokens, greedy), per rows: plain decoding, then the `--spec auto` policy's shape with
the shipped drafter, `--runs` times each, in one process. Greedy decoding of the same prompts through the same
engine settings must give the same answers every time, whatever the dtype (the schedule follows from the tokens
alone); a run that differs from the first run of its configuration points at a race on the device. Per run: tok/s,
the speedup over the same round's plain run, tau, and the answers equal to the first run of that configuration and
to the first plain run (the ones that differ: (index, first differing token)).

Session 26 found bf16 32-row speculative runs of one configuration differing (71/80 equal in one pair of runs).

usage: python benchmarks/repeat_check.py OUT_DIR GGUF [--rows 32] [--dtype bfloat16|float32] [--runs 3]
       [--limit 80] [--no-plain] [--device cuda]                         (PYTHONPATH=src)
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
ap.add_argument("--rows", default="32")
ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--limit", type=int, default=80)
ap.add_argument("--no-plain", action="store_true", help="the speculative configuration only")
ap.add_argument("--device", default="cuda", help="cuda (cpu: a check of the script itself)")
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


def differ(outs: list[list[int]], ref: list[list[int]]) -> list[tuple[int, int]]:
    """(answer index, first differing token) of the answers that differ."""
    return [(i, next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
            for i, (a, b) in enumerate(zip(outs, ref)) if a != b]


for bs in [int(x) for x in args.rows.split(",")]:
    configs = [] if args.no_plain else [RunConfig.plain()]
    resolved, _ = auto.resolved(target, dev.type, bs, 0.0)
    configs += [resolved] if resolved is not None else []
    first: dict[str, list[list[int]]] = {}
    for run in range(args.runs):
        plain_tps = None
        for cfg in configs:
            drafter = pool.get(cfg.drafter) if cfg.speculative else None
            cr = ConfigRun(target, tok, cfg, bs, EngineConfig(), drafter, "continuous")
            cr.reserve(prompts, params)
            cr.warmup(prompts, params, 1)
            cr.prefill_pass([prompts], params)
            cr.run(prompts, params)
            rec = cr.record()
            name = "auto" if cfg.speculative else "plain"
            first.setdefault(name, rec.outputs)
            plain_tps = rec.tok_per_s if not cfg.speculative else plain_tps
            row = {"rows": bs, "config": name, "shape": cfg.name, "run": run, "tok_s": round(rec.tok_per_s, 1),
                   "speedup": round(rec.tok_per_s / plain_tps, 3) if cfg.speculative and plain_tps else None,
                   "tau": round(rec.stats.accept_length_mean, 3) if rec.stats.verify_steps else None,
                   "seconds": round(rec.seconds, 4), "prefills": rec.steps.get("prefill", 0),
                   "phases": {k: round(v, 4) for k, v in rec.phases.items()},
                   "differ_first_run": differ(rec.outputs, first[name]),
                   "differ_plain": differ(rec.outputs, first["plain"]) if "plain" in first else None}
            print(json.dumps(row), flush=True)
            rows_out.append(row)
            (out / "repeat_check.json").write_text(json.dumps(rows_out, indent=1))
            cr.close()
            del cr

n = len(prompts)
print(f"\n{args.dtype}, MT-bench 1-{args.limit}, 256 new tokens, continuous batching")
print("| rows | config | run | tok/s | speedup | tau | equal to its first run | equal to plain's first run |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows_out:
    sp = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
    same = f"{n - len(r['differ_first_run'])}/{n} {r['differ_first_run'][:4]}"
    plain = f"{n - len(r['differ_plain'])}/{n}" if r["differ_plain"] is not None else "-"
    print(f"| {r['rows']} | {r['config']} | {r['run']} | {r['tok_s']:,.1f} | {sp} | {r['tau'] or '-'} | {same} | "
          f"{plain} |")
