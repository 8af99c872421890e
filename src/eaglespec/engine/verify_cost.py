"""What a forward of several tokens costs on this machine against one of a single token: the measurement behind
`draft="auto"`'s choice on the CPU (`api.load`, with the thresholds of `assets.cpu_max_verify_cost`).

Speculation gains only when verifying D tokens costs well under D decode steps. On a GPU a few-token forward costs
about a one-token one (weights are read once, compute is idle), and the policy there is measured per device type.
On a CPU it depends on the machine and on how the projections are computed: on one 2-core machine a 3-token forward
of SmolLM2 cost 1.0x a 1-token one (session 9: S2 K1 D3 1.46x), on another (an AMD EPYC) 1.64-1.80x through
F.linear's few-row GEMMs (session 18: 0.90-0.99x) and 1.01-1.07x for 2-4 tokens through the weight-major projections
that the CPU now runs (session 19, layers/cpu_linear.py). So the CPU's choice is measured where it runs, on the
target as the engine will run it (after `prepare_for_inference`).

`verify_cost_ratio(model, tokens, repeats=3) -> float`: the fastest of `repeats` cache-free forwards of 1 x tokens
positions, divided by the fastest of `repeats` of 1 x 1, the two sizes alternating after one warm-up of each (no
grad; the logits of every position are computed, as a verify computes them). Alternating matters on a shared
machine: timed one size after the other (two of each, as `api.load` asks), the ratio for SmolLM2's 4 tokens ranged
0.87-1.28 over 12 calls on an idle 2-core VM, against 0.94-1.15 alternating three of each (session 33), and a busy
spell during one size's forwards moved `draft="auto"`'s choice across the 1.3 threshold. About 0.6 s for SmolLM2 on
a 2-core CPU.
"""

from __future__ import annotations

import time

import torch

from ..layers.context import ForwardContext


def _forward_s(model: torch.nn.Module, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(ids, ForwardContext.plain(1, ids.shape[1], ids.device))
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    return time.perf_counter() - t0


@torch.no_grad()
def verify_cost_ratio(model: torch.nn.Module, tokens: int, repeats: int = 3) -> float:
    """(time of a forward of `tokens` positions) / (time of one of 1 position), fastest of `repeats` each, the two
    sizes alternating."""
    if tokens < 1 or repeats < 1:
        raise ValueError(f"verify_cost_ratio: tokens and repeats must be >= 1 (got {tokens}, {repeats})")
    device = next(model.parameters()).device
    one, many = (torch.zeros(1, n, dtype=torch.long, device=device) for n in (1, tokens))
    _forward_s(model, one), _forward_s(model, many)  # warm-up
    best_one = best_many = float("inf")
    for _ in range(repeats):
        best_one = min(best_one, _forward_s(model, one))
        best_many = min(best_many, _forward_s(model, many))
    return best_many / best_one
