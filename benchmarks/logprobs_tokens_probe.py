"""Why asking for log-probabilities changes a bf16 answer at 32 speculative rows (sessions 46-47: 77-79 of 80
answers identical, every other engine and row count 80/80; runs of one configuration repeat exactly, session 27).

    python benchmarks/logprobs_tokens_probe.py GGUF [--order=check]

MT-bench's 80 first turns, 128 new tokens, greedy, 32 rows, the shipped drafter (`auto`'s schedule), continuous
batching through `Engine.generate`. For each engine variant (bf16 as shipped; bf16 with `compile=False`; float32),
four runs after a warm-up pair: A (no logprobs), A again, B (logprobs=5), B again. Prints the identical counts A/A,
B/B and A/B, and for each answer where A and B differ: the first differing token's index, and B's margin there (its
chosen token's log-probability against the best other alternative's: a bf16 near-tie shows as a margin of a few
hundredths of a nat). `--order=check`: bf16 only, in logprobs_check.py's order (A warm-up, A, B warm-up, B: the
log-probability graphs captured after the compared A run), A/B only.
"""

from __future__ import annotations

import sys

import torch

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams

A = SamplingParams(max_new_tokens=128)
B = SamplingParams(max_new_tokens=128, logprobs=5)


def main() -> int:
    gguf = sys.argv[1]
    check_order = "--order=check" in sys.argv
    print("| variant | A/A | B/B | A/B | first differences (answer: token index, margin nat) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, kw in (("bf16", {"dtype": "bfloat16"}), ("bf16, compile off", {"dtype": "bfloat16", "compile": False}),
                     ("float32", {"dtype": "float32"})):
        eng = api.load(gguf, config=EngineConfig(device="cuda", max_batch_size=32, **kw))
        prompts = [encode(eng.tokenizer, item.first)[0] for item in mt_bench()]
        if check_order:
            eng.generate(prompts, A)
            a1 = a2 = eng.generate(prompts, A)
            eng.generate(prompts, B)
            b1 = b2 = eng.generate(prompts, B)
        else:
            eng.generate(prompts, A)
            eng.generate(prompts, B)
            a1, a2, b1, b2 = (eng.generate(prompts, p) for p in (A, A, B, B))
        torch.cuda.synchronize()

        def same(x, y) -> int:
            return sum(p.token_ids == q.token_ids for p, q in zip(x, y))

        notes = []
        for i, (x, y) in enumerate(zip(a1, b1)):
            if x.token_ids == y.token_ids:
                continue
            j = next((j for j, (s, t) in enumerate(zip(x.token_ids, y.token_ids)) if s != t),
                     min(len(x.token_ids), len(y.token_ids)))
            margin = "-"
            if j < len(y.logprobs):
                e = y.logprobs[j]
                others = [v for t, v in e.top if t != e.token]
                margin = f"{e.logprob - others[0]:.3f}" if others else "-"
            notes.append(f"{i}: {j}, {margin}")
        print(f"| {name} | {same(a1, a2)}/80 | {same(b1, b2)}/80 | {same(a1, b1)}/80 | {'; '.join(notes) or '-'} |",
              flush=True)
        del eng
        torch.cuda.empty_cache()
        if check_order:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
