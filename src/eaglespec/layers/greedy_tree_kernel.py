"""Greedy acceptance of a draft tree in one Triton kernel (CUDA): `spec/verify.verify_greedy` after the argmax.

`verify_greedy` turns the target's argmax at every tree node into the accepted path and the committed tokens with
~20 PyTorch operators (gathers, masks, an any, an argmax, a concatenation), each a CUDA-graph node of 1-3 us on the
H200 in every tree step. Here one program per row reads the row's tables once and writes every result.

`accept_greedy(pred, tokens, parents, depth, ancestors, paths) -> (accept_len, best, path, committed, bonus)`:
pred [B, D] int64 (the target's argmax at each node), the tree's tokens / parents / depth [B, D] int64, ancestors
[B, D, D] bool, paths [B, D, S+1] int64 (spec/tree.DraftTree) -> accept_len [B], best [B], path [B, S+1], committed
[B, S+1], bonus [B], the fields of `spec/verify.VerifyResult` with exactly the values of the PyTorch rule: a node is
accepted when every node on its path carries the argmax of its parent; best = the deepest accepted node (the first
in node order among equals, torch.argmax's rule); path = its root-to-node path padded with best; committed = the
accepted draft tokens, then the bonus (the argmax at best) and the bonus as padding.
`fits(D, S)`: D <= MAX_NODES. Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
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
    def accept_greedy_kernel(pred, tokens, parents, depth, anc, paths, m_out, best_out, path_out, tok_out,
                             bonus_out, D, S1, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
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

    return accept_greedy_kernel


def accept_greedy(pred: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor,
                  ancestors: torch.Tensor, paths: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, D = tokens.shape
    S1 = paths.shape[-1]
    assert fits(D, S1 - 1), f"accept_greedy: D={D}"
    dev = tokens.device
    m, best, bonus = (torch.empty(B, dtype=torch.int64, device=dev) for _ in range(3))
    path = torch.empty(B, S1, dtype=torch.int64, device=dev)
    committed = torch.empty(B, S1, dtype=torch.int64, device=dev)
    # the bool table is read as bytes 0 / 1
    _kernel()[(B,)](pred.contiguous(), tokens.contiguous(), parents.contiguous(), depth.contiguous(),
                    ancestors.contiguous().view(torch.int8), paths.contiguous(), m, best, path, committed, bonus, D,
                    S1, BLOCK_D=max(16, 1 << (D - 1).bit_length()), BLOCK_S=max(2, 1 << (S1 - 1).bit_length()),
                    num_warps=4)
    return m, best, path, committed, bonus
