"""The TTT loss's fused soft cross-entropy (train/soft_ce.py): its Triton kernels, run by Triton's interpreter on the
CPU, against the eager form (values, argmax with ties, gradients), and a whole TTT loss through the kernels against
the eager loss."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402

import eaglespec.train.soft_ce as soft_ce  # noqa: E402
from eaglespec.train.soft_ce import BLOCK, soft_cross_entropy  # noqa: E402


def _both(logits: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor, monkeypatch):
    """(ce, argmax, grad) of the eager form, then of the kernels, for the loss sum(w * ce)."""
    w = torch.linspace(0.5, 2.0, len(rows))
    out = []
    for kernel in (False, True):
        monkeypatch.setattr(soft_ce, "_use_kernel", lambda x, k=kernel: k)
        z = logits.clone().requires_grad_(True)
        ce, am = soft_cross_entropy(z, probs, rows)
        (ce * w).sum().backward()
        out.append((ce.detach(), am, z.grad))
    return out


@pytest.mark.parametrize("V", [1000, BLOCK, 3 * BLOCK + 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_equal_the_eager_form(V, dtype, monkeypatch):
    g = torch.Generator().manual_seed(V)
    logits = (torch.randn(5, V, generator=g) * 4).to(dtype)
    probs = torch.softmax(torch.randn(7, V, generator=g) * 3, -1)
    probs[6] = 0.0  # a row that sums to 0: the exact form lse * sum(p) - sum(p z) gives 0 there too
    rows = torch.tensor([3, 0, 6, 3, 5])
    (ce0, am0, g0), (ce1, am1, g1) = _both(logits, probs, rows, monkeypatch)
    assert ce1.dtype == torch.float32 and am1.dtype == torch.int64 and g1.dtype == dtype
    assert torch.allclose(ce1, ce0, rtol=1e-5, atol=1e-4), (ce1 - ce0).abs().max()
    assert ce1[2] == 0 and not g1[2].float().any()
    assert torch.equal(am1, am0)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16 gradients: one rounding of each entry
    assert torch.allclose(g1.float(), g0.float(), atol=tol, rtol=tol), (g1.float() - g0.float()).abs().max()


def test_argmax_takes_the_first_index_across_chunks(monkeypatch):
    V = 2 * BLOCK + 5
    logits = torch.zeros(3, V)
    logits[0, [BLOCK + 3, 2 * BLOCK + 1]] = 2.0  # the first maximum in chunk 1, a tie in chunk 2
    logits[1, [5, BLOCK + 5]] = 1.0  # the first maximum in chunk 0
    logits[2, V - 1] = 1.0  # the last entry of a partial chunk
    probs = torch.full((1, V), 1.0 / V)
    (_, am0, _), (_, am1, _) = _both(logits, probs, torch.zeros(3, dtype=torch.int64), monkeypatch)
    assert am1.tolist() == am0.tolist() == [BLOCK + 3, 5, V - 1]


def test_no_rows(monkeypatch):
    monkeypatch.setattr(soft_ce, "_use_kernel", lambda x: True)
    z = torch.zeros(0, 10, requires_grad=True)
    ce, am = soft_cross_entropy(z, torch.ones(2, 10) / 10, torch.zeros(0, dtype=torch.int64))
    ce.sum().backward()
    assert ce.shape == (0,) and am.shape == (0,) and z.grad.shape == (0, 10)


def test_ttt_loss_through_the_kernels_equals_the_eager_loss(monkeypatch):
    """A whole TTT loss on a tiny target and drafter: the same loss, per-step counts and accuracy, and gradients."""
    from tiny import tiny_llama

    from eaglespec.train.drafter import new_drafter
    from eaglespec.train.features import target_features
    from eaglespec.train.ttt import ttt_hiddens, ttt_loss
    from eaglespec.train.vocab import build_draft_vocab

    g = torch.Generator().manual_seed(0)
    target = tiny_llama(seed=0)
    V = target.config.vocab_size
    target.set_eagle3_layers_to_capture([1, 2, 3])
    tokens = torch.randint(0, V, (3, 20), generator=g)
    mask = torch.rand(3, 20, generator=g) < 0.7
    mask[2, 15:] = False  # a shorter row
    vocab = build_draft_vocab(torch.randint(0, 100, (V,), generator=g), V // 2)
    feats = target_features(target, tokens, vocab)
    results = []
    for kernel in (False, True):
        monkeypatch.setattr(soft_ce, "_use_kernel", lambda x, k=kernel: k)
        d = new_drafter(target, (1, 2, 3), vocab, seed=0)
        res = ttt_loss(d, ttt_hiddens(d, tokens, feats.aux, 4), feats, mask)
        res.loss.backward()
        grads = {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}
        results.append((res, grads))
    (r0, g0), (r1, g1) = results
    assert torch.allclose(r1.loss, r0.loss, rtol=1e-5)
    assert torch.allclose(r1.step_loss, r0.step_loss, rtol=1e-5)
    assert torch.equal(r1.count, r0.count) and torch.equal(r1.correct, r0.correct) and r0.count.min() > 0
    assert g0.keys() == g1.keys() and len(g0) > 0
    for n in g0:
        assert torch.allclose(g1[n], g0[n], rtol=1e-4, atol=1e-6), n
