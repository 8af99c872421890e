"""How much of a batch-1 decode step is the captured graph, and how much the engine around it?

For a random bf16 target of a named shape (bench.random_model) on CUDA graphs, batch 1, after the probes' 128-token
prompt: the decode graph replayed alone (`decode_graph_ms`); the engine's phase timer for the decode phase
(`bench.drafters.decode_step_seconds`, CUDA events around the phase: host gaps inside it count); and the wall time
per generated token of `Engine.generate`, with and without the overlapped step (the host preparing step n + 1 while
the GPU runs step n). A torch.profiler trace (CPU and CUDA) of 8 steps without overlap is written as a Chrome trace
(OUT/host_gap_SHAPE.json.gz), with the CPU ops that took longest printed.

usage: python benchmarks/host_gap.py OUT_DIR [SHAPE=smollm2-135m]   (a preset name or a config.json path)
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import time
from pathlib import Path

from probe_script import DEV, DT, OUT, decode_graph_ms, stepped_engine  # noqa: E402

import torch  # noqa: E402

from eaglespec.bench.drafters import decode_step_seconds  # noqa: E402
from eaglespec.bench.random_model import random_model  # noqa: E402
from eaglespec.config import EngineConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import prepare_for_inference  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

SHAPE = next((a for a in sys.argv[2:] if not a.startswith("--")), "smollm2-135m")  # a preset or a config.json
NAME = Path(SHAPE).stem if SHAPE.endswith(".json") else SHAPE
PROMPT = list(range(100, 228))


def per_token_ms(model: torch.nn.Module, overlap: bool, new: int = 64) -> float:
    """Wall ms per token of a one-row greedy generate, its prefill and first tokens taken out (two runs' difference)."""
    e = Engine(model, None, EngineConfig(max_batch_size=1, overlap=overlap))
    e.reserve(1, 512)
    e.warmup([1])

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        e.generate([PROMPT], SamplingParams(max_new_tokens=n, ignore_eos=True))
        torch.cuda.synchronize()
        return time.perf_counter() - t

    run(8 + new)
    short, long = min(run(8) for _ in range(3)), min(run(8 + new) for _ in range(3))
    return round(1e3 * (long - short) / new, 4)


m = random_model(SHAPE, DEV, DT, 0).model
prepare_for_inference(m, DEV, None, None)
row = {"shape": NAME, "device": torch.cuda.get_device_name()}
row["graph_replay_ms"] = decode_graph_ms(m)
row["phase_timer_ms"] = round(1e3 * decode_step_seconds(m, PROMPT, EngineConfig(max_batch_size=1), 64)[0], 4)
row["generate_ms_per_token_overlap"] = per_token_ms(m, True)
row["generate_ms_per_token_no_overlap"] = per_token_ms(m, False)
print(json.dumps(row), flush=True)
(OUT / f"host_gap_{NAME}.txt").write_text(json.dumps(row, indent=1))

from torch.profiler import ProfilerActivity, profile  # noqa: E402

e = stepped_engine(m, steps=10)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(8):
        e.step()
    torch.cuda.synchronize()
trace = OUT / f"host_gap_{NAME}.json"
prof.export_chrome_trace(str(trace))
with open(trace, "rb") as f, gzip.open(f"{trace}.gz", "wb") as g:
    shutil.copyfileobj(f, g)
trace.unlink()
table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=30)
(OUT / f"host_gap_{NAME}_ops.txt").write_text(table)
print(table)
