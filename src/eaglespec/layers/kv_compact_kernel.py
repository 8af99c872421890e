"""The KV compaction after a tree verification as one Triton kernel per cache tensor (CUDA).

`engine/kv_cache.KVCache.compact` moves each row's accepted tree entries to contiguous positions in every layer. In
PyTorch that is an advanced-indexing gather and an index_put per cache tensor, with their index preparation: ~8
graph nodes of 1-5 us per tree step on the H200 (benchmarks/spec_phase_trace.py). Here one program per (layer, row)
loads the row's S+1 source entries whole and then stores them, so overlapping ranges are safe, as in the PyTorch
path (which gathers everything first).

`compact(cache, rows, start, path)`: cache [L, R, S_max, *entry] contiguous; rows [B] int64 cache rows; start [B]
int64; path [B, S1] int64 offsets: cache[l, rows[b], start[b] + i] = cache[l, rows[b], start[b] + path[b, i]] for
every layer l (the accepted path's entries, written at a tree's slots start + node id, moved to start + depth).
`fits(entry_numel, S1)` says which shapes it takes. Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

MAX_ENTRY = 8192  # elements of one position's entry (a row of BLOCK_S x entry values in one block)
MAX_MOVES = 64


def fits(entry: int, moves: int) -> bool:
    return 1 <= entry <= MAX_ENTRY and 1 <= moves <= MAX_MOVES


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def compact_kernel(cache, rows, start, path, R, S_MAX, E, S1, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr,
                       PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        layer = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1).to(tl.int64)
        i = tl.arange(0, BLOCK_S)
        im = i < S1
        e = tl.arange(0, BLOCK_E)
        em = e < E
        row = layer * R + tl.load(rows + b)
        L = tl.load(start + b)
        s = L + tl.load(path + b * S1 + i, mask=im, other=0)
        d = L + i
        m = im[:, None] & em[None, :]
        v = tl.load(cache + (row * S_MAX + s)[:, None] * E + e[None, :], mask=m)
        tl.store(cache + (row * S_MAX + d)[:, None] * E + e[None, :], v, mask=m)

    return compact_kernel


def compact(cache: torch.Tensor, rows: torch.Tensor, start: torch.Tensor, path: torch.Tensor) -> None:
    L, R, S_MAX = cache.shape[:3]
    E = cache[0, 0, 0].numel()
    B, S1 = path.shape
    assert cache.is_contiguous() and fits(E, S1), "kv compact: shape"
    BLOCK_E = pow2(E, 16)
    _kernel()[(L, B)](cache, rows.contiguous(), start.contiguous(), path.contiguous(), R, S_MAX, E, S1,
                      BLOCK_S=pow2(S1, 2), BLOCK_E=BLOCK_E,
                      num_warps=4 if BLOCK_E <= 1024 else 8, **launch_options(cache))
