"""The greedy tree acceptance Triton kernel (CUDA's `verify_greedy` after the argmax), run by Triton's interpreter on
the CPU, against the PyTorch rule field by field; and tree speculation through it still equal to plain decoding."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from test_tree_tables_kernel import random_tree  # noqa: E402
from tiny import assert_transformed_engine_equals_plain  # noqa: E402

import eaglespec.engine.runner as runner  # noqa: E402
import eaglespec.spec.verify as verify  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import greedy_tree_kernel as gtk  # noqa: E402
from eaglespec.spec.tree import DraftTree, ancestor_tables  # noqa: E402


def kernel_result(tree: DraftTree, pred: torch.Tensor) -> verify.VerifyResult:
    return verify.VerifyResult(*gtk.accept_greedy(pred, tree.tokens, tree.parents, tree.depth, tree.ancestors,
                                                  tree.paths))


@pytest.mark.parametrize("B,D,S,vocab", [(4, 16, 4, 2), (3, 48, 6, 3), (2, 8, 7, 2), (1, 1, 3, 2), (5, 20, 5, 1)])
def test_kernel_equals_the_pytorch_rule(B, D, S, vocab):
    """Tiny vocabularies, so that many nodes match their parent's argmax and paths of every depth are accepted
    (vocab 1: every node matches, the deepest node of the tree wins, ties to the first)."""
    g = torch.Generator().manual_seed(D * 7 + S)
    parents, depth = random_tree(B, D, S, seed=D + S)
    ancestors, paths = ancestor_tables(parents, depth, S)
    tokens = torch.randint(0, vocab, (B, D), generator=g)
    tree = DraftTree(tokens=tokens, parents=parents, depth=depth, ancestors=ancestors, paths=paths)
    for trial in range(4):
        pred = torch.randint(0, vocab, (B, D), generator=g)
        got, ref = kernel_result(tree, pred), verify.verify_greedy_rule(tree, pred)
        for field in ("accept_len", "best", "path", "tokens", "bonus"):
            assert torch.equal(getattr(got, field), getattr(ref, field)), (trial, field)


def test_fits():
    assert gtk.fits(48, 6) and gtk.fits(1, 0) and not gtk.fits(gtk.MAX_NODES + 1, 4)


def test_tree_speculation_through_the_kernel_equals_plain(monkeypatch):
    calls = []

    def through(tree, logits):
        calls.append(tree.size)
        return kernel_result(tree, logits.argmax(-1))

    monkeypatch.setattr(runner, "verify_greedy", through)
    assert_transformed_engine_equals_plain(lambda t, d: None, SpecConfig(3, 2, 6), [[5, 6, 7, 8], [9, 10]], 12)
    assert calls and set(calls) == {6}
