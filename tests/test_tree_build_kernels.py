"""The tree-construction and KV-compaction Triton kernels (layers/tree_build_kernels.py, layers/kv_compact_kernel.py:
a tree level's bookkeeping, the selection of the D-1 best candidates, the compaction after verification; on CUDA),
run by Triton's interpreter on the CPU against the PyTorch code they replace; and tree speculation through all of
them still equal to plain decoding."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain, graded_candidates, tiny_drafter, tiny_llama  # noqa: E402

import eaglespec.engine.spec_step as spec_step  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.kv_cache import KVCache  # noqa: E402
from eaglespec.layers import kv_compact_kernel, tree_build_kernels  # noqa: E402
from eaglespec.layers.context import ForwardContext  # noqa: E402
from eaglespec.spec.draft import catch_up, draft_tree  # noqa: E402
from eaglespec.spec.tree import build_tree  # noqa: E402


def drafted(S: int, K: int, B: int, kernels: bool, seed: int = 0):
    """Candidates of one drafting phase of a tiny drafter over B rows of different lengths, with or without the
    level kernel (the drafter's KV cache rebuilt for each run, so both see the same state)."""
    torch.manual_seed(seed)
    target = tiny_llama(seed=0)
    drafter = tiny_drafter(target, seed=1)
    drafter.set_embed_and_head(*target.get_embed_and_head())
    lens = torch.tensor([9, 6, 11][:B])
    T = int(lens.max())
    tokens = torch.randint(0, 97, (B, T))
    aux = torch.randn(B, T, 3 * 64)
    kv_len = T + (S - 1) * K + 3
    kv = KVCache(1, drafter.kv_cache_shapes(), B, kv_len, torch.float32, "cpu")

    def step(tok, hid, pos, write, mask, from_target, logits_index):
        ctx = ForwardContext(positions=pos, write_index=write, attn_mask=mask, kv=kv.layers(),
                             logits_index=logits_index)
        return drafter(tok, hid, ctx, from_target=from_target)

    st = catch_up(step, tokens, aux, torch.zeros(B, dtype=torch.int64), lens, T, K)
    table = drafter.to_target_ids(torch.arange(drafter.draft_vocab_size))
    c = draft_tree(step, drafter.to_target_ids, st, lens, S, K, kv_len, target_ids=table, kernels=kernels)
    return c, tokens[:, 0]


@pytest.mark.parametrize("S,K,B", [(2, 2, 1), (3, 2, 2), (4, 4, 3), (3, 3, 2), (3, 12, 2), (2, 16, 1)])
def test_level_kernel_drafts_the_same_candidates(S, K, B):
    assert tree_build_kernels.fits_level(K, 64, (S - 1) * K)  # the kernel runs (the tiny drafter is 64 wide)
    ref, _ = drafted(S, K, B, kernels=False)
    got, _ = drafted(S, K, B, kernels=True)
    N = K + (S - 1) * K * K
    assert got.tokens.shape == (B, N) and got.scores.dtype == torch.float32
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.parents, ref.parents)
    assert torch.equal(got.depth, ref.depth)
    torch.testing.assert_close(got.scores, ref.scores, rtol=0, atol=1e-6)


@pytest.mark.parametrize("S,K,D", [(4, 4, 16), (3, 2, 6), (2, 3, 4), (5, 4, 20), (6, 8, 48), (5, 16, 48)])
def test_select_kernel_builds_the_same_tree(S, K, D):
    """The selection kernel's tree equals the PyTorch path's, for N = K + (S-1) K^2 candidates up to 84 (every
    comparison at once), 328 (S6 K8 D48: sorted keys, the parents through the scratch row) and 1,040 (S5 K16 D48)."""
    c, root = drafted(S, K, 3, kernels=False, seed=S + D)
    assert tree_build_kernels.fits_select(c.tokens.shape[1])
    ref = build_tree(root, c.tokens, c.scores, c.parents, c.depth, D, K, S, kernels=False)
    got = build_tree(root, c.tokens, c.scores, c.parents, c.depth, D, K, S, kernels=True)
    for field in ("tokens", "parents", "depth", "ancestors", "paths"):
        assert torch.equal(getattr(got, field), getattr(ref, field)), field


@pytest.mark.parametrize("K,S,D", [(3, 3, 8), (6, 5, 40), (8, 24, 48)])
def test_select_kernel_breaks_ties_as_the_stable_sort(K, S, D):
    """Scores on a coarse grid, so that many are equal: the kept candidates and their layout still match (a child's
    score never exceeds its parent's, and on equal scores the parent, with the smaller id, is kept first), with 21
    candidates, 150 and 1,480 (S24 K8: sorted keys)."""
    c = graded_candidates(4, K, S, torch.Generator().manual_seed(3))
    ref = build_tree(*c, D, K, S, kernels=False)
    got = build_tree(*c, D, K, S, kernels=True)
    for field in ("tokens", "parents", "depth"):
        assert torch.equal(getattr(got, field), getattr(ref, field)), field


def test_wide_select_keeps_equal_zeros_in_id_order():
    """Past ONE_BLOCK_CANDIDATES the kernel sorts keys made of the scores' bits: -0.0 and 0.0 must count as equal
    (the stable sort's order: the smaller id first), and -inf candidates come after every finite one, in id order."""
    B, N, D = 2, 150, 40
    scores = torch.zeros(B, N)
    scores[:, ::2] = -0.0  # even ids -0.0, odd ids 0.0: all equal
    scores[1, :60] = float("-inf")
    tokens = torch.arange(N).expand(B, N).contiguous()
    parents = torch.full((B, N), -1)
    depth = torch.ones(B, N, dtype=torch.int64)
    root = torch.tensor([7, 8])
    assert N > tree_build_kernels.ONE_BLOCK_CANDIDATES
    tok, par, dep = tree_build_kernels.select_tree(tokens, scores, parents, depth, root, D)
    assert tok[0].tolist() == [7] + list(range(D - 1)) and tok[1].tolist() == [8] + list(range(60, 60 + D - 1))
    ref = build_tree(root, tokens, scores, parents, depth, D, N, 1, kernels=False)
    assert torch.equal(tok, ref.tokens) and torch.equal(par, ref.parents) and torch.equal(dep, ref.depth)


@pytest.mark.parametrize("entry", [(3, 8), (24,)])
def test_compact_kernel_moves_the_same_entries(entry):
    g = torch.Generator().manual_seed(1)
    L, R, S_MAX, S1 = 3, 5, 20, 4
    cache = torch.randn(L, R, S_MAX, *entry, generator=g)
    rows = torch.tensor([4, 0, 2])
    start = torch.tensor([3, 10, 0])
    path = torch.tensor([[0, 2, 5, 5], [0, 0, 0, 0], [0, 1, 3, 7]])  # node ids by depth, padded with the last
    src, dst = start[:, None] + path, start[:, None] + torch.arange(S1)[None, :]
    ref = cache.clone()
    ref[:, rows[:, None], dst] = ref[:, rows[:, None], src]
    kv_compact_kernel.compact(cache, rows, start, path)
    assert torch.equal(cache, ref)


def test_fits():
    assert tree_build_kernels.fits_level(4, 576, 12) and not tree_build_kernels.fits_level(1, 576, 3)
    assert tree_build_kernels.fits_level(16, 576, 144) and not tree_build_kernels.fits_level(17, 576, 24)
    assert tree_build_kernels.fits_select(52) and tree_build_kernels.fits_select(328)
    assert tree_build_kernels.fits_select(4096) and not tree_build_kernels.fits_select(4097)
    assert kv_compact_kernel.fits(192, 5) and not kv_compact_kernel.fits(192, 0)


def test_tree_speculation_through_the_construction_kernels_equals_plain(monkeypatch):
    calls = []

    def compact_through(self, rows, start, path):
        calls.append("compact")
        for t in self.tensors:
            kv_compact_kernel.compact(t, rows, start, path)

    monkeypatch.setattr(spec_step, "draft_tree", functools.partial(draft_tree, kernels=True))
    monkeypatch.setattr(spec_step, "build_tree", functools.partial(build_tree, kernels=True))
    monkeypatch.setattr(KVCache, "compact", compact_through)
    levels = []
    real = tree_build_kernels.draft_level
    monkeypatch.setattr(tree_build_kernels, "draft_level", lambda *a: levels.append(a[11]) or real(*a))
    assert_transformed_engine_equals_plain(lambda t, d: None, SpecConfig(3, 2, 6), [[5, 6, 7, 8], [9, 10]], 12)
    assert calls and levels and set(levels) == {2, 6}  # the candidate id each level's children start at
