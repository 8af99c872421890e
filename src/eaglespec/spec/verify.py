"""Verification of a draft tree against the target's output (REFERENCE.md §4, DESIGN.md step 5).

Both rules return a `VerifyResult` per row: the deepest accepted node, the accepted path and the committed tokens
(accepted draft tokens followed by the bonus token), with fixed shapes [B, S+1] so a step has no host sync.

- `verify_greedy(tree, logits)`: a node is accepted when every node on its path (root excluded) carries the token the
  target's argmax chose at its parent; the bonus is the argmax at the deepest accepted node. Siblings carry distinct
  tokens, so the accepted nodes form a single path. Equals plain greedy decoding token for token.
  `verify_greedy_chain(tree, logits)`: the same for chains, with fewer operators (the step's graph nodes).
- `verify_sampling(tree, probs, generator)`: lossless sampling for deterministic (top-k) proposals: at the current
  node with target distribution q, try the children in node order; accept child x with probability
  q(x) / remaining mass, else zero q(x) and go on; when every child is rejected, the bonus is drawn from what is left
  of q (at a leaf: from q). The committed tokens are distributed exactly as the target's. Rows whose q is one-hot
  (temperature 0) behave exactly as greedy.
  With `draft_probs` (sampled chains: node c's token was drawn from the drafter's distribution r_c), a child x is
  accepted with probability min(1, q(x) / r_c(x)) and a rejection draws the bonus from max(q - r_c, 0), renormalised
  (standard speculative sampling; the committed tokens are again distributed as the target's). A one-hot r_c (a
  row drafting greedily) gives the deterministic rule above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layers import sampled_chain_kernel, tree_kernels
from ..layers.context import cached_arange
from ..layers.sampling import Draws, exponential_noise, greedy_ids, sample, uniform
from .tree import DraftTree


@dataclass
class VerifyResult:
    accept_len: torch.Tensor  # [B] accepted draft tokens m (0..S); tau = m + 1
    best: torch.Tensor  # [B] node id of the deepest accepted node (0 = root)
    path: torch.Tensor  # [B, S+1] node ids root..best, padded with best
    tokens: torch.Tensor  # [B, S+1] the m accepted draft tokens, then the bonus at index m, padded with the bonus
    bonus: torch.Tensor  # [B]


def _result(tree: DraftTree, best: torch.Tensor, bonus: torch.Tensor) -> VerifyResult:
    B = best.shape[0]
    S1 = tree.paths.shape[-1]
    m = torch.gather(tree.depth, 1, best[:, None]).squeeze(1)  # [B]
    path = torch.gather(tree.paths, 1, best[:, None, None].expand(B, 1, S1)).squeeze(1)  # [B, S+1]
    path = torch.where(path >= 0, path, best[:, None])
    path_tokens = torch.gather(tree.tokens, 1, path)  # [B, S+1] root token first
    idx = torch.arange(S1, device=best.device)[None, :]
    drafted = torch.cat((path_tokens[:, 1:], path_tokens[:, :1]), dim=1)  # accepted tokens shifted to index 0
    tokens = torch.where(idx < m[:, None], drafted, bonus[:, None])
    return VerifyResult(accept_len=m, best=best, path=path, tokens=tokens, bonus=bonus)


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> VerifyResult:
    """logits [B, D, V] of the target at each tree node. On CUDA the rule after the argmax is one Triton kernel
    (layers/tree_kernels.py, the same values: ~20 graph nodes fewer per tree step)."""
    pred = greedy_ids(logits)  # [B, D]
    if pred.is_cuda and tree_kernels.fits(tree.size, tree.paths.shape[-1] - 1):
        return VerifyResult(*tree_kernels.accept_greedy(pred, tree.tokens, tree.parents, tree.depth,
                                                        tree.ancestors, tree.paths))
    return verify_greedy_rule(tree, pred)


def verify_greedy_rule(tree: DraftTree, pred: torch.Tensor) -> VerifyResult:
    """`verify_greedy` from the argmax at each node, pred [B, D], in PyTorch operators."""
    parent_pred = torch.gather(pred, 1, tree.parents.clamp(min=0))
    correct = (tree.tokens == parent_pred) | (tree.parents < 0)  # [B, D]
    path_ok = ~(tree.ancestors & ~correct[:, None, :]).any(-1)  # every node on the path is correct
    best = torch.where(path_ok, tree.depth, -1).argmax(-1)  # deepest accepted node
    bonus = torch.gather(pred, 1, best[:, None]).squeeze(1)
    return _result(tree, best, bonus)


def verify_greedy_chain(tree: DraftTree, logits: torch.Tensor) -> VerifyResult:
    """`verify_greedy` for a chain (topk 1: node i at depth i, the child of node i-1), the same result in ~10
    operators instead of ~22: the accepted drafts are the leading run of nodes whose token is the target's argmax at
    the node before, the path is 0..m then m, and no ancestor table is read. logits [B, D, V]. On CUDA the rule
    after the argmax is one Triton kernel (`tree_kernels.accept_greedy_chain`, the same values)."""
    pred = greedy_ids(logits)  # [B, D]
    S1 = tree.paths.shape[-1]
    if pred.is_cuda and tree_kernels.fits(tree.size, S1 - 1):  # one Triton kernel after the argmax, the same values
        m, path, tokens, bonus = tree_kernels.accept_greedy_chain(pred, tree.tokens, S1)
        return VerifyResult(accept_len=m, best=m, path=path, tokens=tokens, bonus=bonus)
    return verify_greedy_chain_rule(tree, pred)


def verify_greedy_chain_rule(tree: DraftTree, pred: torch.Tensor) -> VerifyResult:
    """`verify_greedy_chain` from the argmax at each node, pred [B, D], in PyTorch operators."""
    m = (tree.tokens[:, 1:] == pred[:, :-1]).cumprod(dim=1).sum(dim=1)  # [B] int64: the leading run of hits
    bonus = torch.gather(pred, 1, m[:, None]).squeeze(1)
    S1 = tree.paths.shape[-1]
    idx = cached_arange(S1, pred.device)[None, :]
    drafted = F.pad(tree.tokens[:, 1:], (0, S1 - tree.size + 1))  # [B, S+1]: D-1 <= S drafts, then padding
    tokens = torch.where(idx < m[:, None], drafted, bonus[:, None])
    return VerifyResult(accept_len=m, best=m, path=torch.minimum(idx, m[:, None]), tokens=tokens, bonus=bonus)


def verify_sampling(tree: DraftTree, probs: torch.Tensor, generator: Draws = None,
                    draft_probs: torch.Tensor | None = None,
                    draft_index: torch.Tensor | None = None) -> VerifyResult:
    """probs [B, D, V]: the target's processed distribution (temperature, top-k, top-p) at each node;
    draft_probs (chains only): the distribution nodes 1..D-1's tokens were sampled from (module docstring), [B, D-1,
    V], or [B, D-1, Vd] over a draft vocabulary, with `draft_index` [V] int64 mapping target ids to draft ids (-1:
    outside it)."""
    B, D, V = probs.shape
    children = tree.child_table()  # [B, D, K]
    K = children.shape[-1]
    if draft_probs is not None:
        assert K == 1, "sampled drafts are verified for chains only"
        u = uniform((B, D - 1), probs.device, generator)
        e = exponential_noise((B, V), torch.float32, probs.device, generator)
        S1 = tree.paths.shape[-1]
        if probs.is_cuda and sampled_chain_kernel.fits(V, D):  # two Triton kernels, the same values
            m, path, tokens, bonus = sampled_chain_kernel.accept_sampled_chain(
                probs, draft_probs, draft_index, tree.tokens, u, e, S1)
            return VerifyResult(accept_len=m, best=m, path=path, tokens=tokens, bonus=bonus)
        return verify_sampled_chain_rule(tree, probs, draft_probs, draft_index, u, e)
    # Deterministic children, all K of a node at once. Siblings carry distinct tokens, so rejecting child i (zeroing
    # q(x_i)) leaves a later sibling's q(x_j) as it was: child j, reached when children 0..j-1 were rejected, is
    # accepted with probability q(x_j) / (mass - sum_{i<j} q(x_i)), which needs only the children's own
    # probabilities. The first accepted child is the one the sequential rule (module docstring) picks, with the same
    # distribution. Per depth ~12 small operators on [B, K] instead of K passes over [B, V] rows (a tree of 48 tokens
    # at T = 1 cost 3.2 ms a step on an H200 that way, against 1.3 ms greedy: docs/benchmarks.md "Session 39").
    S = tree.paths.shape[-1] - 1
    dev = probs.device
    rows = torch.arange(B, device=dev)
    valid = children >= 0  # [B, D, K]
    kid_tok = tree.tokens.gather(1, children.clamp(min=0).view(B, D * K)).view(B, D, K)
    px = torch.where(valid, probs.gather(2, kid_tok), 0.0)  # [B, D, K] q(x_j) at each node
    left = probs.sum(-1, keepdim=True) - (px.cumsum(-1) - px)  # [B, D, K] the mass left when child j is tried
    u = uniform((B, S, K), dev, generator)
    cur = torch.zeros(B, dtype=torch.int64, device=dev)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    for s in range(S):
        acc = valid[rows, cur] & (u[:, s] * left[rows, cur] < px[rows, cur])  # [B, K]
        active = active & acc.any(-1)
        first = acc.float().argmax(-1)  # the first accepted child (argmax returns the first maximum)
        cur = torch.where(active, children[rows, cur, first], cur)
    # A row stopped at `cur` because every child of it was rejected (a leaf has none): the bonus comes from q there
    # with those children's tokens zeroed, renormalised by the race in `sample`; q itself should rounding leave
    # nothing (children covering all of q's mass are never all rejected in exact arithmetic).
    q = probs[rows, cur]  # [B, V]
    hit = torch.zeros_like(q).scatter_add_(1, kid_tok[rows, cur], valid[rows, cur].to(q.dtype))
    res = torch.where(hit > 0, 0.0, q)
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, q)
    return _result(tree, cur, sample(res, generator))


def verify_sampled_chain_rule(tree: DraftTree, probs: torch.Tensor, draft_probs: torch.Tensor,
                              draft_index: torch.Tensor | None, u: torch.Tensor, e: torch.Tensor) -> VerifyResult:
    """Speculative sampling down a chain, given its random draws, in PyTorch operators: node i+1 (drawn from r_i =
    draft_probs[:, i]) is accepted at node i when u[:, i] * r_i(x) < q_i(x) (probability min(1, q_i(x) / r_i(x)), q_i
    = probs[:, i]) and every node before it was; the first rejection, at node m, draws the bonus from max(q_m - r_m,
    0) renormalised (q_m when that is all zero: q_m == r_m leaves a rejection probability 0), a fully accepted chain
    from q at the last node, each as argmax(p / e) with the Exp(1) draws e [B, V] (`layers.sampling.sample`'s race:
    one draw per row, since each row draws one bonus). u [B, D-1] uniform in [0, 1). The kernel of
    layers/sampled_chain_kernel.py computes the same values."""
    B, D, V = probs.shape
    x = tree.tokens[:, 1:]  # [B, D-1] the drafted tokens
    qx = probs[:, :-1].gather(2, x[..., None]).squeeze(2)
    dx = x if draft_index is None else draft_index[x]
    rx = torch.where(dx >= 0, draft_probs.gather(2, dx.clamp(min=0)[..., None]).squeeze(2), 0.0)
    m = (u * rx < qx).long().cumprod(1).sum(1)  # [B] the leading run of acceptances
    rows = torch.arange(B, device=probs.device)
    q = probs[rows, m]  # [B, V] the target at the last accepted node
    r = draft_probs[rows, m.clamp(max=D - 2)]  # [B, Vd] its draft distribution (unused past the last draft)
    if draft_index is not None:
        r = torch.where(draft_index >= 0, r.gather(1, draft_index.clamp(min=0).expand(B, V)), 0.0)
    r = torch.where((m < D - 1)[:, None], r, 0.0)
    residual = (q - r).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, q)
    bonus = greedy_ids(residual / e)
    S1 = tree.paths.shape[-1]
    idx = cached_arange(S1, probs.device)[None, :]
    drafted = F.pad(x, (0, S1 - D + 1))  # [B, S+1]
    tokens = torch.where(idx < m[:, None], drafted, bonus[:, None])
    return VerifyResult(accept_len=m, best=m, path=torch.minimum(idx, m[:, None]), tokens=tokens, bonus=bonus)
