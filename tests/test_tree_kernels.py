"""The draft-tree Triton kernels (layers/tree_kernels.py: a tree's ancestor and path tables, and its greedy acceptance
after the argmax, on CUDA), run by Triton's interpreter on the CPU, against the PyTorch code of spec/tree.py and
spec/verify.py; and tree speculation through each still equal to plain decoding."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain  # noqa: E402

import eaglespec.engine.spec_step as spec_step  # noqa: E402
import eaglespec.spec.tree as tree_mod  # noqa: E402
import eaglespec.spec.verify as verify  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import tree_kernels  # noqa: E402
from eaglespec.spec.tree import DraftTree  # noqa: E402


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
def test_tables_kernel_equals_the_pytorch_walk(B, D, S):
    par, dep = random_tree(B, D, S, seed=D + S)
    anc, paths = tree_kernels.ancestor_tables(par, dep, S)
    ref_anc, ref_paths = tree_mod.ancestor_tables(par, dep, S)  # CPU tensors: the PyTorch walk
    assert anc.dtype == torch.bool and paths.dtype == torch.int64
    assert anc.shape == (B, D, D) and paths.shape == (B, D, S + 1)
    assert torch.equal(anc, ref_anc) and torch.equal(paths, ref_paths)


def test_a_chain():
    D = 6
    par = torch.arange(-1, D - 1)[None]
    dep = torch.arange(D)[None]
    anc, paths = tree_kernels.ancestor_tables(par, dep, D - 1)
    assert torch.equal(anc[0], torch.ones(D, D, dtype=torch.bool).tril())
    assert paths[0, -1].tolist() == list(range(D)) and paths[0, 0].tolist() == [0] + [-1] * (D - 1)


def test_fits():
    assert tree_kernels.fits(48, 6) and tree_kernels.fits(1, 0)
    assert not tree_kernels.fits(tree_kernels.MAX_NODES + 1, 4) and not tree_kernels.fits(0, 3)


def test_tree_speculation_through_the_tables_kernel_equals_plain(monkeypatch):
    calls = []

    def through(parents, depth, max_depth):
        calls.append(tuple(parents.shape))
        return tree_kernels.ancestor_tables(parents, depth, max_depth)

    monkeypatch.setattr(tree_mod, "ancestor_tables", through)
    assert_transformed_engine_equals_plain(lambda t, d: None, SpecConfig(3, 2, 6), [[5, 6, 7, 8], [9, 10]], 12)
    assert calls and all(s[-1] == 6 for s in calls)


def assert_same_result(got: verify.VerifyResult, ref: verify.VerifyResult, trial: int) -> None:
    for field in ("accept_len", "best", "path", "tokens", "bonus"):
        assert torch.equal(getattr(got, field), getattr(ref, field)), (trial, field)


def kernel_result(tree: DraftTree, pred: torch.Tensor) -> verify.VerifyResult:
    return verify.VerifyResult(*tree_kernels.accept_greedy(pred, tree.tokens, tree.parents, tree.depth,
                                                           tree.ancestors, tree.paths))


@pytest.mark.parametrize("B,D,S,vocab", [(4, 16, 4, 2), (3, 48, 6, 3), (2, 8, 7, 2), (1, 1, 3, 2), (5, 20, 5, 1)])
def test_acceptance_kernel_equals_the_pytorch_rule(B, D, S, vocab):
    """Tiny vocabularies, so that many nodes match their parent's argmax and paths of every depth are accepted
    (vocab 1: every node matches, the deepest node of the tree wins, ties to the first)."""
    g = torch.Generator().manual_seed(D * 7 + S)
    parents, depth = random_tree(B, D, S, seed=D + S)
    ancestors, paths = tree_mod.ancestor_tables(parents, depth, S)
    tokens = torch.randint(0, vocab, (B, D), generator=g)
    tree = DraftTree(tokens=tokens, parents=parents, depth=depth, ancestors=ancestors, paths=paths)
    for trial in range(4):
        pred = torch.randint(0, vocab, (B, D), generator=g)
        assert_same_result(kernel_result(tree, pred), verify.verify_greedy_rule(tree, pred), trial)




def chain_kernel_result(tree, pred):
    m, path, tokens, bonus = tree_kernels.accept_greedy_chain(pred, tree.tokens, tree.paths.shape[-1])
    return verify.VerifyResult(accept_len=m, best=m, path=path, tokens=tokens, bonus=bonus)


@pytest.mark.parametrize("B,D,S", [(3, 4, 3), (2, 3, 5), (4, 1, 2), (2, 9, 8)])
@pytest.mark.parametrize("vocab", [1, 2, 5])
def test_chain_acceptance_kernel_equals_the_pytorch_rule(B, D, S, vocab):
    """A chain's acceptance (the leading run of nodes that carry the argmax of the node before): all hits (vocab 1),
    a first miss anywhere, a lone root (D = 1), fewer nodes than S + 1."""
    from eaglespec.spec.tree import build_tree

    g = torch.Generator().manual_seed(B * 11 + D + vocab)
    for trial in range(4):
        cand = torch.randint(0, vocab, (B, S), generator=g)
        tree = build_tree(torch.randint(0, vocab, (B,), generator=g), cand, None,
                          torch.arange(S).expand(B, S) - 1, torch.arange(S).expand(B, S) + 1, D, 1, S)
        pred = torch.randint(0, vocab, (B, D), generator=g)
        assert_same_result(chain_kernel_result(tree, pred), verify.verify_greedy_chain_rule(tree, pred), trial)


@pytest.mark.parametrize("chain", [False, True])
def test_speculation_through_the_acceptance_kernels_equals_plain(monkeypatch, chain):
    """The engine's greedy acceptance routed through the tree kernel (a tree) or the chain kernel (a chain)."""
    calls = []
    result = chain_kernel_result if chain else kernel_result

    def through(tree, logits):
        calls.append(tree.size)
        return result(tree, logits.argmax(-1))

    monkeypatch.setattr(spec_step, "verify_greedy_chain" if chain else "verify_greedy", through)
    spec = SpecConfig(3, 1, 4) if chain else SpecConfig(3, 2, 6)
    assert_transformed_engine_equals_plain(lambda t, d: None, spec, [[5, 6, 7, 8], [9, 10]], 12)
    assert calls and set(calls) == {spec.draft_tokens}
