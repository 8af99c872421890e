"""Would n-gram drafts (prompt lookup: the tokens that followed the last occurrence of the current suffix in the prompt
and answer so far) add acceptance to the shipped EAGLE-3 drafter's? An offline probe for issue 5's acceptance goals.

    python benchmarks/ngram_probe.py [--prompts 40] [--max-new-tokens 128] [--device cpu]

The embedded SmolLM2 (float32) answers MT-bench first turns greedily with the shipped drafter as a chain S3 K1 D4 and
as a tree S6 K8 D48 (answers equal to plain decoding's). At each speculative step (the root: the last committed
token) the probe also forms the n-gram draft of S tokens (the longest suffix of 4..1 tokens with an earlier
occurrence, the latest one) and counts its leading tokens that equal the answer's next tokens: what a branch of S
nodes holding that draft would have accepted. Per shape it prints the engine's tau, and the step-by-step bounds: the
tree with the n-gram branch added (max of the two per step), the chain choosing the n-gram draft whenever a suffix
of at least n tokens matches (n = 2, 3, 4), and how often the n-gram draft beats / loses to the drafter's. Steps are
the engine's own (a different draft would shift later steps; this bounds a step at a time).
"""

from __future__ import annotations

import argparse
from collections import Counter

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.sampling_params import SamplingParams


def ngram_draft(context: list[int], k: int, max_n: int = 4) -> tuple[list[int], int]:
    """(the k tokens after the latest earlier occurrence of the longest matching suffix of <= max_n tokens, that
    suffix's length), or ([], 0)."""
    L = len(context)
    for n in range(min(max_n, L - 1), 0, -1):
        suffix = context[L - n:]
        for start in range(L - n - 1, -1, -1):  # latest first; the suffix itself excluded
            if context[start:start + n] == suffix:
                return context[start + n:start + n + k], n
    return [], 0


def leading_matches(draft: list[int], truth: list[int]) -> int:
    m = 0
    for a, b in zip(draft, truth):
        if a != b:
            break
        m += 1
    return m


def record_steps(engine: Engine) -> list:
    """Wrap the engine's commit of speculative steps: each step's (request, output length before it, accepted m)."""
    steps = []
    original = engine._append_spec

    def append_spec(reqs, m_host, tok_host, S, lp_rows=None):
        for q, m in zip(reqs, m_host):
            steps.append((q, len(q.output_ids), m))
        return original(reqs, m_host, tok_host, S, lp_rows)

    engine._append_spec = append_spec
    return steps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    cfg = EngineConfig(device=args.device, dtype="float32", max_batch_size=1)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    print("| shape | steps | tau | + n-gram branch (max) | chain takes n-gram at n>=2 / 3 / 4 | n-gram better / "
          "worse / equal (when found) |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for shape in (SpecConfig(3, 1, 4), SpecConfig(6, 8, 48)):
        eng = api.load(spec=shape, config=cfg)
        prompts = [encode(eng.tokenizer, item.first)[0] for item in mt_bench()[: args.prompts]]
        steps = record_steps(eng)
        for p in prompts:
            eng.generate([p], params)
        k = shape.steps  # an n-gram branch as deep as the shape
        tau = hybrid = 0
        by_n = Counter()
        cmp = Counter()
        for q, i, m in steps:
            prompt, answer = q.prompt_ids, q.output_ids
            context = prompt + answer[:i]  # up to and including the root (the last committed token)
            truth = answer[i:i + k]
            draft, n = ngram_draft(context, k)
            m_ng = leading_matches(draft, truth)
            tau += m + 1
            hybrid += max(m, m_ng) + 1
            for t in (2, 3, 4):
                by_n[t] += (min(m_ng, shape.steps) if n >= t else m) + 1
            if n:
                cmp["better" if m_ng > m else "worse" if m_ng < m else "equal"] += 1
        N = len(steps)
        print(f"| S{shape.steps} K{shape.topk} D{shape.draft_tokens} | {N} | {tau / N:.3f} | {hybrid / N:.3f} | "
              f"{' / '.join(f'{by_n[t] / N:.3f}' for t in (2, 3, 4))} | "
              f"{cmp['better']} / {cmp['worse']} / {cmp['equal']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
