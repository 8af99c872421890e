"""A draft tree's tables and its greedy acceptance as Triton kernels (CUDA): the walk up the tree of `spec/tree.py`
and the rule of `spec/verify.verify_greedy` after the argmax, one program per row each.

Both replace chains of small PyTorch operators, each a CUDA-graph node of 1-3 us on the H200 in every tree step:
`spec/tree.ancestor_tables` walks all nodes up one level per step (two scatters and a gather per level, ~4 x (S + 1)
+ 5 operators), `verify_greedy` turns the argmax at each node into the accepted path and the committed tokens with
~20 (gathers, masks, an any, an argmax, a concatenation). Here each row's tables are read once and every result is
written whole (no zero fill first).

`ancestor_tables(parents, depth, max_depth) -> (ancestors, paths)`: parents [B, D] int64 (-1: the root), depth [B, D]
int64 (root 0) -> ancestors [B, D, D] bool (ancestors[b, i, j]: node j is node i or one of its ancestors) and paths
[B, D, max_depth + 1] int64 (paths[b, i, d]: node i's ancestor at depth d for d <= depth[i], else -1), exactly the
values of the PyTorch walk.

`accept_greedy(pred, tokens, parents, depth, ancestors, paths) -> (accept_len, best, path, committed, bonus)`:
pred [B, D] int64 (the target's argmax at each node), the tree's tokens / parents / depth [B, D] int64, ancestors
[B, D, D] bool, paths [B, D, S+1] int64 (spec/tree.DraftTree) -> accept_len [B], best [B], path [B, S+1], committed
[B, S+1], bonus [B], the fields of `spec/verify.VerifyResult` with exactly the values of the PyTorch rule: a node is
accepted when every node on its path carries the argmax of its parent; best = the deepest accepted node (the first
in node order among equals, torch.argmax's rule); path = its root-to-node path padded with best; committed = the
accepted draft tokens, then the bonus (the argmax at best) and the bonus as padding.

`accept_greedy_chain(pred, tokens, S1) -> (accept_len, path, committed, bonus)`: the same for a chain (node i at
depth i), whose tables are constants: the leading run of nodes carrying the argmax of the node before
(`spec/verify.verify_greedy_chain`'s rule, best = accept_len), one program per row reading pred and tokens only.

`fits(D, max_depth)`: D <= MAX_NODES (a row's D x D table in one block). Built on first use, so that
`TRITON_INTERPRET=1` (CPU tests) takes effect. Bool tables are read and written as bytes 0 / 1.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

MAX_NODES = 128


def fits(D: int, max_depth: int) -> bool:
    return 1 <= D <= MAX_NODES and max_depth >= 0


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def ancestor_tables_kernel(parents, depth, anc, paths, D, S1, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                           STEPS: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
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


    @triton.jit
    def accept_greedy_kernel(pred, tokens, parents, depth, anc, paths, m_out, best_out, path_out, tok_out,
                             bonus_out, D, S1, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        i = tl.arange(0, BLOCK_D)
        real = i < D
        row = b * D
        tok = tl.load(tokens + row + i, mask=real, other=0)
        par = tl.load(parents + row + i, mask=real, other=-1)
        dep = tl.load(depth + row + i, mask=real, other=-1)
        parent_pred = tl.load(pred + row + tl.maximum(par, 0), mask=real & (par >= 0), other=0)
        correct = (tok == parent_pred) | (par < 0)  # [BLOCK_D]; the root (and padding) is always correct
        a = tl.load(anc + b * D * D + i[:, None] * D + i[None, :], mask=real[:, None] & real[None, :], other=0)
        bad = (a != 0) & (correct == 0)[None, :]  # node i has an ancestor-or-self j that is wrong
        ok = (tl.sum(bad.to(tl.int32), axis=1) == 0) & real
        key = tl.where(ok, dep, -1)
        m = tl.max(key, 0)  # the accepted depth (the root is always accepted: m >= 0)
        best = tl.min(tl.where(key == m, i, BLOCK_D), 0)  # the first node of that depth
        bonus = tl.load(pred + row + best)
        s = tl.arange(0, BLOCK_S)
        sm = s < S1
        prow = paths + (row + best) * S1
        path = tl.load(prow + s, mask=sm, other=-1)
        path = tl.where(path >= 0, path, best)
        nxt = tl.load(prow + s + 1, mask=(s + 1) < S1, other=-1)  # path[k + 1]: the k-th accepted draft
        drafted = tl.load(tokens + row + tl.where(nxt >= 0, nxt, best))
        committed = tl.where(s < m, drafted, bonus)
        tl.store(m_out + b, m.to(tl.int64))
        tl.store(best_out + b, best.to(tl.int64))
        tl.store(bonus_out + b, bonus)
        tl.store(path_out + b * S1 + s, path.to(tl.int64), mask=sm)
        tl.store(tok_out + b * S1 + s, committed, mask=sm)

    @triton.jit
    def accept_chain_kernel(pred, tokens, m_out, path_out, tok_out, bonus_out, D, S1, BLOCK_D: tl.constexpr,
                            BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        row = b * D
        i = tl.arange(0, BLOCK_D)
        dm = i < D - 1  # node i + 1 is the draft after node i
        hit = (tl.load(tokens + row + i + 1, mask=dm, other=-1) == tl.load(pred + row + i, mask=dm, other=-2)) & dm
        m = tl.min(tl.where(hit, BLOCK_D, i), 0)  # the first miss: the leading run of hits (D - 1 when all hit)
        bonus = tl.load(pred + row + m)
        s = tl.arange(0, BLOCK_S)
        sm = s < S1
        drafted = tl.load(tokens + row + s + 1, mask=(s + 1) < D, other=0)
        tl.store(m_out + b, m.to(tl.int64))
        tl.store(bonus_out + b, bonus)
        tl.store(path_out + b * S1 + s, tl.minimum(s, m).to(tl.int64), mask=sm)
        tl.store(tok_out + b * S1 + s, tl.where(s < m, drafted, bonus), mask=sm)

    return ancestor_tables_kernel, accept_greedy_kernel, accept_chain_kernel


def ancestor_tables(parents: torch.Tensor, depth: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, D = parents.shape
    assert fits(D, max_depth), f"tree tables: D={D}"
    S1 = max_depth + 1
    p = parents.contiguous()
    dp = depth.contiguous()
    anc = torch.empty(B, D, D, dtype=torch.bool, device=parents.device)
    paths = torch.empty(B, D, S1, dtype=torch.int64, device=parents.device)
    _kernels()[0][(B,)](p, dp, anc.view(torch.int8), paths, D, S1, BLOCK_D=pow2(D, 16),
                    BLOCK_S=pow2(S1, 2), STEPS=S1, num_warps=4, **launch_options(p))
    return anc, paths


def accept_greedy(pred: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor,
                  ancestors: torch.Tensor, paths: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, D = tokens.shape
    S1 = paths.shape[-1]
    assert fits(D, S1 - 1), f"accept_greedy: D={D}"
    dev = tokens.device
    m, best, bonus = (torch.empty(B, dtype=torch.int64, device=dev) for _ in range(3))
    path = torch.empty(B, S1, dtype=torch.int64, device=dev)
    committed = torch.empty(B, S1, dtype=torch.int64, device=dev)
    _kernels()[1][(B,)](pred.contiguous(), tokens.contiguous(), parents.contiguous(), depth.contiguous(),
                    ancestors.contiguous().view(torch.int8), paths.contiguous(), m, best, path, committed, bonus, D,
                    S1, BLOCK_D=pow2(D, 16), BLOCK_S=pow2(S1, 2),
                    num_warps=4, **launch_options(tokens))
    return m, best, path, committed, bonus


def accept_greedy_chain(pred: torch.Tensor, tokens: torch.Tensor, S1: int) -> tuple[torch.Tensor, ...]:
    """`accept_greedy` for a chain (node i at depth i, the child of node i-1: the tables are constants and are not
    read): pred, tokens [B, D] int64, S1 = S + 1 >= D -> (accept_len, path, committed, bonus); best = accept_len."""
    B, D = tokens.shape
    assert fits(D, S1 - 1) and D <= S1, f"accept_greedy_chain: D={D}, S+1={S1}"
    dev = tokens.device
    m, bonus = (torch.empty(B, dtype=torch.int64, device=dev) for _ in range(2))
    path = torch.empty(B, S1, dtype=torch.int64, device=dev)
    committed = torch.empty(B, S1, dtype=torch.int64, device=dev)
    _kernels()[2][(B,)](pred.contiguous(), tokens.contiguous(), m, path, committed, bonus, D, S1,
                        BLOCK_D=pow2(D, 16), BLOCK_S=pow2(S1, 2), num_warps=1, **launch_options(tokens))
    return m, path, committed, bonus
