"""Packed log-probability rows (layers/logprobs.py's format) in two Triton kernels: the CUDA path of `token_logprobs`.

PyTorch's path (a float copy of the logits, log-sum-exp, a gather, topk's radix select, the assembly) is ~14 kernels
a step, which on the H200 cost SmolLM2 15-18% of its tok/s when a request asked for log-probabilities (session 46,
benchmarks/logprobs_check.py). Here: the first stage of the top-k kernel (layers/topk_kernel.chunk_candidates:
each chunk's max, sum of exp and k best), then one program per row that merges its chunks into the row's log-sum-exp,
reads the chosen token's logit and writes the packed row [logprob, then (log-probability, id) of the k best] at once.
The ids are exactly PyTorch topk's on rows without ties (among equal values the smaller index first); values agree
to float32 rounding.

`fits(V, k)`: V <= topk_kernel.MAX_VOCAB and k <= logprobs.MAX_TOP_LOGPROBS.
`packed_rows(logits, tokens, k)`: logits [N, V] (any float dtype), tokens [N] int64 -> [N, 1 + 2k] float32.
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from . import topk_kernel
from .block_size import pow2
from .pdl import launch_options


def fits(V: int, k: int) -> bool:
    from .logprobs import MAX_TOP_LOGPROBS

    return V <= topk_kernel.MAX_VOCAB and 0 <= k <= MAX_TOP_LOGPROBS


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def packed_kernel(x, s_x, tok, cids, cvals, cmax, csum, out, C, K: tl.constexpr, KC: tl.constexpr,
                      CK: tl.constexpr, CB: tl.constexpr, NONE: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        # program r -> the row's log-sum-exp from its chunks', the chosen token's log-probability, the K best
        r = tl.program_id(0)
        oc = tl.arange(0, CB)
        okc = oc < C
        m = tl.load(cmax + r * C + oc, mask=okc, other=float("-inf"))
        mx = tl.max(m, 0)
        safe = tl.where(mx == float("-inf"), 0.0, mx)
        scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - safe))
        log_sum = tl.log(tl.sum(tl.load(csum + r * C + oc, mask=okc, other=0.0) * scale, 0))
        W = 1 + 2 * K
        t = tl.load(tok + r)
        xt = tl.load(x + r * s_x + t).to(tl.float32)
        tl.store(out + r * W, (xt - mx) - log_sum)
        if K > 0:
            o = tl.arange(0, CK)
            ok = o < C * KC
            v = tl.load(cvals + r * C * KC + o, mask=ok, other=float("-inf"))
            i = tl.load(cids + r * C * KC + o, mask=ok, other=NONE)
            free = i < NONE
            for j in tl.static_range(K):
                best = tl.max(tl.where(free, v, float("-inf")), 0)
                idx = tl.min(tl.where(free & (v == best), i, NONE), 0)  # the smallest index among equal values
                tl.store(out + r * W + 1 + 2 * j, (best - mx) - log_sum)
                tl.store(out + r * W + 2 + 2 * j, idx.to(tl.float32))
                free = free & (i != idx)

    return packed_kernel


def packed_rows(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """logits [N, V], tokens [N] -> [N, 1 + 2k] float32 (module docstring)."""
    N, V = logits.shape
    assert fits(V, k), f"packed_rows: V={V} k={k}"
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    kc = max(k, 1)  # the first stage takes at least one candidate per chunk (k = 0 reads none of them)
    cids, cvals, cmax, csum = topk_kernel.chunk_candidates(x, kc)
    C = cmax.shape[1]
    out = torch.empty(N, 1 + 2 * k, dtype=torch.float32, device=logits.device)
    _kernel()[(N,)](x, x.stride(0), tokens, cids, cvals, cmax, csum, out, C, K=k, KC=kc, CK=pow2(C * kc, 16),
                    CB=pow2(C, 16), NONE=topk_kernel._NONE, num_warps=4, **launch_options(x))
    return out
