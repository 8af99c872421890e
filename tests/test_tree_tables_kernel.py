"""The tree-tables Triton kernel (a draft tree's ancestor and path tables on CUDA), run by Triton's interpreter on the
CPU, against the PyTorch walk of spec/tree.py; and tree speculation through it still equal to plain decoding."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain  # noqa: E402

import eaglespec.spec.tree as tree  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import tree_tables_kernel as ttk  # noqa: E402


def random_tree(B: int, D: int, S: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Parents precede children (as build_tree lays nodes out), depth <= S."""
    g = torch.Generator().manual_seed(seed)
    par = torch.full((B, D), -1, dtype=torch.int64)
    dep = torch.zeros(B, D, dtype=torch.int64)
    for b in range(B):
        for i in range(1, D):
            choices = [p for p in range(i) if dep[b, p] < S]
            p = choices[int(torch.randint(0, len(choices), (1,), generator=g))]
            par[b, i], dep[b, i] = p, dep[b, p] + 1
    return par, dep


@pytest.mark.parametrize("B,D,S", [(1, 1, 3), (3, 16, 4), (2, 48, 6), (2, 9, 8), (1, 64, 10)])
def test_kernel_equals_the_pytorch_walk(B, D, S):
    par, dep = random_tree(B, D, S, seed=D + S)
    anc, paths = ttk.ancestor_tables(par, dep, S)
    ref_anc, ref_paths = tree.ancestor_tables(par, dep, S)  # CPU tensors: the PyTorch walk
    assert anc.dtype == torch.bool and paths.dtype == torch.int64
    assert anc.shape == (B, D, D) and paths.shape == (B, D, S + 1)
    assert torch.equal(anc, ref_anc) and torch.equal(paths, ref_paths)


def test_a_chain():
    D = 6
    par = torch.arange(-1, D - 1)[None]
    dep = torch.arange(D)[None]
    anc, paths = ttk.ancestor_tables(par, dep, D - 1)
    assert torch.equal(anc[0], torch.ones(D, D, dtype=torch.bool).tril())
    assert paths[0, -1].tolist() == list(range(D)) and paths[0, 0].tolist() == [0] + [-1] * (D - 1)


def test_fits():
    assert ttk.fits(48, 6) and ttk.fits(1, 0) and not ttk.fits(ttk.MAX_NODES + 1, 4) and not ttk.fits(0, 3)


def test_tree_speculation_through_the_kernel_equals_plain(monkeypatch):
    calls = []

    def through(parents, depth, max_depth):
        calls.append(tuple(parents.shape))
        return ttk.ancestor_tables(parents, depth, max_depth)

    monkeypatch.setattr(tree, "ancestor_tables", through)
    assert_transformed_engine_equals_plain(lambda t, d: None, SpecConfig(3, 2, 6), [[5, 6, 7, 8], [9, 10]], 12)
    assert calls and all(s[-1] == 6 for s in calls)
