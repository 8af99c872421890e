"""Where log-probabilities cost time on the GPU: the packed-row computation alone, and whole runs by path.

    python benchmarks/logprobs_cost.py GGUF

1. `token_logprobs` on bf16 logits of SmolLM2's vocabulary, N = 1, 8, 32, 192 rows, k = 5: the Triton kernels
   (layers/logprobs_kernel.py) against PyTorch's path, CUDA-event time per call (median of 200, after warm-up);
2. MT-bench, 128 new tokens, plain decoding at 1 and 32 rows: tok/s without logprobs, with them through the
   kernels, and through PyTorch's path (the runner's function swapped).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from eaglespec import api
from eaglespec.bench.datasets import encode, mt_bench
from eaglespec.config import EngineConfig
from eaglespec.engine import runner
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


def main() -> int:
    gguf = sys.argv[1]
    print("| rows | kernels us | PyTorch us |")
    print("| ---: | ---: | ---: |")
    for n in (1, 8, 32, 192):
        g = torch.Generator(device="cuda").manual_seed(n)
        x = (torch.randn(n, 49152, device="cuda", generator=g) * 4).to(torch.bfloat16)
        t = torch.randint(0, 49152, (n,), device="cuda", generator=g)
        print(f"| {n} | {per_call(logprobs_kernel.packed_rows, x, t, 5):.1f} | {per_call(torch_path, x, t, 5):.1f} |")
    print("| rows | no logprobs tok/s | kernels tok/s | PyTorch tok/s |")
    print("| ---: | ---: | ---: | ---: |")
    for rows in (1, 32):
        eng = api.load(gguf, draft=None, config=EngineConfig(device="cuda", dtype="bfloat16", max_batch_size=rows))
        prompts = [encode(eng.tokenizer, item.first)[0] for item in mt_bench()]
        cells = []
        for label, params, fn in (("none", SamplingParams(max_new_tokens=128), logprobs.token_logprobs),
                                  ("kernels", SamplingParams(max_new_tokens=128, logprobs=5), logprobs.token_logprobs),
                                  ("torch", SamplingParams(max_new_tokens=128, logprobs=5), torch_path)):
            runner.token_logprobs = fn
            eng.generate(prompts, params)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = eng.generate(prompts, params)
            torch.cuda.synchronize()
            cells.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
        runner.token_logprobs = logprobs.token_logprobs
        print(f"| {rows} | {cells[0]:,.1f} | {cells[1]:,.1f} | {cells[2]:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
