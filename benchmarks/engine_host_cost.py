"""Engine host time per step with the step's tensor work replaced by a precomputed result (CPU): what the engine's
Python costs around the graphs (scheduler, launch/collect bookkeeping, appending, detokenising), per shape, batch
size and overlap. A tiny model and a character tokenizer (tests/tiny.py); `GraphCache.run` returns the first step's
outputs again, so only the host's work is timed.

usage: python benchmarks/engine_host_cost.py      (from the repository root)
"""

from __future__ import annotations

import sys
import time

sys.path.insert(0, "tests")

import torch  # noqa: E402
from tiny import CharTokenizer, tiny_drafter, tiny_llama  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.cuda_graphs import GraphCache  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402
torch.set_num_threads(1)
t = tiny_llama(seed=0); d = tiny_drafter(t, seed=1)
tok = CharTokenizer(t.config.vocab_size)
for spec in (None, SpecConfig(3, 1, 4)):
    for B in (1, 8, 32):
        for overlap in (False, True):
            eng = Engine(t, tok, EngineConfig(max_batch_size=B, overlap=overlap), drafter=d if spec else None,
                         spec=spec)
            g = GraphCache(eng.runner, capture=False)
            eng.runner.graphs = g
            real_run = g.run
            cache = {}
            def fake(kind, n, longest, greedy, _real=real_run, _c=cache):
                if kind not in _c:
                    _c[kind] = _real(kind, n, longest, greedy)
                return _c[kind]
            g.run = fake
            for i in range(B):
                eng.add_request([1 + i, 2, 3], SamplingParams(max_new_tokens=400, ignore_eos=True))
            while eng.scheduler.waiting:
                eng.step()
            for _ in range(5):
                eng.step()
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                eng.step()
            dt = (time.perf_counter() - t0) / n * 1e6
            print(f"{'S3K1D4' if spec else 'no-spec'} B={B} overlap={overlap}: {dt:.0f} us host per step")
