"""TTT equals inference: the unrolled training forward gives, at every position j and step k, the logits the drafter
produces at inference (KV cache, catch-up over pairs 0..j, then k draft steps on its own hidden and the true tokens)."""

from __future__ import annotations

import pytest
import torch
from test_eagle31 import drafter31
from tiny import tiny_llama

from eaglespec.engine.kv_cache import KVCache
from eaglespec.layers.context import ForwardContext, prefix_tail_mask
from eaglespec.spec.draft import catch_up
from eaglespec.train.ttt import ttt_hiddens, ttt_mask

STEPS = 4  # steps 0..3


@pytest.fixture(scope="module", params=[{}, {"norm_before_fc": True, "norm_output": True},
                                        {"fc_norm": True, "norm_output": True}, {"norm_before_residual": True},
                                        {"num_hidden_layers": 3}, {"num_hidden_layers": 2, "norm_output": True}],
                ids=["eagle3", "eagle3.1-norm_before_fc", "eagle3.1-fc_norm", "norm_before_residual",
                     "three-layers", "two-layers-norm_output"])
def models(request):
    """A tiny target and drafter; the drafter plain EAGLE-3, EAGLE-3.1 (its norm weights away from 1), with
    norm_before_residual (its residual hidden_norm(h), as speculators' drafters), or of several decoder layers (each
    with its own KV cache at inference, its own keys per step in TTT)."""
    torch.manual_seed(0)
    target = tiny_llama(seed=0)
    drafter = drafter31(target, {"draft_vocab": 50, **request.param}, seed=1)
    embed, head = target.get_embed_and_head()
    drafter.set_embed_and_head(embed, head)
    target.set_eagle3_layers_to_capture(list(target.config.default_aux_layer_ids()))
    return target, drafter


def inference_logits(drafter, tokens: torch.Tensor, aux: torch.Tensor, j: int, k: int) -> list[torch.Tensor]:
    """Drafter logits at committed position j after 0..k draft steps, through the engine's cached path.

    tokens [n] and aux [n, A] of one sample; returns [Vd] logits for steps 0..k."""
    kv = KVCache(drafter.num_layers, drafter.kv_cache_shapes(), 1, j + k + 2, torch.float32, "cpu")
    seen: list[torch.Tensor] = []

    def step(tok, hidden, positions, write_index, mask, from_target, logits_index):
        ctx = ForwardContext(positions=positions, write_index=write_index, attn_mask=mask, kv=kv.layers(),
                             logits_index=logits_index)
        logits, h = drafter(tok, hidden, ctx, from_target=from_target)
        seen.append(logits.reshape(-1, logits.shape[-1])[-1])
        return logits, h

    # catch-up over the committed pairs (hidden at i, token at i+1), i = 0..j
    st = catch_up(step, tokens[1: j + 2][None], aux[None, : j + 1], torch.zeros(1, dtype=torch.int64),
                  torch.tensor([j + 1]), j + 1, 1)
    hidden = st.hidden[:, None]  # [1, 1, H]
    for s in range(1, k + 1):
        # draft step s: the true token t_{j+1+s} at position j+s, a scratch entry after the prefix seeing its chain
        pos = torch.tensor([[j + s]])
        mask = prefix_tail_mask(torch.tensor([j + 1]), torch.ones(1, 1, s, dtype=torch.bool), j + 1 + s)
        ctx_step = (tokens[j + 1 + s].view(1, 1), hidden, pos, pos, mask, False, None)
        _, hidden = step(*ctx_step)
    return seen


def test_mask_shape():
    m = ttt_mask(3, 2, "cpu")
    assert m.shape == (3, 9)
    assert m[:, :3].equal(torch.ones(3, 3, dtype=torch.bool).tril())
    assert m[:, 3:6].equal(torch.eye(3, dtype=torch.bool)) and m[:, 6:].equal(torch.eye(3, dtype=torch.bool))


def test_ttt_equals_inference(models):
    target, drafter = models
    g = torch.Generator().manual_seed(3)
    lens = [14, 9]
    T = max(lens)
    tokens = torch.randint(0, target.config.vocab_size, (2, T), generator=g)
    tokens[1, lens[1]:] = 0  # right padding, as batches are built
    with torch.no_grad():
        aux = target(tokens, ForwardContext.plain(2, T)).aux_hidden
        hiddens = ttt_hiddens(drafter, tokens, aux, STEPS)
        ttt_logits = [drafter.lm_head(drafter.norm(h)) for h in hiddens]  # [B, T, Vd] per step
        checked = 0
        for b, n in enumerate(lens):
            for j in range(n - 1):
                k = min(STEPS - 1, n - 2 - j)  # the input token t_{j+1+k} must exist
                ref = inference_logits(drafter, tokens[b, :n], aux[b, :n], j, k)
                assert len(ref) == k + 1
                for s in range(k + 1):
                    # EAGLE-3.1's norm_output feeds norm(r), and norm_before_residual adds hidden_norm(h), whose
                    # float32 roundings differ a little between the two paths (up to ~1.4e-5 here): a bug in what is
                    # fed or added shows as O(0.1)
                    tol = 5e-5 if drafter.norm_output or drafter.midlayer.norm_before_residual else 1e-5
                    torch.testing.assert_close(ttt_logits[s][b, j], ref[s], rtol=tol, atol=tol)
                    checked += 1
    assert checked > 60
    # the logits vary across positions and steps (the comparison is not vacuous)
    assert ttt_logits[0][0].std(0).mean() > 0.05
    assert (ttt_logits[1][0, :8] - ttt_logits[0][0, :8]).abs().max() > 0.05


def test_eval_line_gives_the_chain_of_three_estimate_beside_the_full_one():
    from eaglespec.train.trainer import EvalResult

    r = EvalResult(acc=[0.5, 0.5, 0.5, 0.5], loss=1.0, accept_length=1.9375)
    assert r.line().endswith("estimated chain acceptance 1.938 (3 steps: 1.875)")
    assert EvalResult(acc=[0.5, 0.5], loss=1.0, accept_length=1.75).line().endswith("acceptance 1.750")


def test_tokens_after_the_last_loss_token_change_nothing(models):
    """dataset.py cuts a sample after its last loss token (the template's tail, a masked rest cut by --max-len): the
    TTT loss, its per-step counts and accuracies, and the drafter's gradients are the same with and without it."""
    from eaglespec.train.dataset import TokenDataset
    from eaglespec.train.features import target_features
    from eaglespec.train.ttt import ttt_loss
    from eaglespec.train.vocab import build_draft_vocab

    target, drafter = models
    V = target.config.vocab_size
    vocab = build_draft_vocab(torch.arange(V, 0, -1), 50)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (30,), generator=g).tolist()
    mask = [False] * 6 + [True] * 9 + [False] * 3 + [True] * 4 + [False] * 8  # prompt, answer, turn, answer, tail
    ds = TokenDataset.from_samples([(ids, mask)])
    assert ds.lengths.tolist() == [22] and ds.trimmed == 8 and ds.tokens.tolist() == ids[:22]

    def loss_and_grads(tokens: list[int], loss_mask: list[bool]):
        t = torch.tensor([tokens])
        feats = target_features(target, t, vocab)
        drafter.zero_grad()
        res = ttt_loss(drafter, ttt_hiddens(drafter, t, feats.aux, STEPS), feats, torch.tensor([loss_mask]))
        res.loss.backward()
        grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}
        return res, grads

    full, full_grads = loss_and_grads(ids, mask)
    cut, cut_grads = loss_and_grads(ds.tokens.tolist(), ds.mask.tolist())
    assert cut.count.tolist() == full.count.tolist() and full.count.sum() > 20
    assert cut.correct.tolist() == full.correct.tolist()
    torch.testing.assert_close(cut.loss, full.loss, rtol=1e-5, atol=1e-6)
    assert full_grads.keys() == cut_grads.keys() and len(full_grads) > 3
    for name, grad in full_grads.items():  # float32 sums over other lengths: ~1e-6 of the largest entry apart
        torch.testing.assert_close(cut_grads[name], grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max()))
    drafter.zero_grad()


@pytest.mark.parametrize("align", [0, 1, 2])
def test_aligned_positions_equal_a_reference_walk_along_each_path(align):
    """`ttt_loss(align_topk=K)`: step k counts position j only where every earlier step counted it and ranked the
    target's argmax in its top K (K = 0: everywhere); the chain's counts (top-1 paths) come beside whatever K. The
    drafter here is a stand-in whose hidden states are its logits (norm and head the identity), made to rank the
    target's argmax first at ~60% of positions and second at ~20%, so that paths end at every depth; the reference
    walks each position's steps one by one."""
    from types import SimpleNamespace

    from eaglespec.train.features import TargetFeatures
    from eaglespec.train.ttt import step_targets, ttt_loss

    B, T, Vd, S = 3, 40, 6, 5
    g = torch.Generator().manual_seed(7)
    am = torch.randint(0, Vd, (B, T), generator=g)
    am[0, 10:14] = -1  # the target's argmax outside the draft vocabulary: never counted, every path through ends
    probs = torch.softmax(torch.randn(B, T, Vd, generator=g), -1)
    feats = TargetFeatures(None, probs, am)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, 4:36] = True
    loss_mask[2, 20:24] = False  # a prompt inside the row
    hiddens = []
    for k in range(S):
        want = torch.cat([am[:, 1 + k:], am[:, :1 + k]], 1).clamp(min=0)  # the argmax step k predicts at j
        z = torch.randn(B, T, Vd, generator=g)
        rank = torch.rand(B, T, generator=g)
        z.scatter_(-1, want[..., None], torch.where(rank < 0.6, 9.0, torch.where(rank < 0.8, 0.5, -9.0))[..., None])
        z[..., 0] += torch.where(rank < 0.6, 0.0, 5.0)  # second place where it was not first (if want is not 0)
        hiddens.append(z.requires_grad_())
    identity = SimpleNamespace(norm=lambda x: x, lm_head=lambda x: x)
    res = ttt_loss(identity, hiddens, feats, loss_mask, 0.8, align)
    on = chain = None
    want_loss = 0.0
    counted = []
    for k, z in enumerate(hiddens):
        valid, am_k = step_targets(feats, loss_mask, k)
        z = z.detach()
        top1 = z.argmax(-1)
        top2 = z.topk(2, dim=-1).indices
        on = valid if (k == 0 or align == 0) else on & valid
        counted.append(on)
        chain = valid if k == 0 else chain & valid
        n = int(on.sum())
        assert res.count[k] == n and res.chain_count[k] == int(chain.sum())
        assert res.correct[k] == int(((top1 == am_k) & on).sum())
        assert res.chain_correct[k] == int(((top1 == am_k) & chain).sum())
        lab = torch.cat([probs[:, 1 + k:], probs[:, :1 + k]], dim=1)  # position j's label: probs[j + 1 + k]
        ce = -(lab * torch.log_softmax(z, -1)).sum(-1)
        want_k = float(ce[on].sum()) / max(n, 1)
        torch.testing.assert_close(res.step_loss[k], torch.tensor(want_k), rtol=1e-5, atol=1e-6)
        want_loss += 0.8**k * want_k
        chain = chain & (top1 == am_k)  # the paths that go on to step k + 1
        if align == 1:
            on = on & (top1 == am_k)
        elif align == 2:
            on = on & (top2 == am_k[..., None]).any(-1)
    torch.testing.assert_close(res.loss.detach(), torch.tensor(want_loss), rtol=1e-5, atol=1e-6)
    # paths end at every depth and some reach the last step; top-2 paths outlive the chain's
    c = res.chain_count.tolist()
    assert c[0] > c[1] > c[2] > c[3] > c[4] > 0
    if align == 2:
        assert res.count[-1] > res.chain_count[-1]
    res.loss.backward()  # only counted positions carry a gradient
    for z, on in zip(hiddens, counted):
        assert z.grad[~on].abs().sum() == 0 and (z.grad[on].abs().sum(-1) > 0).all()


def test_sharpened_labels_are_the_targets_distribution_to_a_power():
    """`ttt_loss(sharpen=a)`: each counted position's soft label is p^a / sum(p^a) of the target's distribution p
    (in place in the batch's features); what counts and the accuracies do not move (the argmax is the same)."""
    from types import SimpleNamespace

    from eaglespec.train.features import TargetFeatures
    from eaglespec.train.ttt import ttt_loss

    B, T, Vd, S = 2, 24, 7, 3
    g = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(B, T, Vd, generator=g) * 2, -1)
    probs[0, 5] = 0.0  # a row of zeros (nothing of the target's mass in the draft vocabulary) stays zeros
    am = probs.argmax(-1)
    am[0, 5] = -1
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, 3:20] = True
    hiddens = [torch.randn(B, T, Vd, generator=g) for _ in range(S)]
    identity = SimpleNamespace(norm=lambda x: x, lm_head=lambda x: x)
    sharp = probs**2.5
    sharp = sharp / sharp.sum(-1, keepdim=True).clamp(min=1e-30)
    assert torch.equal(sharp[0, 5], torch.zeros(Vd)) and torch.equal(sharp.argmax(-1)[1], am[1])
    want = ttt_loss(identity, hiddens, TargetFeatures(None, sharp.clone(), am), mask)
    feats = TargetFeatures(None, probs.clone(), am)
    got = ttt_loss(identity, hiddens, feats, mask, sharpen=2.5)
    torch.testing.assert_close(feats.probs, sharp)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.step_loss, want.step_loss, rtol=1e-6, atol=1e-6)
    plain = ttt_loss(identity, hiddens, TargetFeatures(None, probs.clone(), am), mask)
    assert not torch.allclose(plain.loss, got.loss)
    for r in (got, want):
        assert torch.equal(r.count, plain.count) and torch.equal(r.correct, plain.correct)
    with pytest.raises(ValueError, match="sharpen > 0"):
        ttt_loss(identity, hiddens, feats, mask, sharpen=0.0)
