"""Where log-probabilities cost time on the GPU, and what the garbage collector has to do with it.

    python benchmarks/logprobs_cost.py GGUF

1. `token_logprobs` on bf16 logits of SmolLM2's vocabulary, N = 1, 8, 32, 192 rows, k = 5 and k = 20 (an engine
   computes 5 alternatives while its requests ask for at most 5, else `EngineConfig.max_logprobs`): the Triton kernels
   (layers/logprobs_kernel.py) against PyTorch's path, per call inside a CUDA graph of 20 calls (a call launched from
   Python measures the launch, ~110 us, not the kernels: session 47's first run of this script);
2. MT-bench's 80 first turns, 128 new tokens, greedy, 32 rows, plain and speculative (the shipped drafter) engines:
   tok/s without logprobs; with logprobs=5 through the kernels, through PyTorch's path, and
   through the kernels with the host's unpacking replaced by a constant; each in five rounds, first with the heap as
   it is, then frozen (engine/gc_heap.py), counting the full garbage collections inside each timed run and their
   time. Graphs hold the path they were captured with, so the PyTorch path has its own engine (captured with the swap
   in place). Each timed run is the second of two identical ones (no capture inside it).
3. One row (the first 40 turns), heap frozen: none / kernels / PyTorch's path, plain and speculative.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import torch

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig
from eaglespec.engine import logprob_buffer, request
from eaglespec.engine.gc_heap import freeze_heap
from eaglespec.layers import logprobs, logprobs_kernel
from eaglespec.sampling_params import SamplingParams

FULL = {"n": 0, "s": 0.0, "t": 0.0}


def on_gc(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        FULL["t"] = time.perf_counter()
    else:
        FULL["n"] += 1
        FULL["s"] += time.perf_counter() - FULL["t"]


def torch_path(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    top, ids = x.topk(k, dim=-1)
    return torch.cat((x.gather(-1, tokens[:, None]) - lse, torch.stack((top - lse, ids.float()), -1).flatten(1)), -1)


def in_graph(fn, *args, calls: int = 20) -> float:
    """us per call, replaying a graph of `calls` calls (median of 50 replays)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn(*args)
    times = []
    for _ in range(50):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


def timed(eng, prompts, params) -> tuple[float, int, float]:
    """(tok/s, full collections, their ms) of the second of two identical runs."""
    eng.generate(prompts, params)
    torch.cuda.synchronize()
    FULL.update(n=0, s=0.0)
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return sum(len(o.token_ids) for o in outs) / dt, FULL["n"], FULL["s"] * 1000


FAKE = logprobs.TokenLogprob(0, 0.0, ((0, 0.0),) * 5)
MODES = ("none", "kernels", "torch", "no unpack")


def run_mode(mode: str, engines: dict, prompts) -> tuple[float, int, float]:
    """One mode's timed run (module docstring); restores the patched names after."""
    logprob_buffer.token_logprobs = torch_path if mode == "torch" else logprobs.token_logprobs
    request.unpack = (lambda row, tok, k: FAKE) if mode == "no unpack" else logprobs.unpack
    try:
        params = SamplingParams(max_new_tokens=128, logprobs=None if mode == "none" else 5)
        return timed(engines["torch" if mode == "torch" else "kernels"], prompts, params)
    finally:
        logprob_buffer.token_logprobs, request.unpack = logprobs.token_logprobs, logprobs.unpack


def load(gguf: str, kind: str, rows: int) -> dict:
    cfg = EngineConfig(device="cuda", dtype="bfloat16", max_batch_size=rows)
    return {name: api.load(gguf, draft=None, config=cfg) if kind == "plain" else api.load(gguf, config=cfg)
            for name in ("kernels", "torch")}


def main() -> int:
    gguf = sys.argv[1]
    gc.callbacks.append(on_gc)
    print("| rows | k | kernels us | PyTorch us |")
    print("| ---: | ---: | ---: | ---: |")
    for n in (1, 8, 32, 192):
        g = torch.Generator(device="cuda").manual_seed(n)
        x = (torch.randn(n, 49152, device="cuda", generator=g) * 4).to(torch.bfloat16)
        t = torch.randint(0, 49152, (n,), device="cuda", generator=g)
        for k in (5, 20):
            print(f"| {n} | {k} | {in_graph(logprobs_kernel.packed_rows, x, t, k):.2f} | "
                  f"{in_graph(torch_path, x, t, k):.2f} |", flush=True)
    engines = {kind: load(gguf, kind, 32) for kind in ("plain", "spec")}
    prompts = [encode(engines["plain"]["kernels"].tokenizer, item.first)[0] for item in mt_bench()]
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        ms = (time.perf_counter() - t0) * 1000
        print(f"\na full collection with the engines loaded, heap not frozen: {ms:.1f} ms "
              f"({len(gc.get_objects()):,} objects)")
    print("\n| engine | heap | mode | tok/s, 5 rounds | median | full collections (ms) |")
    print("| --- | --- | --- | --- | ---: | --- |")
    for heap in ("as loaded", "frozen"):
        if heap == "frozen":
            print(f"(frozen: {freeze_heap():,} objects)")
        for kind, engs in engines.items():
            cells = {m: [] for m in MODES}
            for rnd in range(5):
                for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                    cells[mode].append(run_mode(mode, engs, prompts))
            for m in MODES:
                tps = [c[0] for c in cells[m]]
                print(f"| {kind} | {heap} | {m} | {' / '.join(f'{x:,.0f}' for x in tps)} | "
                      f"{statistics.median(tps):,.0f} | {sum(c[1] for c in cells[m])} "
                      f"({sum(c[2] for c in cells[m]):.0f}) |", flush=True)
        if heap == "as loaded":
            gc.unfreeze()  # nothing frozen yet; explicit for the reader
    del engines
    torch.cuda.empty_cache()
    print("\n| engine, 1 row | none tok/s | kernels tok/s | torch tok/s |")
    print("| --- | ---: | ---: | ---: |")
    for kind in ("plain", "spec"):
        engs = load(gguf, kind, 1)
        freeze_heap()
        prompts1 = [encode(engs["kernels"].tokenizer, item.first)[0] for item in mt_bench()][:40]
        print(f"| {kind} | " + " | ".join(f"{run_mode(m, engs, prompts1)[0]:,.1f}" for m in MODES[:3]) + " |",
              flush=True)
        del engs
    return 0


if __name__ == "__main__":
    sys.exit(main())
