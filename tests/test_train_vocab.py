"""The draft vocabulary map (d2t / t2d) and the loss masks of the TTT objective."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tiny import tiny_llama

from eaglespec.layers.context import ForwardContext
from eaglespec.train.drafter import new_drafter
from eaglespec.train.features import TargetFeatures, target_features
from eaglespec.train.ttt import acceptance_estimate, step_targets, ttt_hiddens, ttt_loss
from eaglespec.train.vocab import build_draft_vocab, count_tokens


def test_most_frequent_tokens_kept_and_round_trip():
    V = 20
    tokens = torch.tensor([7, 7, 7, 3, 3, 15, 15, 15, 15, 1, 9, 9, 2])
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[-1] = False  # token 2 is not an assistant token: not counted
    counts = count_tokens(tokens, mask, V)
    assert counts[2] == 0 and counts[15] == 4
    v = build_draft_vocab(counts, 4)
    assert v.kept.tolist() == [3, 7, 9, 15]  # the 4 most frequent, ascending
    assert v.d2t.tolist() == [3 - 0, 7 - 1, 9 - 2, 15 - 3]
    draft_ids = torch.arange(4)
    assert (draft_ids + v.d2t[draft_ids]).tolist() == [3, 7, 9, 15]  # draft -> target (the checkpoint convention)
    assert v.t2d.nonzero().flatten().tolist() == [3, 7, 9, 15] and v.t2d.dtype == torch.bool
    t2d_map = v.target_to_draft
    assert t2d_map[v.kept].tolist() == [0, 1, 2, 3] and (t2d_map[~v.t2d] == -1).all()
    # ties are broken by the lower id; unseen ids fill a vocabulary larger than the seen set
    v6 = build_draft_vocab(counts, 7)
    assert v6.kept.tolist() == [0, 1, 2, 3, 7, 9, 15]  # the 5 seen ids, then unseen 0 and 2
    assert abs(v.coverage(counts) - 11 / 12) < 1e-6


def test_drafter_round_trip_through_to_target_ids():
    target = tiny_llama(seed=0)
    counts = torch.arange(target.config.vocab_size).flip(0)  # lower ids are more frequent
    v = build_draft_vocab(counts, 30)
    d = new_drafter(target, (1, 2, 3), v)
    assert d.to_target_ids(torch.arange(30)).tolist() == list(range(30))
    assert d.t2d[:30].all() and not d.t2d[30:].any()
    # the lm_head starts from the target's head rows of the kept tokens; the embedding is the target's, frozen
    assert torch.equal(d.lm_head.weight, target.lm_head.weight[:30])
    assert d.embed_tokens.weight is target.get_embed_and_head()[0] and not d.embed_tokens.weight.requires_grad


def test_positions_outside_the_draft_vocab_carry_no_loss():
    target = tiny_llama(seed=0)
    target.set_eagle3_layers_to_capture([1, 2, 3])
    V = target.config.vocab_size
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, V, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.bool)
    with torch.no_grad():
        logits = target(tokens, ForwardContext.plain(2, 12)).logits
    # a draft vocabulary that excludes the target's argmax at some positions but not all
    am = logits.argmax(-1)
    excluded = am[0, 3].item()
    counts = torch.ones(V, dtype=torch.int64)
    counts[excluded] = 0
    v = build_draft_vocab(counts, V // 2)
    assert not v.t2d[excluded]
    feats = target_features(target, tokens, v)
    assert feats.argmax[0, 3] == -1
    assert torch.allclose(feats.probs.sum(-1), torch.ones(2, 12))
    d = new_drafter(target, (1, 2, 3), v, seed=0)
    for k in range(3):
        valid, _ = step_targets(feats, mask, k)
        # step k at j predicts t_{j+2+k} from the target's distribution at j+1+k
        assert not valid[0, 2 - k]  # its label is the target's distribution at position 3
        assert not valid[:, 12 - 2 - k:].any()  # nothing past the end
        expect = (F.pad(feats.argmax[:, 1 + k:], (0, 1 + k), value=-1) >= 0) & F.pad(mask[:, 2 + k:], (0, 2 + k))
        assert torch.equal(valid, expect)
    with torch.no_grad():
        hid = ttt_hiddens(d, tokens, feats.aux, 3)
        base = ttt_loss(d, hid, feats, mask)
        # changing the soft labels where the argmax is outside the draft vocab changes nothing
        probs = feats.probs.clone()
        probs[0, 3] = torch.softmax(torch.randn(v.size, generator=g), -1)
        other = ttt_loss(d, hid, TargetFeatures(feats.aux, probs, feats.argmax), mask)
        assert torch.equal(base.loss, other.loss) and torch.equal(base.count, other.count)
        # ... while the same change at a counted position does change the loss
        probs2 = feats.probs.clone()
        probs2[0, 5] = torch.softmax(torch.randn(v.size, generator=g), -1)
        assert not torch.equal(ttt_loss(d, hid, TargetFeatures(feats.aux, probs2, feats.argmax), mask).loss,
                               base.loss)
        # a loss mask that is false everywhere counts nothing and gives zero loss
        none = ttt_loss(d, hid, feats, torch.zeros_like(mask))
        assert none.loss == 0 and none.count.sum() == 0
    # ... and a training step on such a batch still has a graph to run backward through (zero gradients)
    none = ttt_loss(d, ttt_hiddens(d, tokens, feats.aux, 3), feats, torch.zeros_like(mask))
    none.loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in d.parameters())


def test_acceptance_estimate():
    assert acceptance_estimate([]) == 1.0
    assert abs(acceptance_estimate([0.5, 0.5]) - (1 + 0.5 + 0.25)) < 1e-12
    assert acceptance_estimate([1.0, 1.0, 1.0]) == 4.0


def test_features_of_the_inference_form_equal_the_plain_target():
    """`eaglespec train` runs the frozen target in its inference form (fused projections on CUDA): the features the
    drafter learns from must not change (checked here with the fusion forced on the CPU)."""
    from eaglespec.engine.transforms import prepare_for_inference

    g = torch.Generator().manual_seed(1)
    plain, fused = tiny_llama(seed=0), prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), True, False)
    assert hasattr(fused.model.layers[0].self_attn, "qkv_proj")
    tokens = torch.randint(0, plain.config.vocab_size, (2, 16), generator=g)
    v = build_draft_vocab(torch.arange(plain.config.vocab_size).flip(0), 40)
    feats = []
    for m in (plain, fused):
        m.set_eagle3_layers_to_capture([1, 2, 3])
        feats.append(target_features(m, tokens, v))
    assert torch.allclose(feats[0].aux, feats[1].aux, atol=1e-5)
    assert torch.allclose(feats[0].probs, feats[1].probs, atol=1e-6)
    assert torch.equal(feats[0].argmax, feats[1].argmax)
