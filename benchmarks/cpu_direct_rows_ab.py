"""CPU A/B of the few-row product at 3 rows in one process (layers/cpu_linear.py, `CpuLinear.direct_rows`): the
embedded SmolLM2 and its shipped drafter, one engine of one row with a fixed shape, MT-bench first turns; every
round runs the prompts twice, once with F.linear at 3-row steps (`direct_rows` 3) and once with the packed copy
there (2: session 66's choice), in alternating order, and the same with plain decoding. Prints tok/s per round and
the medians. Both engines see the same weights and the same draws (seeded requests).

usage: PYTHONPATH=src python benchmarks/cpu_direct_rows_ab.py [--spec 2,1,3] [--temperature 0.7] [--top-p 0.9]
       [--limit 6] [--max-new-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from eaglespec import api
from eaglespec.bench.datasets import mt_bench
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.layers.cpu_linear import CpuLinear
from eaglespec.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default="2,1,3")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    steps, topk, d = (int(x) for x in a.spec.split(","))
    prompts = [q.first for q in mt_bench()[: a.limit]]
    engines = {"plain": api.load(draft=None, config=EngineConfig(max_batch_size=1)),
               "spec": api.load(draft="auto", spec=SpecConfig(steps, topk, d), config=EngineConfig(max_batch_size=1),
                                temperature=a.temperature)}
    assert engines["spec"].drafter is not None
    params = [SamplingParams(max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p, seed=i,
                             ignore_eos=True) for i in range(len(prompts))]
    rates: dict[tuple[str, int], list[float]] = {}
    for kind, eng in engines.items():
        eng.generate(prompts[:1], params[:1])  # warm
    for rnd in range(a.rounds):
        for kind, eng in engines.items():
            lins = [m for model in (eng.target, eng.drafter) if model is not None for m in model.modules()
                    if isinstance(m, CpuLinear)]
            measured = {m.direct_rows for m in lins}
            for rows in ((3, 2) if rnd % 2 == 0 else (2, 3)):
                for m in lins:
                    m.direct_rows = rows if max(measured) else 0
                t = time.perf_counter()
                out = eng.generate(prompts, params)
                s = time.perf_counter() - t
                n = sum(len(o.token_ids) for o in out)
                rates.setdefault((kind, rows), []).append(n / s)
                print(f"round {rnd} {kind} direct_rows={rows}: {n / s:.1f} tok/s (measured {sorted(measured)})",
                      flush=True)
    for key, v in sorted(rates.items()):
        print(key, "median", round(statistics.median(v), 1), [round(x, 1) for x in v])


if __name__ == "__main__":
    main()
