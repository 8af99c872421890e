"""Where does a continuous-batching MT-bench run spend its time, step by step, on the device and on the host?

The bench's own path (bench.runs.ConfigRun: reserve, warm-up, prefill pass, then the timed `generate` of the first
80 MT-bench turns, 256 new tokens, bf16, continuous batching). Every graph step launch (`GraphCache.run`) and every
prefill (`ModelRunner.prefill`) is bracketed by CUDA events, so the run's wall time splits into
- `steps_s` / `prefills_s`: the device's time in the launched steps (at the lengths the run reached) and prefills;
- `idle_s`: the gaps between them, when the device had nothing queued, split by what came next (`idle_before`:
  a step, or a prefill) and bounded by the first and last event;
and every `engine.step()` call is timed on the host and classed by what it did (P: a prefill enqueued, L: a step
launched, R: a step read), e.g. "PLR" for an admission overlapped with the step in flight.
Per graph key (kind, batch bucket, length bucket): launches and mean device ms.
Each gap is also classed by what the host did between the two launches around it (`gaps_by_host`): a signature of
the markers in between, runs compressed ("|" a `step()` call began, "R" a step read, "r" a prefill's first tokens
read, "M" a row moved (a join or a compaction: its copies are enqueued, outside the brackets), "X" a row released),
with the count, total and largest gap of each signature: which host work the device waits for.

`--sync-debug` also runs each timed run under `torch.cuda.set_sync_debug_mode("warn")` and reports every call site
that synchronised the host with the device (`syncs`: "file:line: message" -> count), expected empty but for
documented reads; the run's timing is then not representative.

usage: python benchmarks/continuous_gap.py OUT_DIR GGUF [--rows 32,8] [--spec 3,1,4 --spec 5,2,8] [--limit N]
       [--no-timer]  (the bench turns the phase timer on; --no-timer measures without its events) [--sync-debug]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import torch

from eaglespec.assets import default_drafter_path
from eaglespec.bench.datasets import encode, load_prompt_set
from eaglespec.bench.drafters import DrafterPool
from eaglespec.bench.runs import ConfigRun, RunConfig
from eaglespec.bench.setup import load_bench_model
from eaglespec.config import EngineConfig
from eaglespec.spec_schedule import parse_spec
from eaglespec.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("gguf")
ap.add_argument("--rows", default="32,8")
ap.add_argument("--spec", action="append", default=[])
ap.add_argument("--limit", type=int, default=80)
ap.add_argument("--no-timer", action="store_true")
ap.add_argument("--sync-debug", action="store_true")
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


def squash(ms: list[str]) -> str:
    """["|", "M", "M", "R"] -> "|M2R": runs of one marker as the marker and its count."""
    out: list[str] = []
    for m in ms:
        if out and out[-1][0] == m:
            out[-1] = m + str(int(out[-1][1:] or 1) + 1)
        else:
            out.append(m)
    return "".join(out)


for bs in [int(x) for x in args.rows.split(",")]:
    for cfg in configs:
        drafter = pool.get(cfg.drafter) if cfg.speculative else None
        cr = ConfigRun(target, tok, cfg, bs, EngineConfig(), drafter, "continuous")
        cr.timer.enabled = not args.no_timer
        cr.prepare([prompts], params)
        e = cr.engine
        graphs, runner = e.runner.graphs, e.runner
        units: list[tuple] = []  # (key, start event, end event) in launch order
        calls: dict[str, list[float]] = defaultdict(list)
        marks: list[str] = []
        trail: list[str] = []  # host markers since the last launch (the gap signature of the next unit)
        sigs: list[str] = []  # per unit: the markers between the previous unit's launch and its own
        orig_run, orig_prefill, orig_collect, orig_step = graphs.run, runner.prefill, runner.collect, e.step
        orig_move, orig_release, orig_collect_prefill = runner.move_row, runner.release, runner.collect_prefill

        def bracket(key, fn, *a):
            s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s0.record()
            sigs.append(squash(trail))
            trail.clear()
            out = fn(*a)
            s1.record()
            units.append((key, s0, s1))
            return out

        def marker(m, fn):
            def wrapped(*a):
                trail.append(m)
                return fn(*a)
            return wrapped

        def run(kind, n_rows, longest, greedy, lp=None):
            marks.append("L")
            return bracket(graphs.key(kind, n_rows, longest, greedy, lp), orig_run, kind, n_rows, longest, greedy, lp)

        def prefill(rows, ps, greedy, mm=None, lp=None):
            marks.append("P")
            return bracket(("prefill", len(rows), max(len(p) for p in ps)), orig_prefill, rows, ps, greedy, mm, lp)

        def collect(p):
            marks.append("R")
            trail.append("R")
            return orig_collect(p)

        def step():
            n = len(marks)
            trail.append("|")
            t = time.perf_counter()
            r = orig_step()
            calls["".join(marks[n:]) or "-"].append(time.perf_counter() - t)
            return r

        graphs.run, runner.prefill, runner.collect, e.step = run, prefill, collect, step
        runner.move_row, runner.release = marker("M", orig_move), marker("X", orig_release)
        runner.collect_prefill = marker("r", orig_collect_prefill)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn" if args.sync_debug else "default")
            try:
                cr.run(prompts, params)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = Counter(f"{Path(w.filename).name}:{w.lineno}: {str(w.message).splitlines()[0][:90]}" for w in caught
                        if "synchroniz" in str(w.message).lower())
        rec = cr.record()
        del graphs.run, runner.prefill, runner.collect, e.step, runner.move_row, runner.release
        del runner.collect_prefill
        torch.cuda.synchronize()
        busy = defaultdict(float)
        per_key = defaultdict(lambda: [0, 0.0])
        idle = defaultdict(float)
        prev_end = None
        by_sig: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # count, total ms, largest ms
        for (key, s0, s1), sig in zip(units, sigs):
            ms = s0.elapsed_time(s1)
            what = "prefill" if key[0] == "prefill" else "step"
            busy[what] += ms
            k = f"{key[0]} R{key[1]} T{key[2]}" if key[0] == "prefill" else f"{key[0]} B{key[1]} L{key[2]}"
            per_key[k][0] += 1
            per_key[k][1] += ms
            if prev_end is not None:
                gap = max(0.0, prev_end.elapsed_time(s0))
                idle[what] += gap
                g = by_sig[f"{sig} -> {'P' if what == 'prefill' else 'L'}"]
                g[0], g[1], g[2] = g[0] + 1, g[1] + gap, max(g[2], gap)
            prev_end = s1
        span = units[0][1].elapsed_time(units[-1][2]) / 1e3
        n_steps = sum(1 for k, _, _ in units if k[0] != "prefill")
        row = {"rows": bs, "config": cfg.name, "timer": not args.no_timer, "wall_s": round(rec.seconds, 4),
               "tok_s": round(rec.tok_per_s, 1), "tau": round(rec.stats.accept_length_mean, 3)
               if rec.stats.verify_steps else None, "steps": n_steps, "prefills": len(units) - n_steps,
               "span_s": round(span, 4), "steps_s": round(busy["step"] / 1e3, 4),
               "prefills_s": round(busy["prefill"] / 1e3, 4),
               "idle_s": round((idle["step"] + idle["prefill"]) / 1e3, 4),
               "idle_before": {k: round(v / 1e3, 4) for k, v in idle.items()},
               "calls": {c: [len(v), round(sum(v), 4)] for c, v in sorted(calls.items())},
               "per_key": {k: [v[0], round(v[1] / v[0], 4)] for k, v in sorted(per_key.items())},
               "syncs": dict(syncs.most_common()),
               "gaps_by_host": {k: [v[0], round(v[1], 3), round(v[2], 3)]
                                for k, v in sorted(by_sig.items(), key=lambda kv: -kv[1][1])}}
        print(json.dumps(row), flush=True)
        rows_out.append(row)
        (out / "continuous_gap.json").write_text(json.dumps(rows_out, indent=1))
        cr.close()
        del cr, e
        torch.cuda.empty_cache()

print("\n| rows | config | tok/s | tau | wall s | device span s | steps s | prefills s | idle s | steps | prefills |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for r in rows_out:
    print(f"| {r['rows']} | {r['config']} | {r['tok_s']} | {r['tau']} | {r['wall_s']} | {r['span_s']} | "
          f"{r['steps_s']} | {r['prefills_s']} | {r['idle_s']} | {r['steps']} | {r['prefills']} |")
for r in rows_out:
    if args.sync_debug:
        print(f"\n{r['rows']} rows, {r['config']}: {sum(r['syncs'].values())} synchronising calls")
        for site, n in r["syncs"].items():
            print(f"  {n:5d}  {site}")
    print(f"\n{r['rows']} rows, {r['config']}: gaps by the host's work before the launch (count, total ms, largest ms)")
    for k, v in list(r["gaps_by_host"].items())[:12]:
        print(f"  {k:>24}  {v[0]:5d}  {v[1]:8.3f}  {v[2]:7.3f}")
sys.stdout.flush()
