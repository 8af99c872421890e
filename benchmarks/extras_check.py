"""Seeded sampling and logit adjustments on the GPU (sessions 47-48 built both on the CPU): their graphs capture, their
answers hold, and what their steps cost. The embedded SmolLM2 with the shipped drafter (`auto`'s schedule).

    python benchmarks/extras_check.py GGUF [OUT]      # exits 1 when a check fails
    python benchmarks/extras_check.py GGUF --cpu      # a smoke run of this script (4 prompts, 16 tokens, float32)

MT-bench's 80 first turns, 128 new tokens; one row and 32 rows (continuous batching through `Engine.generate`), one
engine alive at a time, its caches reserved and its greedy and sampled step graphs captured first (`load`; before
session 53 the sampled runs captured graphs while timed); each timed run the second of two, the collector paused:
1. float32 (`--dtype float32` engines, 32 rows): under frequency_penalty 0.5 + repetition_penalty 1.1, greedy, the
   speculative engine's answers (the chain of 3, forced: auto decodes such steps plainly on CUDA since session 51)
   equal the plain engine's (80/80; the CPU tests check it token for token);
2. bf16, per engine (plain, speculative: auto's schedule) and rows: tok/s of greedy; greedy adjusted (frequency 0.5
   + repetition 1.1: every step adjusts; auto's speculative engine decodes these steps plainly since session 51); sampled at T 1; sampled at T 1 with a seed per request (every step draws through
   layers/row_draws.py). Each extra's cost against its base, and the mean acceptance length of each;
3. a seeded request's answer again, alone and inside the 32-row batch (bf16: its batch-mates move its rounding, so
   this counts, it does not require).
Prints a table; writes OUT/extras_check.json when OUT is given.
"""

from __future__ import annotations

import gc
import json
import sys
from dataclasses import replace

import torch
from logprobs_check import CPU, DEV, NEW, script_args  # this folder's (a script's own folder leads sys.path)
from logprobs_check import run as timed_run

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.sampling_params import SamplingParams

ADJUST = dict(frequency_penalty=0.5, repetition_penalty=1.1)


def run(eng, prompts, params) -> tuple[list, float, float]:
    """logprobs_check.run (the second of two identical runs, the collector paused in it) with the run's mean
    acceptance length (0: plain)."""
    outs, tps = timed_run(eng, prompts, params)
    steps = sum(o.stats.verify_steps for o in outs)
    tau = sum(o.stats.accept_length_mean * o.stats.verify_steps for o in outs) / steps if steps else 0.0
    return outs, tps, tau


def load(gguf: str, kind: str, rows: int, dtype: str, spec=None):
    """An engine whose caches are sized for MT-bench's prompts and whose step graphs of every batch bucket are
    captured for greedy and sampled steps before anything is timed: sampled answers change from call to call, so
    the untimed first call of `run` does not meet every shape the timed one does (session 53,
    benchmarks/sampled_capture_probe.py: 1-4 graphs of ~60 ms each captured inside a ~0.4 s timed call). Multi-row
    prefill graphs are still captured on first use."""
    cfg = EngineConfig(device=DEV, dtype="float32" if CPU else dtype, max_batch_size=rows)
    eng = api.load(gguf, draft=None, config=cfg) if kind == "plain" else api.load(gguf, config=cfg, spec=spec)
    eng.reserve(rows, max(len(encode(eng.tokenizer, item.first)[0]) for item in mt_bench()) + NEW)
    for greedy in (True, False):
        eng.warmup(range(1, rows + 1), greedy=greedy)
    return eng


def drop(eng) -> None:
    del eng
    gc.collect()
    if not CPU:
        torch.cuda.empty_cache()


def main() -> int:
    gguf, out_dir, rows_list = script_args()
    greedy = SamplingParams(max_new_tokens=NEW)
    sampled = SamplingParams(max_new_tokens=NEW, temperature=1.0)
    ok, record = True, {}
    # 1. float32: speculation under adjustments equals plain decoding under them
    answers = {}
    for kind in ("plain", "spec"):
        # auto's float32 shape, the chain of 3, forced: auto decodes steps under penalties plainly on CUDA (session 51)
        eng = load(gguf, kind, rows_list[-1], "float32", SpecConfig(3, 1, 4))
        prompts = [encode(eng.tokenizer, item.first)[0] for item in mt_bench()][: 4 if CPU else None]
        answers[kind] = [o.token_ids for o in eng.generate(prompts, replace(greedy, **ADJUST))]
        drop(eng)
    same32 = sum(a == b for a, b in zip(answers["plain"], answers["spec"]))
    ok &= same32 == len(prompts)
    record["float32_identical"] = same32
    # 2. costs in bf16
    table = []
    for rows in rows_list:
        for kind in ("plain", "spec"):
            eng = load(gguf, kind, rows, "bfloat16")
            base, tps_g, tau_g = run(eng, prompts, greedy)
            adj, tps_a, tau_a = run(eng, prompts, replace(greedy, **ADJUST))
            _, tps_s, tau_s = run(eng, prompts, sampled)
            seeded = [replace(sampled, seed=1000 + i) for i in range(len(prompts))]
            s1, tps_d, tau_d = run(eng, prompts, seeded)
            again = eng.generate(prompts[:1], seeded[:1])[0].token_ids  # alone, after the batch
            table.append(dict(kind=kind, rows=rows, greedy=tps_g, adjusted=tps_a, sampled=tps_s, seeded=tps_d,
                              tau=(tau_g, tau_a, tau_s, tau_d), seeded_alone_same=again == s1[0].token_ids))
            drop(eng)
    record["table"] = table
    print(f"float32, {rows_list[-1]} rows, frequency 0.5 + repetition 1.1, greedy: speculative = plain in "
          f"{same32}/{len(prompts)} answers")
    print("| engine | rows | greedy tok/s | adjusted | cost | sampled T1 | seeded | cost | tau g / adj / T1 / seeded |"
          " seeded alone = in batch |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for r in table:
        print(f"| {r['kind']} | {r['rows']} | {r['greedy']:,.0f} | {r['adjusted']:,.0f} | "
              f"{100 * (1 - r['adjusted'] / r['greedy']):+.1f}% | {r['sampled']:,.0f} | {r['seeded']:,.0f} | "
              f"{100 * (1 - r['seeded'] / r['sampled']):+.1f}% | {' / '.join(f'{t:.2f}' for t in r['tau'])} | "
              f"{r['seeded_alone_same']} |")
    print("OK" if ok else "FAILED")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        record["ok"] = ok
        (out_dir / "extras_check.json").write_text(json.dumps(record, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
