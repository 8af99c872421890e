"""Draft trees as tensors: from scored candidates to the verify batch (REFERENCE.md §4, DESIGN.md step 3).

Input, per row b, the N = K + (S-1)K^2 candidates the drafting loop produced, in level order:
    cand_tokens [B, N] target ids, cand_scores [B, N] cumulative log-probabilities,
    cand_parents [B, N] index of the parent candidate (-1: the root), cand_depth [B, N] (1-based).
`build_tree` keeps the best D-1 candidates (a stable sort by score, so that on ties a parent, which always has the
smaller index, wins over its child and every kept node's parent is kept too), orders them by candidate index (parents
before children) and puts the root first. Output `DraftTree` (node 0 = root = the last committed token):
    tokens [B, D], parents [B, D] (root: -1), depth [B, D] (root: 0),
    ancestors [B, D, D] bool: ancestors[b, i, j] iff node j is node i or one of its ancestors (the verify mask),
    paths [B, D, S+1]: for each node, its root-to-node path (node ids by depth, -1 padded); the rows of leaves are
    the root-to-leaf paths,
    children [B, D, K] (`DraftTree.child_table()`): the children of each node in node order, -1 padded; built on
    first use, since only sampled verification reads it (a greedy tree step skips its ~18 operators).
Everything is a fixed-shape tensor op: no host synchronisation.
A chain (topk 1) needs no selection: its cumulative scores never increase with depth, so the best D-1 candidates are
always the first D-1, and every table but the tokens is a constant (`chain_tables`, built once per shape): the
drafting phase of a chain step then launches a concatenation instead of ~60 small kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..layers import topk_kernel, tree_build_kernels, tree_kernels
from ..layers.context import cached_arange


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [B, D]
    parents: torch.Tensor  # [B, D]
    depth: torch.Tensor  # [B, D]
    ancestors: torch.Tensor  # [B, D, D]
    paths: torch.Tensor  # [B, D, S+1]
    children: torch.Tensor | None = None  # [B, D, K], or None until `child_table()` builds it
    topk: int = 1  # K: children per node at most
    q: torch.Tensor | None = None  # [B, D-1, Vd] sampled chains: node i+1's drafter distribution (the root's none)

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def child_table(self) -> torch.Tensor:
        """[B, D, K] children of each node in node order, -1 padded (built on first use, then kept)."""
        if self.children is None:
            self.children = children_table(self.parents, self.topk)
        return self.children

    def is_leaf(self) -> torch.Tensor:
        """[B, D] bool: nodes without children."""
        return self.child_table()[..., 0] < 0


def ancestor_tables(parents: torch.Tensor, depth: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """parents [B, D] (-1 root), depth [B, D] -> (ancestors [B, D, D] ancestor-or-self, paths [B, D, S+1]).

    One walk up the tree: a_j, the j-th ancestor of every node (a_0 = the node), comes from a_{j-1} by one gather
    over the parents, extended with a dummy node D that is its own parent (the walk past the root stays there). Step
    j sets ancestors[i, a_j(i)] and paths[i, depth(i) - j] = a_j(i); writes of the dummy, or below depth 0, land in
    extra columns that are cut off. About 4 operators per level instead of ~15 for two separate passes. On CUDA the
    same walk is one Triton kernel (layers/tree_kernels.py: ~20 graph nodes fewer per tree step at S = 4).
    """
    B, D = parents.shape
    if parents.is_cuda and tree_kernels.fits(D, max_depth):
        return tree_kernels.ancestor_tables(parents, depth, max_depth)
    dev = parents.device
    S1 = max_depth + 1
    up = torch.cat((torch.where(parents >= 0, parents, D), torch.full((B, 1), D, dtype=parents.dtype, device=dev)), 1)
    a = cached_arange(D, dev).expand(B, D)  # a_0: every node itself
    anc = torch.zeros(B, D, D + 1, dtype=torch.bool, device=dev)  # column D: the dummy
    paths = torch.full((B, D, 2 * S1), D, dtype=torch.int64, device=dev)  # column S1 + (depth - j); < S1: cut off
    for j in range(S1):
        anc.scatter_(2, a[..., None], True)
        paths.scatter_(2, (depth + (S1 - j))[..., None], a[..., None])
        if j < S1 - 1:
            a = torch.gather(up, 1, a)
    paths = paths[..., S1:]
    return anc[..., :D], torch.where(paths == D, -1, paths)


def children_table(parents: torch.Tensor, k: int) -> torch.Tensor:
    """parents [B, D] -> children [B, D, k]: node ids of each node's children in node order, -1 padded."""
    B, D = parents.shape
    dev = parents.device
    onehot = torch.zeros(B, D, D + 1, dtype=torch.int64, device=dev)
    # column D collects the root's "parent" (-1) so it never counts as anybody's child
    onehot.scatter_(2, torch.where(parents >= 0, parents, D)[..., None], 1)
    rank = torch.gather(onehot.cumsum(1), 2, torch.where(parents >= 0, parents, D)[..., None]).squeeze(-1) - 1
    children = torch.full((B, D + 1, k + 1), -1, dtype=torch.int64, device=dev)
    node = torch.arange(D, device=dev).expand(B, D)
    row = torch.where(parents >= 0, parents, D)
    col = torch.where(parents >= 0, rank.clamp(max=k), k)
    children[torch.arange(B, device=dev)[:, None], row, col] = node
    return children[:, :D, :k]


@functools.cache  # never evicted: captured CUDA graphs read these tensors by address
def chain_tables(num_draft_tokens: int, max_depth: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The constant tables of a D-node chain (node i at depth i): parents [D], depth [D], ancestors [D, D],
    children [D, 1], paths [D, S+1]. Cached per shape and device and only ever read (expanded per batch)."""
    D = num_draft_tokens
    node = torch.arange(D, device=device)
    parents = node - 1  # the root's is -1
    ancestors = torch.ones(D, D, dtype=torch.bool, device=device).tril()
    children = torch.where(node + 1 < D, node + 1, -1)[:, None]
    d = torch.arange(max_depth + 1, device=device)
    paths = torch.where(d[None, :] <= node[:, None], d[None, :].expand(D, max_depth + 1), -1)
    return parents, node.clone(), ancestors, children, paths


def best_candidates(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """scores [B, N] -> the indices of the `keep` best [B, keep], best first, the smaller index first among equal
    scores (a stable descending sort's order). On CUDA, when keep <= topk_kernel.MAX_K, the top-k kernel's raw mode
    (one kernel instead of a radix sort); elsewhere the stable sort."""
    if scores.is_cuda and topk_kernel.fits(scores.shape[-1], keep):
        return topk_kernel.topk_values(scores, keep)[0]
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :keep]


def build_tree(
    root_tokens: torch.Tensor,
    cand_tokens: torch.Tensor,
    cand_scores: torch.Tensor | None,  # None: a chain (topk 1), which keeps its first D-1 candidates
    cand_parents: torch.Tensor,
    cand_depth: torch.Tensor,
    num_draft_tokens: int,
    topk: int,
    max_depth: int,
    kernels: bool | None = None,
) -> DraftTree:
    """Select the best D-1 candidates and lay them out as a tree with the root first (see module docstring). Trees
    select in one Triton kernel (`layers/tree_build_kernels.select_tree`: the same tables) when `kernels` (default:
    on CUDA) and N <= its limit."""
    B, N = cand_tokens.shape
    dev = cand_tokens.device
    keep = num_draft_tokens - 1
    if topk == 1:  # a chain: the first D-1 candidates, constant tables (module docstring)
        parents, depth, ancestors, children, paths = chain_tables(num_draft_tokens, max_depth, dev)
        D = num_draft_tokens
        return DraftTree(
            tokens=torch.cat((root_tokens[:, None], cand_tokens[:, :keep]), dim=1),
            parents=parents.expand(B, D), depth=depth.expand(B, D), ancestors=ancestors.expand(B, D, D),
            children=children.expand(B, D, 1), paths=paths.expand(B, D, max_depth + 1),
        )
    use = dev.type == "cuda" if kernels is None else kernels
    if use and tree_build_kernels.fits_select(N):
        tokens, parents, depth = tree_build_kernels.select_tree(cand_tokens, cand_scores, cand_parents, cand_depth,
                                                                root_tokens, num_draft_tokens)
        ancestors, paths = ancestor_tables(parents, depth, max_depth)
        return DraftTree(tokens=tokens, parents=parents, depth=depth, ancestors=ancestors, paths=paths, topk=topk)
    order = best_candidates(cand_scores, keep)  # [B, D-1]
    sel = order.sort(dim=1).values  # candidate ids in index order: parents precede children
    pos_of_cand = torch.full((B, N), -1, dtype=torch.int64, device=dev)
    pos_of_cand.scatter_(1, sel, torch.arange(1, keep + 1, device=dev).expand(B, keep))
    cpar = torch.gather(cand_parents, 1, sel)  # [B, D-1] candidate id of the parent, -1 = root
    npar = torch.where(cpar >= 0, torch.gather(pos_of_cand, 1, cpar.clamp(min=0)), torch.zeros_like(cpar))
    tokens = torch.cat((root_tokens[:, None], torch.gather(cand_tokens, 1, sel)), dim=1)
    parents = torch.cat((torch.full((B, 1), -1, dtype=torch.int64, device=dev), npar), dim=1)
    depth = torch.cat((torch.zeros(B, 1, dtype=torch.int64, device=dev), torch.gather(cand_depth, 1, sel)), dim=1)
    ancestors, paths = ancestor_tables(parents, depth, max_depth)
    return DraftTree(tokens=tokens, parents=parents, depth=depth, ancestors=ancestors, paths=paths, topk=topk)
