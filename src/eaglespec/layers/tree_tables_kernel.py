"""A draft tree's ancestor and path tables in one Triton kernel (CUDA): the walk up the tree of `spec/tree.py`.

`spec/tree.ancestor_tables` walks all nodes up one level per step with PyTorch operators: two scatters and a gather
per level, about 4 x (S + 1) + 5 small kernels per tree step (~25 for S = 4), each a CUDA-graph node of 1-3 us on the
H200. Here one program per row holds the row's nodes as a vector, walks them up S + 1 times reading the parents
from memory, and writes both tables whole (no zero fill first).

`ancestor_tables(parents, depth, max_depth) -> (ancestors, paths)`: parents [B, D] int64 (-1: the root), depth [B, D]
int64 (root 0) -> ancestors [B, D, D] bool (ancestors[b, i, j]: node j is node i or one of its ancestors) and paths
[B, D, max_depth + 1] int64 (paths[b, i, d]: node i's ancestor at depth d for d <= depth[i], else -1), exactly the
values of the PyTorch walk. `fits(D, max_depth)`: D <= MAX_NODES. Built on first use, so that `TRITON_INTERPRET=1`
(CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

MAX_NODES = 128


def fits(D: int, max_depth: int) -> bool:
    return 1 <= D <= MAX_NODES and max_depth >= 0


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def tree_tables_kernel(parents, depth, anc, paths, D, S1, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                           STEPS: tl.constexpr):
        b = tl.program_id(0)
        i = tl.arange(0, BLOCK_D)
        real = i < D
        cols = tl.arange(0, BLOCK_D)
        pcols = tl.arange(0, BLOCK_S)
        dep = tl.load(depth + b * D + i, mask=real, other=0)
        a = tl.where(real, i, -1).to(tl.int64)  # a_0: every node itself; -1 past the root (and for padding)
        is_anc = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.int8)
        path = tl.full([BLOCK_D, BLOCK_S], -1, dtype=tl.int64)
        for j in tl.static_range(STEPS):  # STEPS = S + 1: a_j for j = 0..S
            is_anc = is_anc | (a[:, None] == cols[None, :]).to(tl.int8)
            path = tl.where(pcols[None, :] == (dep - j)[:, None], a[:, None], path)
            a = tl.load(parents + b * D + a, mask=a >= 0, other=-1)
        tl.store(anc + b * D * D + i[:, None] * D + cols[None, :], is_anc, mask=real[:, None] & (cols < D)[None, :])
        tl.store(paths + b * D * S1 + i[:, None] * S1 + pcols[None, :], path,
                 mask=real[:, None] & (pcols < S1)[None, :])

    return tree_tables_kernel


def ancestor_tables(parents: torch.Tensor, depth: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, D = parents.shape
    assert fits(D, max_depth), f"tree tables: D={D}"
    S1 = max_depth + 1
    p = parents.contiguous()
    dp = depth.contiguous()
    anc = torch.empty(B, D, D, dtype=torch.bool, device=parents.device)
    paths = torch.empty(B, D, S1, dtype=torch.int64, device=parents.device)
    # the bool table is written as bytes 0 / 1
    _kernel()[(B,)](p, dp, anc.view(torch.int8), paths, D, S1, BLOCK_D=max(16, 1 << (D - 1).bit_length()),
                    BLOCK_S=max(2, 1 << (S1 - 1).bit_length()), STEPS=S1, num_warps=4)
    return anc, paths
