"""The log-softmax + top-k Triton kernel (a tree's draft selection), run by Triton's interpreter on the CPU, against
PyTorch's log-softmax and topk; and tree speculation through it still equal to plain greedy decoding."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain  # noqa: E402

import eaglespec.spec.draft as draft  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers.topk_kernel import fits, logsoftmax_topk  # noqa: E402


@pytest.mark.parametrize("shape,k", [((3, 1000), 4), ((2, 4, 777), 8), ((1, 50), 1), ((5, 12288), 16)])
def test_kernel_matches_log_softmax_topk_float32(shape, k):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3
    ids, logp = logsoftmax_topk(x, k)
    ref_logp, ref_ids = torch.log_softmax(x, dim=-1).topk(k, dim=-1)
    assert ids.dtype == torch.int64 and logp.dtype == torch.float32 and ids.shape == shape[:-1] + (k,)
    assert torch.equal(ids, ref_ids)  # random float32 rows: no ties
    assert torch.allclose(logp, ref_logp, atol=1e-5, rtol=0)


def test_kernel_bf16_and_ties_take_the_smaller_index():
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ids, logp = logsoftmax_topk(x, 6)
    ref_logp = torch.log_softmax(x.float(), dim=-1)
    assert torch.allclose(logp, ref_logp.topk(6, dim=-1).values, atol=1e-5, rtol=0)  # the same values (ties aside)
    assert torch.allclose(torch.gather(ref_logp, 1, ids), logp, atol=1e-5, rtol=0)  # and ids that carry them
    t = torch.zeros(1, 40)
    t[0, [31, 5, 17]] = 2.0  # three equal maxima, then zeros
    ids, logp = logsoftmax_topk(t, 5)
    assert ids.tolist() == [[5, 17, 31, 0, 1]]
    assert logp[0, 0] == logp[0, 2] and logp[0, 3] < logp[0, 2]


@pytest.mark.parametrize("width", [300, 5000])
def test_rows_masked_by_a_grammar(width):
    """Structured outputs' guided drafts (spec/draft.py `_guided`) hand the kernel rows that are mostly -inf (one
    and several chunks): the same ids and log-probabilities as PyTorch over the allowed entries."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, width, generator=g) * 2
    allowed = torch.rand(4, width, generator=g) < 0.05
    allowed[:, :8] = True  # at least k allowed entries per row
    x = x.masked_fill(~allowed, float("-inf"))
    ids, logp = logsoftmax_topk(x, 8)
    ref_logp, ref_ids = torch.log_softmax(x, dim=-1).topk(8, dim=-1)
    assert torch.equal(ids, ref_ids) and torch.allclose(logp, ref_logp, atol=1e-5, rtol=0)
    assert allowed.gather(1, ids).all()


def test_a_non_contiguous_row_view():
    x = torch.randn(6, 2, 64, generator=torch.Generator().manual_seed(2))[:, 1]  # rows strided by 128
    ids, logp = logsoftmax_topk(x, 3)
    ref_logp, ref_ids = torch.log_softmax(x, dim=-1).topk(3, dim=-1)
    assert torch.equal(ids, ref_ids) and torch.allclose(logp, ref_logp, atol=1e-5, rtol=0)


def test_fits():
    assert fits(12288, 8) and fits(128256, 4) and not fits(200_000, 4) and not fits(12288, 17) and not fits(3, 4)


def test_tree_speculation_through_the_kernel_equals_plain(monkeypatch):
    """The engine's drafting takes the kernel on CUDA only; here it is routed through it on the CPU (interpreter):
    a tree's greedy speculation still gives plain decoding's tokens."""
    calls = []

    def through_kernel(logits, k):
        calls.append(tuple(logits.shape))
        return logsoftmax_topk(logits, k)

    monkeypatch.setattr(draft, "topk_logp", through_kernel)
    assert_transformed_engine_equals_plain(lambda t, d: None, SpecConfig(3, 2, 6), [[5, 6, 7, 8], [9, 10]], 12)
    assert calls and all(s[-1] == 50 for s in calls)  # the tiny drafter's 50-token draft vocabulary


def test_raw_values_mode_is_a_stable_descending_sort():
    """`topk_values` (a tree's frontier and build_tree's selection on CUDA): raw values, the order of a stable
    descending sort, ties to the smaller index, and -inf entries taken once each."""
    from eaglespec.layers.topk_kernel import topk_values

    x = torch.randn(5, 52, generator=torch.Generator().manual_seed(4))
    x[0, [3, 9, 40]] = 1.5  # ties
    x[1, :] = float("-inf")
    x[1, 7] = 0.0  # one finite value, then -inf ones
    ids, vals = topk_values(x, 15)
    ref = torch.sort(x, dim=1, descending=True, stable=True)
    assert torch.equal(ids, ref.indices[:, :15]) and torch.equal(vals, ref.values[:, :15])
    assert all(len(set(row)) == 15 for row in ids.tolist())


def test_tree_selection_through_the_kernel_equals_plain(monkeypatch):
    """draft_tree's frontier and build_tree's D-1 best routed through the raw-values kernel (the CUDA path) on the
    CPU: the same candidates as the PyTorch path (stable order), and tree speculation still equals plain decoding."""
    import eaglespec.spec.tree as tree
    from eaglespec.layers.topk_kernel import topk_values

    calls = []

    def through(scores, k):
        calls.append(tuple(scores.shape))
        return topk_values(scores, k)[0]

    monkeypatch.setattr(draft, "frontier_ids", through)
    monkeypatch.setattr(tree, "best_candidates", through)
    assert_transformed_engine_equals_plain(lambda t, d: None, SpecConfig(3, 2, 6), [[5, 6, 7, 8], [9, 10]], 12)
    assert (2, 4) in calls  # the frontier: K = 2 best of K^2 = 4 children per row
    assert any(s[-1] == 2 + 2 * 4 for s in calls)  # build_tree: N = K + (S-1) K^2 candidates


@pytest.mark.parametrize("log_softmax", [True, False])
def test_two_kernel_path_across_chunks(log_softmax):
    """Rows longer than SPLIT go through per-chunk candidates and a merge: ties in different chunks still go to the
    smaller index, a last chunk shorter than K is handled, and -inf entries are taken once each in index order."""
    from eaglespec.layers.topk_kernel import CHUNK, SPLIT

    V = SPLIT + 3  # the last chunk holds 3 entries, fewer than K
    x = torch.randn(4, V, generator=torch.Generator().manual_seed(5))
    x[0, [V - 1, 7, CHUNK + 5]] = 9.0  # equal maxima in three chunks, the last one included
    x[1, :] = float("-inf")
    x[1, [CHUNK + 1, 3]] = 0.5  # two finite entries, then the -inf ones: 0, 1, 2, 4, ...
    x[2, CHUNK:] = float("-inf")  # whole chunks of -inf
    k = 8
    ids, vals = logsoftmax_topk(x, k, log_softmax=log_softmax)
    ref_vals = torch.log_softmax(x, dim=-1) if log_softmax else x
    ref = torch.sort(ref_vals, dim=1, descending=True, stable=True)
    assert torch.equal(ids, ref.indices[:, :k])
    assert ids[0, :3].tolist() == [7, CHUNK + 5, V - 1] and ids[1].tolist() == [3, CHUNK + 1, 0, 1, 2, 4, 5, 6]
    finite = torch.isfinite(ref.values[:, :k])
    assert torch.equal(finite, torch.isfinite(vals))
    assert torch.allclose(vals[finite], ref.values[:, :k][finite], atol=1e-5, rtol=0)
