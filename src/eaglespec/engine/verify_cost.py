"""What forwards of several tokens cost on this machine against one of a single token: the measurement behind
`draft="auto"`'s choice on the CPU (`api.auto_spec`, with the policy of `assets.cpu_sizes` / `assets.cpu_choice`).

Speculation gains only when verifying D tokens costs well under D decode steps. On a GPU a few-token forward costs
about a one-token one (weights are read once, compute is idle), and the policy there is measured per device type.
On a CPU it depends on the machine and on how the projections are computed: on one 2-core machine a 3-token forward
of SmolLM2 cost 1.0x a 1-token one (session 9: S2 K1 D3 1.46x), on another (an AMD EPYC) 1.64-1.80x through
F.linear's few-row GEMMs (session 18: 0.90-0.99x), 1.01-1.07x for 2-4 tokens through weight-major projections
(session 19), 1.24-1.3x for 3-6 tokens through oneDNN's packed copies (session 61), and on an Intel Xeon whose MKL
serves 3 rows at about the cost of 1 and jumps at 4, 1.1x for 3 tokens against 1.35x for 4 and 1.43x for 6
(session 68, layers/cpu_linear.py). So the CPU's choice is measured where it runs, on the target as the engine will
run it (after `prepare_for_inference`).

`verify_cost_ratios(model, sizes, repeats=5) -> {size: ratio}`: cache-free forwards of 1 x n positions (no grad;
the logits of every position computed, as a verify computes them), after one warm-up of each size, timed in
`repeats` rounds of 1 token then each size in turn; a size's ratio is the median over the rounds of its time over
the same round's 1-token time. Both choices matter on a shared machine, whose speed drifts between seconds and
whose single forwards are sometimes hit by a busy spell. Timed one size after the other (two of each), the ratio for
SmolLM2's 4 tokens ranged 0.87-1.28 over 12 calls on an idle 2-core VM, against 0.94-1.15 alternating (session 33).
Session 68 (a 2-core Xeon, sizes 3 / 4 / 6 together): as the fastest of each size over the fastest of 1 token, the
greedy choice these ratios feed (`assets.cpu_choice`) came out the same (the chain of 2) in 8 of 12 calls (3 of
them, at 3 rounds: 9 of 12); as the median of each round's ratio, in 11 of 12. About 1.1 s for SmolLM2's sizes 3, 4
and 6 on a 2-core CPU (0.2 s a round).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable

import torch

from ..layers.context import ForwardContext


def _forward_s(model: torch.nn.Module, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(ids, ForwardContext.plain(1, ids.shape[1], ids.device))
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    return time.perf_counter() - t0


@torch.no_grad()
def verify_cost_ratios(model: torch.nn.Module, sizes: Iterable[int], repeats: int = 5) -> dict[int, float]:
    """{n: (time of a forward of n positions) / (time of one of 1 position)} for each of `sizes`: the median over
    `repeats` rounds (1 token, then each size) of each round's ratio."""
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 1 or repeats < 1:
        raise ValueError(f"verify_cost_ratios: sizes must be >= 1 and repeats >= 1 (got {sizes}, {repeats})")
    device = next(model.parameters()).device
    ids = {n: torch.zeros(1, n, dtype=torch.long, device=device) for n in [1] + sizes}
    for x in ids.values():  # warm-up
        _forward_s(model, x)
    rounds: dict[int, list[float]] = {n: [] for n in sizes}  # size -> each round's ratio
    for _ in range(repeats):
        one = _forward_s(model, ids[1])
        for n in sizes:
            rounds[n].append(_forward_s(model, ids[n]) / one)
    return {n: statistics.median(r) for n, r in rounds.items()}
