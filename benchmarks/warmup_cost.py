"""What `eaglespec serve --warmup` costs at start, and `--warmup-both-modes` on top (session 51's option, unmeasured
until session 52): the embedded SmolLM2 with its drafter on CUDA, 32 rows, graphs captured for greedy steps, then for
sampled ones (each kind of step takes its own shapes since session 51).

    python benchmarks/warmup_cost.py [GGUF]
"""

from __future__ import annotations

import sys
import time

import torch

from eaglespec import api
from eaglespec.config import EngineConfig


def main() -> None:
    eng = api.load(sys.argv[1] if len(sys.argv) > 1 else None, config=EngineConfig(max_batch_size=32))
    eng.reserve(32, 4096)
    for greedy in (True, False):
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = eng.warmup(range(1, 33), greedy)
        torch.cuda.synchronize()
        print(f"warm-up of {'greedy' if greedy else 'sampled'} steps: {n} graphs in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
