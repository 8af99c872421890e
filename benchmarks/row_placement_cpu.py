"""What a decode step costs on the eager path (the CPU) by where its rows lie: rows starting at 0 are read as views
of the caches, others through an index (a gather), which prefix reuse's row choice can cause (engine/scheduler.py).

    python benchmarks/row_placement_cpu.py    # the embedded SmolLM2, float32, 600-token prompts, 20 steps each
"""

from __future__ import annotations

import time

from eaglespec import api
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams


def main() -> None:
    eng = api.load(draft=None, config=EngineConfig(max_batch_size=4))
    eng.reserve(4, 1024)
    r = eng.runner
    prompt = list(range(100, 700))
    for row in (0, 1, 2):
        r.set_sampling(row, SamplingParams())
        r.prefill([row], [prompt], True)
    for rows in ([0], [1], [0, 1], [1, 2], [0, 2]):
        for _ in range(3):
            r.decode(rows, True)
        t = time.perf_counter()
        for _ in range(20):
            r.decode(rows, True)
        print(f"rows {rows}: {(time.perf_counter() - t) / 20 * 1e3:.1f} ms a decode step")


if __name__ == "__main__":
    main()
