"""`Engine.reseed` on the GPU: an engine that ran sampled requests and then reseeded draws what a fresh engine of that
seed draws, through its CUDA graphs (whose replays read the generator's seed and offset), plain and speculative
(the shipped drafter). Random weights of SmolLM2-135M's shape (EOS ignored), 16 random prompts over 8 rows, T = 1.

usage: python benchmarks/reseed_check.py
"""

from __future__ import annotations

import random

import torch

from eaglespec.api import load_drafter
from eaglespec.bench.random_model import random_model
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.sampling_params import SamplingParams

dev = torch.device("cuda")
model = random_model("smollm2-135m", dev, torch.bfloat16, 0).model
prepare_for_inference(model, dev, None, None)
rng = random.Random(0)
prompts = [[rng.randrange(3, model.config.vocab_size) for _ in range(rng.randint(8, 60))] for _ in range(16)]
p = SamplingParams(max_new_tokens=48, temperature=1.0, ignore_eos=True)


def run(eng: Engine) -> list[list[int]]:
    return [o.token_ids for o in eng.generate(prompts, p)]


ok = True
drafter = load_drafter("src/eaglespec/assets/smollm2-135m-eagle3", dev, torch.bfloat16)  # fits the shape
for name, spec in (("plain", None), ("chain S3 K1 D4", SpecConfig(3, 1, 4))):
    def make(seed: int) -> Engine:
        return Engine(model, None, EngineConfig(max_batch_size=8, seed=seed),
                      drafter=drafter if spec else None, spec=spec)

    reused = make(7)
    first = run(reused)
    reused.reseed(11)
    second = run(reused)
    fresh = run(make(11))
    reused.reseed(7)
    third = run(reused)
    same = second == fresh and third == first and second != first
    ok &= same
    print(f"{name}: reseeded == fresh engine of that seed: {second == fresh}; back to the first seed repeats the "
          f"first run: {third == first}; the two seeds differ: {second != first}")
print("reseed check", "PASSED" if ok else "FAILED")
