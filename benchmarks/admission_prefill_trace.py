"""What one regeneration admission's prefill costs on the GPU, and where (session 40: the eager multi-row prefills of
a 1,024-row regeneration took 220-470 ms each, 60-70% of its time; `benchmarks/regen_profile.py`).

Builds the engine regeneration builds (ROWS rows, `--max-len` MAX_LEN) on a random-weight model of SmolLM2-135M's
shape (timings do not depend on the weights), takes prompts of the lengths of the first ShareGPT first turns that fit
an admission (the scheduler's 8,192-token prefill budget; LENS: a JSON list of prompt lengths in tokens), and
times `ModelRunner.prefill` of them several times (synchronised), then once under torch.profiler (CPU and CUDA activities: the top operators by each). Then the same
prompts cut to 128 tokens, and a single 8-row group, for the scaling.

usage: python benchmarks/admission_prefill_trace.py LENS OUT [ROWS]
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import torch

from eaglespec.bench.random_model import random_model
from eaglespec.config import EngineConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.transforms import prepare_for_inference

LENS, OUT = sys.argv[1], Path(sys.argv[2])
ROWS = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
MAX_LEN = int(os.environ.get("MAX_LEN", "1024"))
OUT.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
model = random_model("smollm2-135m", dev, torch.bfloat16, 0).model
prepare_for_inference(model, dev, None, None)
eng = Engine(model, None, EngineConfig(max_batch_size=ROWS, max_seq_len=MAX_LEN + 1, min_prefill_rows=ROWS // 8))
eng.reserve(ROWS, MAX_LEN)
run = eng.runner
rng = random.Random(0)
prompts, budget = [], 8192
for n in json.loads(Path(LENS).read_text()):
    ids = [rng.randrange(3, model.config.vocab_size) for _ in range(n)]
    if len(ids) + 16 > MAX_LEN:
        continue
    if prompts and len(ids) > budget:
        break
    prompts.append(ids)
    budget -= len(ids)


def timed(name: str, ps: list[list[int]], reps: int = 5) -> None:
    rows = list(range(len(ps)))
    ts = []
    with torch.inference_mode():
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            run.prefill(rows, ps, True)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            run.prefill(rows, ps, True)
            torch.cuda.synchronize()
    ka = prof.key_averages()
    (OUT / f"{name}.txt").write_text(ka.table(sort_by="cuda_time_total", row_limit=30) + "\n\n"
                                      + ka.table(sort_by="cpu_time_total", row_limit=30))
    lens = [len(p) for p in ps]
    print(f"{name}: {len(ps)} rows, {sum(lens)} tokens, longest {max(lens)}: "
          + " ".join(f"{1e3 * t:.1f}" for t in ts) + " ms", flush=True)
    print(ka.table(sort_by="cuda_time_total", row_limit=12), flush=True)


timed("admission", prompts)
timed("admission_cut128", [p[:128] for p in prompts])
timed("eight_rows", prompts[:8])
