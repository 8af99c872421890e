"""Regeneration throughput of the engine (the first stage of `eaglespec train`), immediate vs batched admission.

A SmolLM2-135M-shaped model with random weights (`--random-weights` preset), N random prompts of 32-512 tokens, and a
random answer length of 16-512 tokens per request (random weights never stop at EOS, real answers do: the lengths
stand in for that), decoded greedily through `Engine.generate` with ROWS rows, as regenerate.py does. Reports new
tokens per second and the number of prefill and decode steps for `min_prefill_rows` 1 (admit at once) and ROWS/8.

usage: [KS=1,32] python benchmarks/regen_throughput.py OUT_DIR [N] [ROWS] [--device cpu]   (KS: the values to time)
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch

from eaglespec.bench.random_model import random_model
from eaglespec.config import EngineConfig
from eaglespec.engine.engine import Engine
from eaglespec.sampling_params import SamplingParams

args = [a for a in sys.argv[1:] if not a.startswith("--")]
OUT = Path(args[0])
N = int(args[1]) if len(args) > 1 else 1024
ROWS = int(args[2]) if len(args) > 2 else 256
DEV = torch.device("cpu" if "--device" in sys.argv and sys.argv[-1] == "cpu" else "cuda")
CPU = DEV.type == "cpu"
dtype = torch.float32 if CPU else torch.bfloat16
model = random_model("smollm2-135m", DEV, dtype, 0).model
from eaglespec.engine.transforms import prepare_for_inference  # noqa: E402

prepare_for_inference(model, DEV, None, None)  # as `eaglespec train` regenerates: the inference form on CUDA
rng = random.Random(0)
vocab = model.config.vocab_size
hi_p, hi_n = (64, 32) if CPU else (512, 512)
prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(16 if CPU else 32, hi_p))] for _ in range(N)]
params = [SamplingParams(max_new_tokens=rng.randint(8 if CPU else 16, hi_n), ignore_eos=True) for _ in range(N)]
rows = []
for k in [int(x) for x in __import__("os").environ.get("KS", f"1,{max(1, ROWS // 8)}").split(",")]:
    eng = Engine(model, None, EngineConfig(max_batch_size=ROWS, max_seq_len=hi_p + hi_n + 1, min_prefill_rows=k))
    eng.reserve(ROWS, hi_p + hi_n)  # the caches at their final size before any graph is captured
    eng.generate(prompts[:ROWS], [SamplingParams(max_new_tokens=4, ignore_eos=True)] * min(ROWS, N))  # capture
    kinds = {"prefill": 0, "decode": 0}
    sched_step = eng.step

    def counted_step():
        batch_kind = "prefill" if eng.scheduler.waiting and eng.scheduler.may_admit() else "decode"
        kinds[batch_kind] += 1
        return sched_step()

    eng.step = counted_step
    if not CPU:
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = eng.generate(prompts, params)
    if not CPU:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    new = sum(len(o.token_ids) for o in outs)
    rows.append({"min_prefill_rows": k, "rows": ROWS, "prompts": N, "new_tokens": new, "seconds": round(dt, 2),
                 "new_tok_per_s": round(new / dt, 1), "prefill_steps": kinds["prefill"],
                 "decode_steps": kinds["decode"]})
    print(json.dumps(rows[-1]), flush=True)
    del eng
OUT.mkdir(parents=True, exist_ok=True)
(OUT / "regen_throughput.json").write_text(json.dumps(rows, indent=1))
print("\n| min_prefill_rows | new tok/s | prefill steps | decode steps | seconds |\n|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['min_prefill_rows']} | {r['new_tok_per_s']} | {r['prefill_steps']} | {r['decode_steps']} | {r['seconds']} |")
