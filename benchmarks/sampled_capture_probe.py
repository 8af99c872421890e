"""Why `extras_check.py`'s 32-row sampled runs lose (0.71x on an H100, session 52; 0.40x on the H200, session 50)
where `eaglespec bench`'s continuous ones gain (1.13x): a probe of one hypothesis, CUDA graphs captured inside the
timed run.

extras_check times the second of two identical `Engine.generate` calls, assuming the first captured every graph the
second replays. That holds for greedy requests (the same answers, the same batch shapes); sampled answers without
a seed differ from call to call, so the second call's rows finish at other steps, its continuous admissions group
other prompts and its longest row crosses other length buckets, and any (kind, rows, length) key or multi-row prefill
group the first call did not meet is captured while timed (tens to hundreds of ms each, against a ~0.4 s run).
`bench` reserves the caches and captures every batch bucket's graphs before it times anything.

    python benchmarks/sampled_capture_probe.py GGUF [--rows 32] [--new 128]

Per engine (plain, speculative with auto's schedule; built for greedy requests as extras_check builds them, bf16),
MT-bench's 80 first turns at temperature 1: (a) extras_check's protocol: tok/s of the second call and the graphs
captured during it (step graphs + prefill graphs); (b) after `reserve` + `warmup` of every batch size for sampled
steps (its captures and seconds; since session 53 it also captures the prefill graphs of 2-8 prompts): two more
timed calls and their captures. Prints a table.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams


def timed(eng, prompts, params) -> tuple[float, str]:
    """(tok/s of one generate call, the graphs captured during it: "steps+prefills"), the collector paused as
    extras_check pauses it."""
    graphs = eng.runner.graphs
    before = set(graphs.graphs)
    torch.cuda.synchronize()
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    finally:
        gc.enable()
    new = set(graphs.graphs) - before
    prefills = sum(k[0] == "prefill" for k in new)
    return sum(len(o.token_ids) for o in outs) / dt, f"{len(new) - prefills}+{prefills}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    a = ap.parse_args()
    sampled = SamplingParams(max_new_tokens=a.new, temperature=1.0)
    rows = []
    for kind in ("plain", "spec"):
        cfg = EngineConfig(device="cuda", dtype="bfloat16", max_batch_size=a.rows)
        eng = api.load(a.gguf, draft=None, config=cfg) if kind == "plain" else api.load(a.gguf, config=cfg)
        prompts = [encode(eng.tokenizer, item.first)[0] for item in mt_bench()]
        eng.generate(prompts, sampled)  # extras_check's untimed first call
        first = timed(eng, prompts, sampled)
        eng.reserve(a.rows, max(len(p) for p in prompts) + a.new)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = eng.warmup(range(1, a.rows + 1), greedy=False)  # since session 53 with the multi-row prefill graphs
        torch.cuda.synchronize()
        n = f"{n} in {time.perf_counter() - t0:.1f} s"
        warm = [timed(eng, prompts, sampled) for _ in range(2)]
        rows.append((kind, first, n, warm))
        del eng
        gc.collect()
        torch.cuda.empty_cache()
    print("| engine | extras_check's protocol: tok/s (graphs captured while timed: steps+prefills) | warm-up "
          "captures | after the warm-up, two calls |")
    print("| --- | --- | ---: | --- |")
    for kind, (tps, cap), n, warm in rows:
        after = " / ".join(f"{t:,.0f} ({c})" for t, c in warm)
        print(f"| {kind} | {tps:,.0f} ({cap}) | {n} | {after} |")
    base = {k: (f, w) for k, f, _, w in rows}
    print(f"speculative / plain: extras_check's protocol {base['spec'][0][0] / base['plain'][0][0]:.2f}x; "
          f"after the warm-up {max(t for t, _ in base['spec'][1]) / max(t for t, _ in base['plain'][1]):.2f}x "
          f"(best of two)")


if __name__ == "__main__":
    main()
