"""Would a dynamic tree place its nodes better if the drafter's log-probabilities were tempered? (issue 5: the tree
goal, tau >= 5.0 with <= 48 tokens, stands at 4.05 with S6 K8 D48.)

EAGLE-2's dynamic tree ranks candidates by the product of the drafter's probabilities along their path, which is the
chance the target accepts them only if the drafter is calibrated. On MT-bench the drafter's step-0 accuracy is 0.67
against 0.78 on its held-out data (docs/training.md), so it is likely over-confident there, and an over-confident
drafter favours deep chains over siblings. Here the scores are log_softmax(logits / T) for a few T (the ids drafted
are those of T = 1: a temperature keeps the order within a row; only the ranking across rows and depths moves), and
the mean acceptance length of the tree is measured on the embedded SmolLM2 with the shipped drafter, float32 on the
CPU, greedy (so every answer must stay the target's own: checked).

usage: python benchmarks/tree_score_probe.py [N_PROMPTS=20] [MAX_NEW=128] [STEPS,TOPK,TOKENS=6,8,48] [T1,T2,...=1,1.5,2]
"""

from __future__ import annotations

import json
import sys
import time

import eaglespec.spec.draft as draft_mod
from eaglespec.api import load
from eaglespec.assets import default_drafter_path
from eaglespec.bench.datasets import load_prompt_set
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.sampling_params import SamplingParams

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
MAX_NEW = int(sys.argv[2]) if len(sys.argv) > 2 else 128
S, K, D = (int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "6,8,48").split(","))
TEMPS = [float(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "1,1.5,2").split(",")]

prompts = [i.first for i in load_prompt_set("mt-bench")[:N]]
params = SamplingParams(max_new_tokens=MAX_NEW)
cfg = EngineConfig(device="cpu", dtype="float32", max_batch_size=N)
plain = load(None, draft=None, config=cfg)
ref = [o.token_ids for o in plain.generate(prompts, params)]
eng = load(None, draft=default_drafter_path(), spec=SpecConfig(S, K, D), config=cfg)
orig = draft_mod.topk_logp
rows = []
for T in TEMPS:
    draft_mod.topk_logp = (lambda logits, k, T=T: orig(logits / T, k)) if T != 1 else orig
    eng.stats.__init__()
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    row = {"temperature": T, "spec": f"S{S} K{K} D{D}", "tau": round(eng.stats.accept_length_mean, 4),
           "per_depth": [round(r, 3) for r in eng.stats.depth_rates()],
           "identical": sum(o.token_ids == r for o, r in zip(outs, ref)), "prompts": N,
           "seconds": round(time.perf_counter() - t0, 1)}
    rows.append(row)
    print(json.dumps(row), flush=True)
draft_mod.topk_logp = orig
print("\n| score temperature | tau | acceptance per depth | identical |\n| ---: | ---: | --- | ---: |")
for r in rows:
    print(f"| {r['temperature']} | {r['tau']:.3f} | {' '.join(f'{x:.2f}' for x in r['per_depth'])} | "
          f"{r['identical']}/{r['prompts']} |")
