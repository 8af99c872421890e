"""Does queuing the next step before reading a prefill's first tokens change any token, and what does it save?
(30ffde4 did so; measured here against the tree before it, identical tokens and no faster: reverted. The script
serves any A/B of the overlapped engine's admission path across two trees.)

Random SmolLM2-135M weights and a random drafter (12,288-token head), bf16, CUDA graphs, overlap: 48 requests with
seeded prompt lengths (40-300 tokens) and budgets (32-160 new tokens, EOS ignored) through engines of 8 and 32 rows,
plain and chain S3 K1 D4, every graph bucket captured first. Admission timing does not depend on where the launch
sits inside the prefill step, so the tokens must equal those of an older tree run in another process (the digest),
and only the wall time may move.

usage: python benchmarks/admission_check.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import random
import time

from probe_script import Emitter, random_pair  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

m, d = random_pair(draft_vocab=12288)
emit = Emitter("admission_check.json")
rng = random.Random(0)
reqs = [(rng.randint(40, 300), rng.randint(32, 160)) for _ in range(48)]
prompts = [[(7 * i + j) % 40000 + 10 for j in range(p)] for i, (p, _) in enumerate(reqs)]
params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for _, n in reqs]
for rows in (8, 32):
    for name, spec in (("no-spec", None), ("S3K1D4", SpecConfig(3, 1, 4))):
        e = Engine(m, None, EngineConfig(max_batch_size=rows), drafter=d if spec else None, spec=spec)
        e.reserve(rows, 512)
        e.warmup(range(1, rows + 1))
        e.generate(prompts[:rows], [SamplingParams(max_new_tokens=4, ignore_eos=True)] * rows)  # prefill graphs
        walls, digest = [], None
        e.step_counts.clear()
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            outs = e.generate(prompts, params)
            walls.append(round(time.perf_counter() - t, 4))
            dg = hashlib.sha256(str([o.token_ids for o in outs]).encode()).hexdigest()[:12]
            assert digest in (None, dg), "two runs of one engine differ"
            digest = dg
        emit({"rows": rows, "config": name, "wall_s": walls, "prefills_per_run": e.step_counts["prefill"] // 2,
              "tokens": sum(n for _, n in reqs), "digest": digest})
        del e
        torch.cuda.empty_cache()
