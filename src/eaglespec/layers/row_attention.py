"""Row-invariant attention over the KV cache: each query token's output has the same bits whatever the forward it is
in (a one-token decode step, a D-token chain or tree verify, a batch of rows), given the same visible keys.

Why: in float32 a speculative verify and plain decoding round their attention a little differently (SDPA's blocking
depends on the query count, a tree's masked keys sit between visible ones), ~1e-7 that has not flipped an MT-bench
argmax; in bf16 (the 4-bit CPU path, engine/int4_weights.py) such differences flip tokens (session 62's probe: 1 of 6
answers equal). Here every query row is computed alone, over its visible keys gathered into the order plain decoding
holds them (cache positions ascending: the committed prefix, then the query's ancestors in the tree), in float32:
`q [Hkv, G, D] @ k^T [Hkv, D, n]`, softmax over n, `@ v [Hkv, n, D]`, the same three calls with the same shapes and
strides as the one-token step at that position makes. A chain's visible keys are a prefix of the cache (a view, as
plain decoding's); a tree's are gathered into a contiguous copy of the same layout. `tests/test_int4_weights.py`
checks the invariance and the speculative outputs on the machine that runs the tests.

`attend_rows(q, ctx, cache, scale, window, sinks, softcap)`: q [B, T, H, D] (RoPE applied, this forward's keys already
in the cache), the cache pair [Bc, S, Hkv, D], ctx's mask [B, T, K] (a sliding window's or chunk's from
`ctx.mask(window)`) -> [B, T, H, D] in q's dtype. `sinks` [H] and `softcap` as `attention.sdpa_written_out`. Costs a
few small ops a query row and layer, so `GQAAttention` takes it only for forwards of at most ROW_MAX_TOKENS tokens
that read the cache and are not a fresh causal prefill (the two engines being compared prefill alike).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .context import Chunk, ForwardContext

# the most tokens a forward may have to take the row-wise path (a verify's draft tokens, a short prefill); longer ones
# (prefills, the same in a speculative engine as in a plain one) keep SDPA
ROW_MAX_TOKENS = 64


def takes_rows(ctx: ForwardContext, cache: Sequence[torch.Tensor] | None, tokens: int) -> bool:
    """Whether a forward of `tokens` tokens a row goes row by row (in a row-invariant layer): it reads the cache and
    is not a fresh causal prefill (decode and verify steps, a reused prefix's short suffix), and has at most
    ROW_MAX_TOKENS tokens. `GQAAttention` and the 4-bit path's layer step (engine/int4_step.py) take the same
    forwards."""
    return cache is not None and ctx.write_index is not None and not ctx.causal and tokens <= ROW_MAX_TOKENS


def visible_keys(ctx: ForwardContext, window: int | Chunk | None) -> list[list[torch.Tensor | int]]:
    """Per (row, token): the visible key count n where they are the cache's prefix [0, n), else their positions
    [n] int64 ascending (built once a forward and window: the layers share it)."""
    key = ("row_visible", window)
    if key not in ctx._memo:
        mask = ctx.mask(window)
        out = []
        for b in range(mask.shape[0]):
            row = []
            for t in range(mask.shape[1]):
                idx = mask[b, t].nonzero().flatten()
                n = idx.numel()
                row.append(n if n == 0 or int(idx[-1]) == n - 1 else idx)
            out.append(row)
        ctx._memo[key] = out
    return ctx._memo[key]


def attend_rows(q: torch.Tensor, ctx: ForwardContext, cache: Sequence[torch.Tensor], scale: float | None = None,
                window: int | Chunk | None = None, sinks: torch.Tensor | None = None,
                softcap: float | None = None) -> torch.Tensor:
    """Module docstring."""
    k_cache, v_cache = cache
    B, T, H, D = q.shape
    Hkv = k_cache.shape[2]
    g = H // Hkv  # query head h reads KV head h // g
    rows = ctx.row_index(B).tolist()
    visible = visible_keys(ctx, window)
    s_scale = scale if scale is not None else D**-0.5
    out = torch.empty(B, T, H, D, dtype=q.dtype, device=q.device)
    for b in range(B):
        kc, vc = k_cache[rows[b]], v_cache[rows[b]]  # [S, Hkv, D]
        for t in range(T):
            vis = visible[b][t]
            if isinstance(vis, int):
                k, v = kc[:vis], vc[:vis]  # [n, Hkv, D], contiguous: a prefix of the row's cache
            else:
                k, v = kc[vis], vc[vis]  # the same layout, gathered
            qg = q[b, t].float().view(Hkv, g, D)
            s = torch.matmul(qg, k.float().permute(1, 2, 0)) * s_scale  # [Hkv, g, n]
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            if sinks is None:
                p = torch.softmax(s, -1)
            else:
                s = torch.cat((s, sinks.float().view(Hkv, g, 1)), -1)
                p = torch.softmax(s, -1)[..., :-1]
            out[b, t] = torch.matmul(p, v.float().permute(1, 0, 2)).view(H, D).to(q.dtype)  # [Hkv, g, D]
    return out
