"""A chain step's positions and masks in one kernel (layers/chain_start_kernel.py), run by Triton's interpreter on the
CPU: the drafting levels' positions and masks and the depth-1 token, and the verify's rows, against the PyTorch path;
and speculation with every chain started and verified through the kernel still gives plain greedy tokens."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain, kernel_spy  # noqa: E402

import eaglespec.spec.draft as draft  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import chain_start_kernel as csk  # noqa: E402
from eaglespec.layers.context import causal_mask  # noqa: E402


@pytest.mark.parametrize("B,levels,kv_len", [(1, 2, 256), (3, 1, 64), (2, 5, 1030)])
def test_matches_the_pytorch_path(B, levels, kv_len):
    g = torch.Generator().manual_seed(B * 10 + levels)
    seq_len = torch.randint(3, kv_len - levels, (B,), generator=g)
    top_ids = torch.randint(0, 40, (B, 1), generator=g)
    table = torch.randperm(500, generator=g)[:40]
    outs = []
    for k in (True, False):
        tokens = torch.full((B, levels + 1), -3, dtype=torch.int64)
        outs.append((*csk.chain_start(seq_len, top_ids, table, levels, kv_len, tokens, kernel=k), tokens))
    for a, b in zip(*outs):
        assert a.dtype == b.dtype and torch.equal(a, b)
    positions, masks, tokens = outs[0]
    assert torch.equal(positions, seq_len[None, :] + torch.arange(levels)[:, None])  # level-major [S-1, B]
    assert masks.shape == (levels, B, kv_len) and torch.equal(masks, causal_mask(positions, kv_len))
    assert torch.equal(tokens[:, 0], table[top_ids[:, 0]]) and (tokens[:, 1:] == -3).all()  # column 0 only


@pytest.mark.parametrize("B,T,kv_len", [(1, 4, 256), (3, 6, 64), (2, 2, 1030)])
def test_verify_rows_match_the_pytorch_path(B, T, kv_len):
    """A chain verify's positions [B, T] (row-major) and causal masks [B, T, kv_len]; level-major ([T, B], [T, B,
    kv_len]) for the drafting levels without the depth-1 lookup: the same values transposed."""
    seq_len = torch.randint(3, kv_len - T, (B,), generator=torch.Generator().manual_seed(B + T))
    (p1, m1), (p2, m2) = (csk.causal_rows(seq_len, T, kv_len, kernel=k) for k in (True, False))
    assert torch.equal(p1, p2) and torch.equal(m1, m2) and m1.dtype == torch.bool
    assert torch.equal(p1, seq_len[:, None] + torch.arange(T)) and torch.equal(m1, causal_mask(p1, kv_len))
    for k in (True, False):
        p3, m3 = csk.causal_rows(seq_len, T, kv_len, level_major=True, kernel=k)
        assert torch.equal(p3, p1.T) and torch.equal(m3, m1.transpose(0, 1))


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(1, 1, 2), SpecConfig(5, 1, 6)])
def test_speculation_through_the_kernel_equals_plain(monkeypatch, spec):
    import eaglespec.engine.spec_step as spec_step

    calls = []

    def route(target, drafter):  # labels: the drafting start's levels, the verify's T
        monkeypatch.setattr(draft, "chain_start", kernel_spy(calls, csk.chain_start, lambda a: ("start", a[3])))
        monkeypatch.setattr(spec_step, "causal_rows", kernel_spy(calls, csk.causal_rows, lambda a: ("verify", a[1])))

    assert_transformed_engine_equals_plain(route, spec, [[5, 6, 7, 8], [9, 10]], 12)
    assert set(calls) == {("start", max(spec.steps - 1, 1)), ("verify", spec.draft_tokens)}
