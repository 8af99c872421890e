"""Where log-probabilities cost time on the GPU: the packed-row computation alone, and whole runs by path.

    python benchmarks/logprobs_cost.py GGUF

1. `token_logprobs` on bf16 logits of SmolLM2's vocabulary, N = 1, 8, 32, 192 rows, k = 5 and k = 20 (an engine
   computes `EngineConfig.max_logprobs` = 20 alternatives whatever a request asks): the Triton kernels
   (layers/logprobs_kernel.py) against PyTorch's path, CUDA-event time per call (median of 200, after warm-up);
2. MT-bench (40 first turns at one row, all 80 at 32 rows), 128 new tokens, greedy, plain and speculative (the
   shipped drafter) engines: tok/s without logprobs; with logprobs=5 through the kernels at every row count
   (KERNEL_MAX_ROWS lifted), through PyTorch's path (the runner's function swapped), through the kernels with the
   host's unpacking of the rows replaced by a constant (what the host's share is), and with an engine whose
   max_logprobs is 5 (what k costs). Graphs hold the path they were captured with, so each path has its own engine
   (the PyTorch path's captures with the swap in place). Two rounds in opposite orders; each timed run is the second
   of two identical ones (no capture inside it).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig
from eaglespec.engine import request, runner
from eaglespec.layers import logprobs, logprobs_kernel
from eaglespec.sampling_params import SamplingParams


def torch_path(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    top, ids = x.topk(k, dim=-1)
    return torch.cat((x.gather(-1, tokens[:, None]) - lse, top - lse, ids.float()), dim=-1)


def per_call(fn, *args, n: int = 200) -> float:
    for _ in range(10):
        fn(*args)
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def timed(eng, prompts, params) -> float:
    eng.generate(prompts, params)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = eng.generate(prompts, params)
    torch.cuda.synchronize()
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


FAKE = logprobs.TokenLogprob(0, 0.0, ((0, 0.0),) * 5)
MODES = ("none", "kernels", "torch", "no unpack", "k=5 engine")


def run_mode(mode: str, engines: dict, prompts) -> float:
    """tok/s of one mode (module docstring); restores the patched names after."""
    logprobs.KERNEL_MAX_ROWS = 1 << 20
    runner.token_logprobs = torch_path if mode == "torch" else logprobs.token_logprobs
    request.unpack = (lambda row, tok, k: FAKE) if mode == "no unpack" else logprobs.unpack
    try:
        eng = engines[{"k=5 engine": "k5", "torch": "torch"}.get(mode, "k20")]
        params = SamplingParams(max_new_tokens=128, logprobs=None if mode == "none" else 5)
        return timed(eng, prompts, params)
    finally:
        runner.token_logprobs, request.unpack = logprobs.token_logprobs, logprobs.unpack
        logprobs.KERNEL_MAX_ROWS = 8


def main() -> int:
    gguf = sys.argv[1]
    print("| rows | k | kernels us | PyTorch us |")
    print("| ---: | ---: | ---: | ---: |")
    for n in (1, 8, 32, 192):
        g = torch.Generator(device="cuda").manual_seed(n)
        x = (torch.randn(n, 49152, device="cuda", generator=g) * 4).to(torch.bfloat16)
        t = torch.randint(0, 49152, (n,), device="cuda", generator=g)
        for k in (5, 20):
            print(f"| {n} | {k} | {per_call(logprobs_kernel.packed_rows, x, t, k):.1f} | "
                  f"{per_call(torch_path, x, t, k):.1f} |", flush=True)
    print()
    print("| engine | rows | round | " + " | ".join(f"{m} tok/s" for m in MODES) + " |")
    print("| --- | ---: | ---: |" + " ---: |" * len(MODES))
    for kind in ("plain", "spec"):
        for rows in (1, 32):
            engines = {}
            for name, k in (("k20", 20), ("torch", 20), ("k5", 5)):
                cfg = EngineConfig(device="cuda", dtype="bfloat16", max_batch_size=rows, max_logprobs=k)
                engines[name] = api.load(gguf, draft=None, config=cfg) if kind == "plain" else api.load(gguf, config=cfg)
            prompts = [encode(engines["k20"].tokenizer, item.first)[0] for item in mt_bench()][: 40 if rows == 1 else None]
            cells: dict[str, list[float]] = {m: [] for m in MODES}
            for rnd, order in enumerate((MODES, MODES[::-1])):
                for mode in order:
                    cells[mode].append(run_mode(mode, engines, prompts))
                print(f"| {kind} | {rows} | {rnd + 1} | " + " | ".join(f"{cells[m][-1]:,.1f}" for m in MODES) + " |",
                      flush=True)
            del engines
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
