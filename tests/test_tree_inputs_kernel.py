"""A tree step's positions and masks in one kernel each (layers/tree_inputs_kernel.py), run by Triton's interpreter on
the CPU: the drafting start (every level's positions and write slots, level 2's mask, the depth-1 tokens) and the
verify's inputs (positions, write slots, the prefix + ancestors mask) against the PyTorch path; and tree speculation
with both routed through the kernels still gives plain greedy tokens."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain, kernel_spy  # noqa: E402

import eaglespec.engine.spec_step as spec_step  # noqa: E402
import eaglespec.spec.draft as draft  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import tree_inputs_kernel as tik  # noqa: E402
from eaglespec.layers.context import prefix_tail_mask  # noqa: E402


@pytest.mark.parametrize("B,K,steps,kv_len", [(1, 8, 6, 256), (3, 2, 2, 64), (2, 4, 5, 1030)])
def test_draft_start_matches_the_pytorch_path(B, K, steps, kv_len):
    g = torch.Generator().manual_seed(B * 100 + K * 10 + steps)
    seq_len = torch.randint(3, kv_len - (steps - 1) * K, (B,), generator=g)
    top_ids = torch.randint(0, 40, (B, K), generator=g)
    table = torch.randperm(500, generator=g)[:40]
    (p1, m1, t1), (p2, m2, t2) = (tik.tree_draft_start(seq_len, top_ids, table, steps, kv_len, kernel=k)
                                  for k in (True, False))
    assert torch.equal(p1, p2) and torch.equal(m1, m2) and torch.equal(t1, t2) and m1.dtype == torch.bool
    assert p1.shape == (2, steps - 1, B, K) and torch.equal(t1, table[top_ids])
    lvl, j = torch.arange(steps - 1)[:, None, None], torch.arange(K)
    assert torch.equal(p1[0], (seq_len[:, None] + lvl).expand(steps - 1, B, K))  # RoPE positions: L + level - 2
    assert torch.equal(p1[1], seq_len[:, None] + lvl * K + j)  # write slots: L + (level - 2) K + j
    k = torch.arange(kv_len)
    want = (k < seq_len[:, None, None]) | (k == (seq_len[:, None] + j)[..., None])  # the prefix and its own entry
    assert torch.equal(m1, want)


@pytest.mark.parametrize("B,D,kv_len", [(1, 48, 256), (3, 6, 64), (2, 16, 1030)])
def test_verify_inputs_match_the_pytorch_path(B, D, kv_len):
    g = torch.Generator().manual_seed(B * 100 + D)
    seq_len = torch.randint(3, kv_len - D, (B,), generator=g)
    depth = torch.randint(0, 6, (B, D), generator=g)
    ancestors = torch.rand(B, D, D, generator=g) < 0.3
    (p1, w1, m1), (p2, w2, m2) = (tik.tree_verify_inputs(seq_len, depth, ancestors, kv_len, kernel=k)
                                  for k in (True, False))
    assert torch.equal(p1, p2) and torch.equal(w1, w2) and torch.equal(m1, m2)
    assert torch.equal(p1, seq_len[:, None] + depth) and torch.equal(w1, seq_len[:, None] + torch.arange(D))
    assert torch.equal(m1, prefix_tail_mask(seq_len, ancestors, kv_len))


@pytest.mark.parametrize("spec", [SpecConfig(3, 2, 6), SpecConfig(4, 4, 16)])
def test_tree_speculation_through_the_kernels_equals_plain(monkeypatch, spec):
    calls = []

    def route(target, drafter):
        monkeypatch.setattr(spec_step, "draft_tree", functools.partial(draft.draft_tree, kernels=True))
        monkeypatch.setattr(draft, "tree_draft_start", kernel_spy(calls, tik.tree_draft_start, "start"))
        monkeypatch.setattr(spec_step, "tree_verify_inputs", kernel_spy(calls, tik.tree_verify_inputs, "verify"))

    assert_transformed_engine_equals_plain(route, spec, [[5, 6, 7, 8], [9, 10]], 12)
    assert {"start", "verify"} == set(calls)
