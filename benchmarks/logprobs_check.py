"""Log-probabilities on the GPU: the embedded SmolLM2 (bf16, CUDA graphs, overlap) with the shipped drafter.

    python benchmarks/logprobs_check.py GGUF [OUT]      # exits 1 when a check fails
    python benchmarks/logprobs_check.py GGUF --cpu      # a smoke run of this script (4 prompts, 16 tokens, float32)

On MT-bench's 80 first turns, 128 new tokens, greedy:
1. tokens: the same with logprobs asked for as without (plain and speculative engines alike): computing them changes
   nothing the steps choose;
2. values: each speculative answer's entries against the plain engine's for the tokens both answers share before
   their first difference, and the plain engine's against a float32 reference forward of its answer (a separate
   model copy) for the first 8 answers: mean and largest difference. bf16 logits of magnitude 16-32 are spaced by
   0.125-0.25, and a verify of several tokens rounds other than a one-token decode, so single tokens differ by up to
   a few tenths of a nat (session 46: 0.32 and 0.19); a bug (a wrong row, a wrong position) shows as whole nats and
   in the mean. Checks: largest < 0.5 nat, mean < 0.02 between the two bf16 engines (session 46: 0.0052) and < 0.05
   against float32, where the bf16 model's own error adds in (session 46: 0.0216);
3. cost: tok/s of each engine with and without logprobs, one row and 32 rows (continuous batching through
   `Engine.generate`; each timed run the second of two, so that no graph is captured inside it), so the price of
   asking is measured; an engine whose requests never ask runs its old graphs.
Prints a table; writes OUT/logprobs_check.json when OUT is given.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig
from eaglespec.layers.context import ForwardContext
from eaglespec.loading import load_model
from eaglespec.sampling_params import SamplingParams

CPU = "--cpu" in sys.argv
NEW = 16 if CPU else 128
DEV = "cpu" if CPU else "cuda"


def script_args() -> tuple[str, Path | None, tuple[int, int]]:
    """(the GGUF, the output folder or None, the row counts: 1 and 2 on the CPU, 1 and 32 on the GPU) from the
    command line `GGUF [OUT_DIR] [--cpu]` (also extras_check.py's)."""
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    return args[0], Path(args[1]) if len(args) > 1 else None, (1, 2) if CPU else (1, 32)


def sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


def run(eng, prompts, params) -> tuple[list, float]:
    """The second of two identical runs (the first captures the graphs both use), and its tok/s. The timed run
    pauses the garbage collector (after a collection): a full collection of this process's heap stalls the host
    65-140 ms (session 47), which the CLI's frozen heap avoids (engine/gc_heap.py) and a script that builds and drops
    engines cannot freeze."""
    eng.generate(prompts, params)
    sync()
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        sync()
        dt = time.perf_counter() - t0
    finally:
        gc.enable()
    return outs, sum(len(o.token_ids) for o in outs) / dt


def main() -> int:
    gguf, out_dir, rows_list = script_args()
    no_lp = SamplingParams(max_new_tokens=NEW)
    with_lp = SamplingParams(max_new_tokens=NEW, logprobs=5)
    table, record, ok = [], {}, True
    results = {}
    # one engine at a time: with the four alive in one process, session 47 saw 77-79 of the 32-row speculative
    # engine's 80 answers change when asked for logprobs, against 80/80 in processes of one engine
    # (benchmarks/logprobs_tokens_probe.py)
    for kind, rows in [(k, r) for r in rows_list for k in ("plain", "spec")]:
        cfg = EngineConfig(device=DEV, dtype="float32" if CPU else "bfloat16", max_batch_size=rows)
        # the shipped drafter with auto's shape for these rows, or none
        eng = api.load(gguf, draft=None, config=cfg) if kind == "plain" else api.load(gguf, config=cfg)
        prompts = [encode(eng.tokenizer, item.first)[0] for item in mt_bench()][: 4 if CPU else None]
        a, tps_a = run(eng, prompts, no_lp)
        b, tps_b = run(eng, prompts, with_lp)
        same = sum(x.token_ids == y.token_ids for x, y in zip(a, b))
        ok &= same == len(prompts) and all(len(o.logprobs) == len(o.token_ids) for o in b)
        results[(kind, rows)] = b
        table.append((kind, rows, tps_a, tps_b, same))
        del eng
        gc.collect()
        if not CPU:
            torch.cuda.empty_cache()
    # values: speculative against plain, on the shared prefix of each answer
    diffs = []
    for rows in rows_list:
        for p, s in zip(results[("plain", rows)], results[("spec", rows)]):
            for x, y, tx, ty in zip(p.logprobs, s.logprobs, p.token_ids, s.token_ids):
                if tx != ty:
                    break
                diffs.append(abs(x.logprob - y.logprob))
    worst, compared, mean = max(diffs), len(diffs), sum(diffs) / len(diffs)
    ok &= worst < 0.5 and mean < 0.02
    # a float32 reference forward of the first 8 plain answers
    ref = load_model(gguf, device=torch.device(DEV), dtype="float32").model
    ref_diffs = []
    for prompt, o in list(zip(prompts, results[("plain", 1)]))[:8]:
        ids = torch.tensor([prompt + o.token_ids], device=DEV)
        with torch.no_grad():
            lp = ref(ids, ForwardContext.plain(1, ids.shape[1], ids.device)).logits[0].float().log_softmax(-1)
        n = len(prompt)
        ref_diffs += [abs(lp[n - 1 + j, e.token].item() - e.logprob) for j, e in enumerate(o.logprobs)]
    ref_worst, ref_mean = max(ref_diffs), sum(ref_diffs) / len(ref_diffs)
    ok &= ref_worst < 0.5 and ref_mean < 0.05
    print("| engine | rows | tok/s without logprobs | with logprobs=5 | cost | answers identical |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind, rows, a, b, same in table:
        print(f"| {kind} | {rows} | {a:,.1f} | {b:,.1f} | {100 * (1 - b / a):+.1f}% | {same}/{len(prompts)} |")
    print(f"speculative vs plain logprobs, shared prefixes ({compared} tokens): mean difference {mean:.5f}, largest "
          f"{worst:.4f} nat")
    print(f"plain vs a float32 reference (8 answers, {len(ref_diffs)} tokens): mean difference {ref_mean:.5f}, "
          f"largest {ref_worst:.4f} nat")
    print("OK" if ok else "FAILED")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        record = {"table": table, "spec_vs_plain_mean": mean, "spec_vs_plain_max": worst, "tokens_compared": compared,
                  "vs_fp32_mean": ref_mean, "vs_fp32_max": ref_worst, "ok": ok}
        (out_dir / "logprobs_check.json").write_text(json.dumps(record, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
