"""Are repeated runs of one configuration identical? Run-to-run determinism of continuous MT-bench runs.

The bench's continuous path (bench.runs.ConfigRun: reserve, warm-up, prefill pass, then the timed `generate` of the
first MT-bench turns, 256 new tokens, greedy), per rows: plain decoding, then the `--spec auto` policy's shape (or
the `--spec` shape) with the shipped drafter, `--runs` times each, in one process. Greedy decoding of the same
prompts through the same engine settings must give the same answers every time, whatever the dtype (the schedule
follows from the tokens alone); a run that differs from the first run of its configuration points at a race on the
device. Per run: tok/s, the speedup over the same round's plain run, tau, and the answers equal to the first run of
that configuration and to the first plain run (the ones that differ: (index, first differing token)).

Session 26 found bf16 32-row speculative runs of one configuration differing (71/80 equal in one pair of runs).

Each run also records every step it read (`ModelRunner.collect`: the rows, the accepted draft counts, the committed
tokens). A run that differs from its configuration's first run is compared step by step: the first step whose
results differ had the same inputs in both runs (every step before it agreed), so it is where the device computed
something else. For that step and each row that differs the table gives both runs' accepted counts and tokens, and
which of them continue the plain run's answer for that request (in float32 the plain answer is the target's own
greedy text: a speculative step that commits other tokens broke losslessness there).

usage: python benchmarks/repeat_check.py OUT_DIR GGUF [--rows 32] [--dtype bfloat16|float32] [--runs 3]
       [--spec auto|S,K,D] [--limit 80] [--no-plain] [--device cuda]      (PYTHONPATH=src)
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
from eaglespec.spec_schedule import parse_spec
from eaglespec.engine.cuda_graphs import GraphCache
from eaglespec.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("gguf")
ap.add_argument("--rows", default="32")
ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
ap.add_argument("--runs", type=int, default=3)
ap.add_argument("--limit", type=int, default=80)
ap.add_argument("--no-plain", action="store_true", help="the speculative configuration only")
ap.add_argument("--spec", default="auto", help="the speculative shape: auto (the policy's) or S,K,D / a schedule")
ap.add_argument("--device", default="cuda",
                help="cuda (cpu: a check of the script itself, through the static graph path so that steps overlap)")
args = ap.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
dev = torch.device(args.device)
dtype = getattr(torch, args.dtype)
model = load_bench_model(args.gguf, None, dev, dtype)
target, tok = model.loaded.model, model.loaded.tokenizer
prompts = [encode(tok, i.first, True)[0] for i in load_prompt_set("mt-bench")[: args.limit]]
index = {tuple(p): i for i, p in enumerate(prompts)}  # prompt ids -> its index (MT-bench's turns are distinct)
params = SamplingParams(max_new_tokens=256, temperature=0.0)
pool = DrafterPool(target, dev, dtype)
auto = RunConfig.of("drafter", str(default_drafter_path()), AUTO if args.spec == AUTO else parse_spec(args.spec))
rows_out: list[dict] = []


def differ(outs: list[list[int]], ref: list[list[int]]) -> list[tuple[int, int]]:
    """(answer index, first differing token) of the answers that differ."""
    return [(i, next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
            for i, (a, b) in enumerate(zip(outs, ref)) if a != b]


def continues(plain: list[list[int]] | None, who: int | None, at: int | None, committed: list[int]) -> bool | None:
    """Whether tokens committed at answer position `at` of prompt `who` are the plain run's tokens there."""
    if plain is None or who is None or at is None:
        return None
    ref = plain[who][at : at + len(committed)]
    return committed[: len(ref)] == ref


def step_apart(steps: list[tuple], ref: list[tuple], plain: list[list[int]] | None) -> dict | None:
    """The first step whose results differ from the reference run's, and per differing row both runs' accepted
    count and tokens, and whether each run's committed tokens continue the plain answer (None: every step agrees)."""
    for n, (a, b) in enumerate(zip(steps, ref)):
        if a == b:
            continue
        rows = []
        for i, row in enumerate(a[0]):
            j = b[0].index(row) if row in b[0] else None
            ma = a[1][i] if a[1] is not None else None
            mb = b[1][j] if b[1] is not None and j is not None else None
            ta = a[2][i] if ma is None else a[2][i][: ma + 1]
            tb = (b[2][j] if mb is None else b[2][j][: mb + 1]) if j is not None else None
            if (ma, ta) == (mb, tb):
                continue
            who, at = (a[3][i], a[4][i]) if a[3] is not None else (None, None)
            as_list = [ta] if isinstance(ta, int) else ta
            bs_list = [tb] if isinstance(tb, int) else tb
            rows.append({"row": row, "prompt": who, "at": at, "m": [ma, mb], "tokens": [ta, tb],
                         "continues_plain": [continues(plain, who, at, as_list),
                                             continues(plain, who, at, bs_list) if tb is not None else None]})
        return {"step": n, "of": len(steps), "same_rows": a[0] == b[0], "differ": rows[:8]}
    return None


for bs in [int(x) for x in args.rows.split(",")]:
    configs = [] if args.no_plain else [RunConfig.plain()]
    resolved, _ = auto.resolved(target, dev.type, bs, params)
    configs += [resolved] if resolved is not None else []
    first: dict[str, list[list[int]]] = {}  # per configuration, this row count's first run: answers, steps read
    first_steps: dict[str, list[tuple]] = {}
    for run in range(args.runs):
        plain_tps = None
        for cfg in configs:
            drafter = pool.get(cfg.drafter) if cfg.speculative else None
            cr = ConfigRun(target, tok, cfg, bs, EngineConfig(), drafter, "continuous")
            if dev.type == "cpu":  # the graph protocol without graphs: overlapped steps, read by `collect`
                cr.engine.runner.graphs = GraphCache(cr.engine.runner, capture=False)
            cr.prepare([prompts], params)
            # per step read: (rows, accepted counts or None, tokens per row, prompt index per row, answer position
            # per row: the tokens the request held before this step's)
            steps: list[tuple] = []
            eng = cr.engine
            collect, step, now = eng.runner.collect, eng.step, {}

            def stepped(eng=eng, step=step, now=now):
                now["reqs"] = eng._pending[0] if eng._pending is not None else None  # the step this call reads
                return step()

            def traced(pending, collect=collect, steps=steps, now=now):
                m, toks = collect(pending)
                reqs = now.get("reqs") or []
                if len(reqs) == len(pending.rows):
                    who = [index.get(tuple(q.prompt_ids)) for q in reqs]
                    at = [len(q.output_ids) for q in reqs]
                else:
                    who = at = None
                steps.append((list(pending.rows), m, toks, who, at))
                return m, toks

            eng.step, eng.runner.collect = stepped, traced
            cr.run(prompts, params)
            rec = cr.record()
            name = "auto" if cfg.speculative else "plain"
            first.setdefault(name, rec.outputs)
            first_steps.setdefault(name, steps)
            plain_tps = rec.tok_per_s if not cfg.speculative else plain_tps
            row = {"rows": bs, "config": name, "shape": cfg.name, "run": run, "tok_s": round(rec.tok_per_s, 1),
                   "speedup": round(rec.tok_per_s / plain_tps, 3) if cfg.speculative and plain_tps else None,
                   "tau": round(rec.stats.accept_length_mean, 3) if rec.stats.verify_steps else None,
                   "seconds": round(rec.seconds, 4), "prefills": rec.steps.get("prefill", 0),
                   "phases": {k: round(v, 4) for k, v in rec.phases.items()},
                   "differ_first_run": differ(rec.outputs, first[name]),
                   "differ_plain": differ(rec.outputs, first["plain"]) if "plain" in first else None,
                   "steps_read": len(steps), "steps_mapped": sum(st[3] is not None for st in steps),
                   "first_step_apart": step_apart(steps, first_steps[name], first.get("plain"))}
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
for r in rows_out:
    if r["first_step_apart"] is not None:
        print(f"\n{r['rows']} rows, {r['config']}, run {r['run']}: first step apart from run 0:",
              json.dumps(r["first_step_apart"]))
