"""The top K log-probabilities of a few rows of logits in one Triton kernel: a tree's per-level draft selection.

A draft tree's every level (and its catch-up) takes the K best draft tokens of K rows of draft-vocabulary logits with
their log-probabilities. PyTorch spends ~40 us on that on the H200 for 4 rows of 12,288 (session 9's
`benchmarks/tree_draft_probe.py` profile: a float copy, a log-softmax kernel of 8.3 us, whose 4 blocks leave the chip
idle, and topk's multi-block radix select, 5 kernels and 2 memsets per call, ~33 us), about a fifth of a tree step's
drafting. Here one program per row loads the whole row once, computes its log-sum-exp, and takes K maxima in turn.

`logsoftmax_topk(logits, k) -> (ids, logp)`: logits [..., V] (any float dtype) -> ids [..., k] int64 and logp [...,
k] float32, the k largest log-softmax values in descending order; among equal values the smaller index first.
Values equal `log_softmax(x.float())`'s up to float32 rounding (max - logsumexp is computed as (x - max) - log(sum
exp(x - max)), as PyTorch does).
`topk_values(x, k) -> (ids, values)`: the same selection of the raw values (float32), no log-softmax: a tree's
frontier (the K best of K^2 cumulative scores per row) and the D-1 best of its candidates (`spec/tree.build_tree`),
where PyTorch's topk / stable sort cost 2 kernels of 4-6 us each (session 10's profile of the draft graph). The
order is a stable descending sort's: among equal values the smaller index first.
`fits(V, k)`: V <= MAX_VOCAB and k <= MAX_K (the row is held in registers).
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

MAX_VOCAB = 1 << 17  # 131,072 entries per row: at 16 warps, 256 float32 registers per thread
MAX_K = 16


def fits(V: int, k: int) -> bool:
    return 1 <= k <= min(MAX_K, V) and V <= MAX_VOCAB


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def logsoftmax_topk_kernel(x, ids, vals, V, s_x, K: tl.constexpr, BLOCK: tl.constexpr,
                               LOG_SOFTMAX: tl.constexpr = True):
        r = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        v = tl.load(x + r * s_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        if LOG_SOFTMAX:
            mx = tl.max(v, 0)
            log_sum = tl.log(tl.sum(tl.exp(v - mx), 0))
        free = offs < V  # entries not taken yet (a taken one is not taken again, even among -inf values)
        for j in tl.static_range(K):
            best = tl.max(tl.where(free, v, float("-inf")), 0)
            idx = tl.min(tl.where(free & (v == best), offs, BLOCK), 0)  # the smallest index among equal maxima
            tl.store(ids + r * K + j, idx.to(tl.int64))
            if LOG_SOFTMAX:
                tl.store(vals + r * K + j, (best - mx) - log_sum)
            else:
                tl.store(vals + r * K + j, best)
            free = free & (offs != idx)

    return logsoftmax_topk_kernel


def logsoftmax_topk(logits: torch.Tensor, k: int, log_softmax: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, V = logits.shape
    assert fits(V, k), f"logsoftmax_topk: V={V} k={k}"
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    R = x.shape[0]
    ids = torch.empty(R, k, dtype=torch.int64, device=logits.device)
    vals = torch.empty(R, k, dtype=torch.float32, device=logits.device)
    block = max(16, 1 << (V - 1).bit_length())
    warps = 4 if block <= 4096 else 8 if block <= 16384 else 16
    _kernel()[(R,)](x, ids, vals, V, x.stride(0), K=k, BLOCK=block, LOG_SOFTMAX=log_softmax, num_warps=warps)
    return ids.view(*lead, k), vals.view(*lead, k)


def topk_values(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return logsoftmax_topk(x, k, log_softmax=False)
