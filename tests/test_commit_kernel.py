"""The commit's bookkeeping kernels (layers/commit_kernel.py), run by Triton's interpreter on the CPU: the rows'
advance with the catch-up's positions, mask and last pair, a decode step's advance, and storing the drafter's state,
against the PyTorch path, for graph steps (rows 0..B-1) and scattered rows; and speculation with them routed through
the kernels (chains and trees, greedy and sampled) still gives plain greedy tokens."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain, kernel_spy  # noqa: E402

import eaglespec.engine.drafter_rows as drafter_rows  # noqa: E402
import eaglespec.engine.runner as runner  # noqa: E402
import eaglespec.engine.spec_step as spec_step  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import commit_kernel as ck  # noqa: E402


def _state(R, seed):
    g = torch.Generator().manual_seed(seed)
    seq_len = torch.randint(5, 300, (R,), generator=g)
    last_token = torch.randint(0, 100, (R,), generator=g)
    active = torch.rand(R, generator=g) < 0.7
    return seq_len, last_token, active, g


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [5, 2, 7], [0]])
@pytest.mark.parametrize("T,kv_len", [(4, 384), (9, 1030), (1, 64)])
def test_advance_matches_the_pytorch_path(rows, T, kv_len):
    seq_len, last_token, active, g = _state(8, seed=T + kv_len)
    rows = torch.tensor(rows)
    accept = torch.randint(0, T, (len(rows),), generator=g)
    bonus = torch.randint(0, 100, (len(rows),), generator=g)
    states = [(seq_len.clone(), last_token.clone()) for _ in range(2)]
    outs = [ck.advance_rows(sl, lt, active, rows, accept, bonus, T, kv_len, kernel=k)
            for (sl, lt), k in zip(states, (True, False))]
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(states[0][0], states[1][0]) and torch.equal(states[0][1], states[1][1])
    L = seq_len[rows]
    assert torch.equal(states[0][0][rows], torch.where(active[rows], L + accept + 1, L))  # the advance itself
    untouched = torch.ones(8, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(states[0][0][untouched], seq_len[untouched])  # other rows keep their state


@pytest.mark.parametrize("rows", [[0, 1, 2], [6, 1], [0]])
def test_decode_advance_matches_the_pytorch_path(rows):
    seq_len, last_token, active, g = _state(8, seed=len(rows))
    rows = torch.tensor(rows)
    tokens = torch.randint(0, 100, (len(rows),), generator=g)
    states = [(seq_len.clone(), last_token.clone()) for _ in range(2)]
    for (sl, lt), k in zip(states, (True, False)):
        ck.advance_decode(sl, lt, active, rows, tokens, kernel=k)
    assert torch.equal(states[0][0], states[1][0]) and torch.equal(states[0][1], states[1][1])
    L = seq_len[rows]
    assert torch.equal(states[0][0][rows], torch.where(active[rows], L + 1, L))
    assert torch.equal(states[0][1][rows], tokens)
    untouched = torch.ones(8, dtype=torch.bool)
    untouched[rows] = False
    assert torch.equal(states[0][0][untouched], seq_len[untouched])
    assert torch.equal(states[0][1][untouched], last_token[untouched])


@pytest.mark.parametrize("tree", [False, True])
def test_store_matches_the_pytorch_path(tree):
    g = torch.Generator().manual_seed(1)
    R, B, K, H, V = 6, 3, 4 if tree else 1, 48, 1500
    rows = torch.tensor([4, 0, 2])
    top_ids = torch.randint(0, V, (B, K), generator=g)
    top_logp = torch.randn(B, K, generator=g) if tree else None
    # float32 values that bf16 holds exactly, cast on store (the oracle's float32 logits into a bf16 engine's buffer):
    # Triton's interpreter truncates float32 -> bf16 where the GPU rounds to nearest, so only exact casts compare
    bf16_exact = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16).float()  # noqa: E731
    hidden = bf16_exact(B, 2, H)[:, 1]  # a strided [B, H] view, as a gather along T gives
    logits = None if tree else bf16_exact(B, 1, V)[:, 0]
    dests = []
    for k in (True, False):
        d = (torch.zeros(R, K, dtype=torch.int64), torch.zeros(R, K) if tree else None,
             torch.zeros(R, H, dtype=torch.bfloat16), None if tree else torch.zeros(R, V, dtype=torch.bfloat16))
        ck.store_draft_rows(rows, top_ids, top_logp, hidden, logits, *d, kernel=k)
        dests.append(d)
    for a, b in zip(*dests):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert torch.equal(dests[0][2][rows], hidden.to(torch.bfloat16)) and not dests[0][2][[1, 3, 5]].any()


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)])
def test_speculation_through_the_kernels_equals_plain(monkeypatch, spec):
    calls = []

    def route(target, drafter):
        monkeypatch.setattr(spec_step, "advance_rows", kernel_spy(calls, ck.advance_rows, "advance"))
        monkeypatch.setattr(drafter_rows, "store_draft_rows", kernel_spy(calls, ck.store_draft_rows, "store"))
        monkeypatch.setattr(runner, "advance_decode", kernel_spy(calls, ck.advance_decode, "decode"))

    assert_transformed_engine_equals_plain(route, spec, [[5, 6, 7, 8], [9, 10]], 12)
    assert "advance" in calls and "store" in calls and "decode" in calls
