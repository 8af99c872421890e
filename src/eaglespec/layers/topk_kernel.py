"""The top K log-probabilities of a few rows of logits in one Triton kernel: a tree's per-level draft selection.

A draft tree's every level (and its catch-up) takes the K best draft tokens of K rows of draft-vocabulary logits with
their log-probabilities. PyTorch spends ~40 us on that on the H200 for 4 rows of 12,288 (session 9's
`benchmarks/tree_draft_probe.py` profile: a float copy, a log-softmax kernel of 8.3 us, whose 4 blocks leave the chip
idle, and topk's multi-block radix select, 5 kernels and 2 memsets per call, ~33 us), about a fifth of a tree step's
drafting. Rows of up to SPLIT entries: one program per row loads the whole row once, computes its log-sum-exp, and
takes K maxima in turn. Longer rows (a draft vocabulary) in two kernels, since one program per row left the chip
idle (session 10's tree probe profile on the H200: 11.3 us per call, a quarter of a tree's drafting): programs of
CHUNK entries each keep their chunk's max, sum of exp and K best (value, index) pairs, then one program per row
merges the chunks' sums (log-sum-exp) and takes the K best of their C x K candidates. The K best of a row lie among
its chunks' K best, so the ids are exactly the one-program kernel's; log-probabilities differ by float32 rounding.
Measured (H200, bf16, session 11): 4 rows of 12,288, K = 4, 9.5 -> 4.9 us per call; a tree S4 K4 D16 step 1.50 ->
1.39 ms (benchmarks/small_kernels_check.py --only=topk, tree_draft_probe.py).

`logsoftmax_topk(logits, k) -> (ids, logp)`: logits [..., V] (any float dtype) -> ids [..., k] int64 and logp [...,
k] float32, the k largest log-softmax values in descending order; among equal values the smaller index first.
Values equal `log_softmax(x.float())`'s up to float32 rounding (max - logsumexp is computed as (x - max) - log(sum
exp(x - max)), as PyTorch does).
`topk_values(x, k) -> (ids, values)`: the same selection of the raw values (float32), no log-softmax: a tree's
frontier (the K best of K^2 cumulative scores per row) and the D-1 best of its candidates (`spec/tree.build_tree`),
where PyTorch's topk / stable sort cost 2 kernels of 4-6 us each (session 10's profile of the draft graph). The
order is a stable descending sort's: among equal values the smaller index first.
`fits(V, k)`: V <= MAX_VOCAB and k <= MAX_K (the row is held in registers).
`chunk_candidates(x, k)`: the two-kernel path's first stage alone, for another second stage
(layers/logprobs_kernel.py): each CHUNK of each row's max, sum of exp(x - max) and k best (index, value) pairs.
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

MAX_VOCAB = 1 << 17  # 131,072 entries per row: at 16 warps, 256 float32 registers per thread
MAX_K = 16
SPLIT = 2048  # rows longer than this take the two-kernel path
CHUNK = 1024  # entries per first-stage program
_NONE = 1 << 30  # index of "no entry" (a chunk with fewer than K entries)


def fits(V: int, k: int) -> bool:
    return 1 <= k <= min(MAX_K, V) and V <= MAX_VOCAB


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def logsoftmax_topk_kernel(x, ids, vals, V, s_x, K: tl.constexpr, BLOCK: tl.constexpr,
                               LOG_SOFTMAX: tl.constexpr = True, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
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


@functools.cache
def _split_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def chunk_kernel(x, cids, cvals, cmax, csum, V, s_x, C, K: tl.constexpr, CHUNK: tl.constexpr, NONE: tl.constexpr,
                     LOG_SOFTMAX: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        # program (row r, chunk c) -> its chunk's max and sum of exp(x - max), and its K best (value, index) pairs
        r = tl.program_id(0)
        c = tl.program_id(1)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        valid = offs < V
        v = tl.load(x + r * s_x + offs, mask=valid, other=float("-inf")).to(tl.float32)
        out = (r * C + c) * K
        if LOG_SOFTMAX:
            mx = tl.max(v, 0)
            safe = tl.where(mx == float("-inf"), 0.0, mx)  # an all -inf chunk adds 0, not NaN
            tl.store(cmax + r * C + c, mx)
            tl.store(csum + r * C + c, tl.sum(tl.where(valid, tl.exp(v - safe), 0.0), 0))
        free = valid
        for j in tl.static_range(K):
            best = tl.max(tl.where(free, v, float("-inf")), 0)
            idx = tl.min(tl.where(free & (v == best), offs, NONE), 0)  # NONE once the chunk has no entry left
            tl.store(cids + out + j, idx)
            tl.store(cvals + out + j, best)
            free = free & (offs != idx)

    @triton.jit
    def merge_kernel(cids, cvals, cmax, csum, ids, vals, C, K: tl.constexpr, CK: tl.constexpr, CB: tl.constexpr,
                     NONE: tl.constexpr, LOG_SOFTMAX: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        # program r -> the row's log-sum-exp from its chunks', and the K best of its C x K candidates
        r = tl.program_id(0)
        o = tl.arange(0, CK)
        ok = o < C * K
        v = tl.load(cvals + r * C * K + o, mask=ok, other=float("-inf"))
        i = tl.load(cids + r * C * K + o, mask=ok, other=NONE)
        if LOG_SOFTMAX:
            oc = tl.arange(0, CB)
            okc = oc < C
            m = tl.load(cmax + r * C + oc, mask=okc, other=float("-inf"))
            mx = tl.max(m, 0)
            safe = tl.where(mx == float("-inf"), 0.0, mx)
            scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - safe))
            log_sum = tl.log(tl.sum(tl.load(csum + r * C + oc, mask=okc, other=0.0) * scale, 0))
        free = i < NONE
        for j in tl.static_range(K):
            best = tl.max(tl.where(free, v, float("-inf")), 0)
            idx = tl.min(tl.where(free & (v == best), i, NONE), 0)  # the smallest index among equal values
            tl.store(ids + r * K + j, idx.to(tl.int64))
            if LOG_SOFTMAX:
                tl.store(vals + r * K + j, (best - mx) - log_sum)
            else:
                tl.store(vals + r * K + j, best)
            free = free & (i != idx)

    return chunk_kernel, merge_kernel


def logsoftmax_topk(logits: torch.Tensor, k: int, log_softmax: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, V = logits.shape
    assert fits(V, k), f"logsoftmax_topk: V={V} k={k}"
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    R = x.shape[0]
    dev = logits.device
    ids = torch.empty(R, k, dtype=torch.int64, device=dev)
    vals = torch.empty(R, k, dtype=torch.float32, device=dev)
    if V > SPLIT:
        cids, cvals, cmax, csum = chunk_candidates(x, k, log_softmax)
        C = cmax.shape[1]
        merge = _split_kernels()[1]
        merge[(R,)](cids, cvals, cmax, csum, ids, vals, C, K=k, CK=pow2(C * k, 16),
                    CB=pow2(C, 16), NONE=_NONE, LOG_SOFTMAX=log_softmax, num_warps=4,
                    **launch_options(x))
        return ids.view(*lead, k), vals.view(*lead, k)
    block = pow2(V, 16)
    warps = 4 if block <= 4096 else 8 if block <= 16384 else 16
    _kernel()[(R,)](x, ids, vals, V, x.stride(0), K=k, BLOCK=block, LOG_SOFTMAX=log_softmax, num_warps=warps,
                    **launch_options(x))
    return ids.view(*lead, k), vals.view(*lead, k)


def chunk_candidates(x: torch.Tensor, k: int, log_softmax: bool = True) -> tuple[torch.Tensor, ...]:
    """x [R, V] (unit stride along V) -> (cids [R, C, k] int32, cvals [R, C, k] float32, cmax [R, C], csum [R, C]):
    each chunk's k best entries (index _NONE past its end) and, with `log_softmax`, its max and sum of exp(x - max);
    C = ceil(V / CHUNK)."""
    R, V = x.shape
    C = (V + CHUNK - 1) // CHUNK
    dev = x.device
    cids = torch.empty(R, C, k, dtype=torch.int32, device=dev)
    cvals = torch.empty(R, C, k, dtype=torch.float32, device=dev)
    cmax = torch.empty(R, C, dtype=torch.float32, device=dev)
    csum = torch.empty(R, C, dtype=torch.float32, device=dev)
    _split_kernels()[0][(R, C)](x, cids, cvals, cmax, csum, V, x.stride(0), C, K=k, CHUNK=CHUNK, NONE=_NONE,
                                LOG_SOFTMAX=log_softmax, num_warps=4, **launch_options(x))
    return cids, cvals, cmax, csum


def topk_values(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return logsoftmax_topk(x, k, log_softmax=False)
