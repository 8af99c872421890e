"""One conversation of several turns, as `eaglespec chat` runs it (one engine, one row, each turn's prompt the whole
history), with prefix reuse on and off (EngineConfig.reuse_prefixes): per turn its prompt tokens, the tokens it
reused, the time to its first token and to its last; the answers of both must be the same, token for token.

    python benchmarks/chat_turns.py [--turns 6] [--max-new-tokens 128] [--rounds 2] [--no-spec]

The user messages are MT-bench first turns 1, 2, ... (unrelated questions asked in one conversation: a long history
that only grows). Rounds alternate the order (on, off, off, on, ...) so neither always runs first.
"""

from __future__ import annotations

import argparse
import statistics
import time

from eaglespec import api
from eaglespec.bench.datasets import mt_bench
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams


def conversation(reuse: bool, turns: int, max_new: int, spec: bool) -> list[dict]:
    engine = api.load(draft="auto" if spec else None,
                      config=EngineConfig(max_batch_size=1, reuse_prefixes=reuse))
    params = SamplingParams(max_new_tokens=max_new)
    questions = [item.first for item in mt_bench()[:turns]]
    messages: list[dict] = []
    rows = []
    for q in questions:
        messages.append({"role": "user", "content": q})
        t0 = time.perf_counter()
        req = engine.add_request(messages, params)
        while not req.finished:
            engine.step()
        total = time.perf_counter() - t0
        messages.append({"role": "assistant", "content": req.text})
        rows.append({"prompt": len(req.prompt_ids), "reused": req.reused, "ttft": req.t_first - req.t_start,
                     "seconds": total, "tokens": list(req.output_ids),
                     "spec": engine.speculative})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-spec", action="store_true")
    args = ap.parse_args()
    runs: dict[bool, list[list[dict]]] = {True: [], False: []}
    for r in range(args.rounds):
        for reuse in ((True, False) if r % 2 == 0 else (False, True)):
            runs[reuse].append(conversation(reuse, args.turns, args.max_new_tokens, not args.no_spec))
    same = all(a["tokens"] == b["tokens"] for x in runs[True] for y in runs[False] for a, b in zip(x, y))
    print(f"speculative: {runs[True][0][0]['spec']}; answers identical with and without reuse: {same}")
    print("| turn | prompt tokens | reused | TTFT off (ms) | TTFT on (ms) | turn off (s) | turn on (s) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in range(args.turns):
        on = [run[t] for run in runs[True]]
        off = [run[t] for run in runs[False]]
        med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
        print(f"| {t + 1} | {on[0]['prompt']} | {on[0]['reused']} | {med(off, 'ttft') * 1e3:.0f} | "
              f"{med(on, 'ttft') * 1e3:.0f} | {med(off, 'seconds'):.2f} | {med(on, 'seconds'):.2f} |")
    for reuse in (False, True):
        total = statistics.median(sum(r["seconds"] for r in run) for run in runs[reuse])
        print(f"reuse {'on' if reuse else 'off'}: the conversation in {total:.2f} s (median of {args.rounds})")


if __name__ == "__main__":
    main()
