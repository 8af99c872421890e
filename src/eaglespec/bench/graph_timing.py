"""Time of one call of a small operator as the engine's CUDA graphs see it (benchmarks' kernel comparisons).

`per_call_us(fn, calls=50, device)`: on CUDA, fn is warmed up on a side stream, captured `calls` times in one CUDA
graph and replayed 10 times: the result is the mean time per call in microseconds, launch gaps included as in the
engine's graphs. On the CPU one eager call timed by the host clock (a check that the caller's script runs).
`capture(fn, calls=1)`: that CUDA graph (fn warmed up three times on a side stream, then `calls` calls captured),
for a caller that replays several graphs in its own order.
"""

from __future__ import annotations

import time
from typing import Callable

import torch


def capture(fn: Callable[[], object], calls: int = 1) -> "torch.cuda.CUDAGraph":
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def per_call_us(fn: Callable[[], object], calls: int = 50, device: torch.device | str = "cuda") -> float:
    if torch.device(device).type != "cuda":
        t = time.perf_counter()
        fn()
        return 1e6 * (time.perf_counter() - t)
    g = capture(fn, calls)
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - t) / (10 * calls)
