"""The sampled chain's acceptance as Triton kernels (the CUDA path of `spec.verify.verify_sampling` for sampled
drafts), run by Triton's interpreter on the CPU against the PyTorch rule with the same random draws; and sampled
speculation through them drawing the same tokens as through the PyTorch rule."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import tiny_drafter, tiny_llama  # noqa: E402

import eaglespec.spec.verify as verify_mod  # noqa: E402
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.layers import sampled_chain_kernel  # noqa: E402
from eaglespec.layers.sampling import exponential_noise  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402
from eaglespec.spec.tree import DraftTree, chain_tables  # noqa: E402


def _chain(tokens: torch.Tensor, S1: int) -> DraftTree:
    B, D = tokens.shape
    parents, depth, ancestors, children, paths = chain_tables(D, S1 - 1, tokens.device)
    return DraftTree(tokens=tokens, parents=parents.expand(B, D), depth=depth.expand(B, D),
                     ancestors=ancestors.expand(B, D, D), children=children.expand(B, D, 1),
                     paths=paths.expand(B, D, S1))


def _case(B: int, D: int, V: int, Vd: int | None, seed: int):
    """Random distributions with the cases the rule branches on: drafts outside the draft vocabulary, one-hot
    (greedy) rows, a row whose residual is all zero (q == r at every node), drafts of probability 0 under q."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(B, D, V, generator=g) * 2, -1)
    Vd = V if Vd is None else Vd
    index = None
    if Vd < V:
        ids = torch.randperm(V, generator=g)[:Vd].sort().values
        index = torch.full((V,), -1, dtype=torch.int64).index_copy_(0, ids, torch.arange(Vd))
    dprobs = torch.softmax(torch.randn(B, D - 1, Vd, generator=g) * 2, -1)
    tokens = torch.randint(0, V, (B, D), generator=g)
    # row 1 drafts the target's likeliest tokens (long accepted runs); row 2 is greedy: one-hot q and r
    tokens[1, 1:] = probs[1, :-1].argmax(-1)
    probs[2] = torch.nn.functional.one_hot(probs[2].argmax(-1), V).float()
    if index is None:
        dprobs[2] = probs[2, :-1]
        tokens[2, 1:] = probs[2, :-1].argmax(-1)
        if B > 3:  # row 3: r == q at every node, so a rejection's residual is all zero
            dprobs[3] = probs[3, :-1]
    u = torch.rand(B, D - 1, generator=g)
    u[0, 0] = 0.0  # u = 0 accepts any draft with q > 0
    e = exponential_noise((B, V), torch.float32, torch.device("cpu"), g)
    return probs, dprobs, index, tokens, u, e


@pytest.mark.parametrize("B,D,V,Vd", [(5, 4, 300, None), (6, 2, 5000, 1200), (4, 6, 9000, None), (3, 3, 64, 40)])
def test_kernel_equals_the_pytorch_rule(B, D, V, Vd):
    for seed in range(3):
        probs, dprobs, index, tokens, u, e = _case(B, D, V, Vd, seed + 10 * D)
        S1 = D + 1
        ref = verify_mod.verify_sampled_chain_rule(_chain(tokens, S1), probs, dprobs, index, u, e)
        m, path, committed, bonus = sampled_chain_kernel.accept_sampled_chain(probs, dprobs, index, tokens, u, e, S1)
        assert torch.equal(m, ref.accept_len) and torch.equal(bonus, ref.bonus)
        assert torch.equal(path, ref.path) and torch.equal(committed, ref.tokens)
        assert int(m[1]) >= 1  # the target's likeliest drafts run deep
        if index is None:  # the greedy row: every draft accepted, the bonus the last node's argmax
            assert int(m[2]) == D - 1 and int(bonus[2]) == int(probs[2, D - 1].argmax())


def test_ties_take_the_first_index_and_a_zero_residual_falls_back_to_q():
    """Equal ratios p / e pick the smallest id (torch.argmax's rule) across the chunks of the vocabulary; when the
    residual max(q - r, 0) is all zero the bonus is drawn from q."""
    V, D = 3 * sampled_chain_kernel.CHUNK + 7, 2
    probs = torch.zeros(2, D, V)
    probs[:, 0, [17, sampled_chain_kernel.CHUNK + 5, V - 1]] = 1 / 3  # three equal maxima in three chunks
    probs[:, 1, 3] = 1.0
    dprobs = torch.zeros(2, D - 1, V)
    dprobs[0, 0, 9] = 1.0  # row 0 drafts token 9, which q never gives: rejected, residual = q
    dprobs[1, 0] = probs[1, 0]  # row 1: r == q, the draft rejected by u: residual all zero -> q
    tokens = torch.tensor([[0, 9], [0, V - 1]])
    u = torch.tensor([[0.5], [0.9999]])
    e = torch.ones(2, V)
    ref = verify_mod.verify_sampled_chain_rule(_chain(tokens, D), probs, dprobs, None, u, e)
    got = sampled_chain_kernel.accept_sampled_chain(probs, dprobs, None, tokens, u, e, D)
    assert got[0].tolist() == ref.accept_len.tolist() == [0, 1]
    assert got[3].tolist() == ref.bonus.tolist() == [17, 3]  # row 1 accepted (u * 1/3 < 1/3): its bonus from q_1
    dprobs[1, 0] = probs[1, 0]
    u[1, 0] = 1.0  # not accepted (1/3 < 1/3 is false): the residual q - r is all zero, the bonus from q_0
    ref = verify_mod.verify_sampled_chain_rule(_chain(tokens, D), probs, dprobs, None, u, e)
    got = sampled_chain_kernel.accept_sampled_chain(probs, dprobs, None, tokens, u, e, D)
    assert got[0].tolist() == ref.accept_len.tolist() == [0, 0]
    assert got[3].tolist() == ref.bonus.tolist() == [17, 17]
    assert sampled_chain_kernel.fits(49152, 4) and not sampled_chain_kernel.fits(49152, 1)


def test_sampled_chains_through_the_kernels_draw_the_same_tokens(monkeypatch):
    """The engine's sampled chain (a draft vocabulary of 40 of 64 tokens) gives the same tokens with its acceptance
    routed through the kernels (the CUDA path) as through the PyTorch rule: the same draws, the same values."""
    target = tiny_llama(seed=5, vocab=64, hidden=32, layers=2, std=0.35)
    drafter = tiny_drafter(target, seed=6, draft_vocab=40, hidden=32, std=0.35)
    params = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.95, ignore_eos=True)

    def run() -> list[list[int]]:
        eng = Engine(target, None, EngineConfig(max_batch_size=3, seed=3), drafter=drafter, spec=SpecConfig(3, 1, 4))
        out = [o.token_ids for o in eng.generate([[1, 2, 3], [4, 5], [6]], params)]
        assert sum(eng.stats.hist[2:]) > 0  # drafts were accepted
        return out

    plain = run()
    calls = []

    def through_kernels(tree, probs, draft_probs, draft_index, u, e):
        calls.append(tuple(probs.shape))
        m, path, tokens, bonus = sampled_chain_kernel.accept_sampled_chain(
            probs, draft_probs, draft_index, tree.tokens, u, e, tree.paths.shape[-1])
        return verify_mod.VerifyResult(accept_len=m, best=m, path=path, tokens=tokens, bonus=bonus)

    monkeypatch.setattr(verify_mod, "verify_sampled_chain_rule", through_kernels)
    assert run() == plain and calls
