"""The drafter's input kernel (embedding lookup, both input norms, concatenation, RoPE's cos/sin in one launch), run by
Triton's interpreter on the CPU: against the PyTorch path for strided and broadcast inputs and both dtypes; a drafter
wired through it (`use_draft_input_kernel`) gives the plain drafter's logits and hidden states in a catch-up and a
draft step; and speculation with it still gives plain greedy tokens, for chains and trees."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

from copy import deepcopy  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain, tiny_drafter, tiny_llama  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.kv_cache import KVCache  # noqa: E402
from eaglespec.engine.transforms import fuse_projections, use_draft_input_kernel  # noqa: E402
from eaglespec.layers.context import ForwardContext  # noqa: E402
from eaglespec.layers.draft_input_kernel import draft_input, draft_input_reference, fits  # noqa: E402
from eaglespec.layers.rotary import inv_freq_and_scale  # noqa: E402
from eaglespec.config import RopeConfig  # noqa: E402


def _inputs(B, T, H, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    embed = (torch.randn(V, H, generator=g) * 0.5).to(dtype)
    ids = torch.randint(0, V, (B, T), generator=g)
    h = (torch.randn(B, T, H, generator=g) * 3).to(dtype)
    w_e = (1 + 0.1 * torch.randn(H, generator=g)).to(dtype)
    w_h = (1 + 0.1 * torch.randn(H, generator=g)).to(dtype)
    positions = torch.randint(0, 4000, (B, T), generator=g)
    return ids, embed, h, w_e, w_h, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,T,H", [(1, 1, 64), (3, 4, 48), (2, 5, 576)])
def test_matches_the_pytorch_path(dtype, B, T, H):
    ids, embed, h, w_e, w_h, positions = _inputs(B, T, H, 97, dtype)
    inv, factor = inv_freq_and_scale(32, RopeConfig(type="yarn", factor=4.0, original_max_position_embeddings=512))
    assert factor != 1.0  # the attention factor is applied too
    got = draft_input(ids, embed, h, w_e, 1e-5, w_h, 1e-6, positions, inv, factor)
    want = draft_input_reference(ids, embed, h, w_e, 1e-5, w_h, 1e-6, positions, inv, factor)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
    # bf16: the same roundings, float32 sums in another order: a rounding flips by one ulp now and then (two roundings
    # in a row: at most two ulps, 2^-6 relative)
    x_tol = 1e-5 if dtype == torch.float32 else 2.0**-6
    torch.testing.assert_close(got[0], want[0], atol=x_tol, rtol=x_tol)
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)  # positions up to 4000: angles of 4000 rad
    torch.testing.assert_close(got[2], want[2], atol=1e-4, rtol=1e-4)


def test_broadcast_and_strided_inputs():
    """A tree level hands the frontier's hidden as an expand (stride 0 over its K slots) and its positions as an
    expand too; a chain's hidden is a [B, 1, H] view of [B, H]."""
    B, K, H = 2, 3, 64
    ids, embed, h, w_e, w_h, positions = _inputs(B, K, H, 97, torch.float32, seed=1)
    inv, factor = inv_freq_and_scale(16, RopeConfig())
    h_exp = h[:, :1].expand(B, K, H)
    pos_exp = positions[:, :1].expand(B, K)
    ids_t = ids.t().contiguous().t()  # column-major [B, K]
    got = draft_input(ids_t, embed, h_exp, w_e, 1e-6, w_h, 1e-6, pos_exp, inv, factor)
    want = draft_input_reference(ids, embed, h_exp.contiguous(), w_e, 1e-6, w_h, 1e-6, pos_exp.contiguous(), inv,
                                 factor)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fits():
    assert fits(576, 32) and fits(4096, 64) and not fits(0, 32) and not fits(16384, 64)


def _drafters(draft_vocab=50, **flags):
    target = fuse_projections(tiny_llama(seed=0))
    plain = fuse_projections(tiny_drafter(target, seed=1, draft_vocab=draft_vocab, **flags))
    wired = use_draft_input_kernel(deepcopy(plain))
    for d in (plain, wired):
        d.set_embed_and_head(*target.get_embed_and_head())
    return target, plain, wired


def test_the_transform_wires_drafters_only():
    target, plain, wired = _drafters()
    assert plain.draft_input is None and wired.draft_input is draft_input
    use_draft_input_kernel(target)  # a target has no drafter input: nothing to wire, nothing broken
    assert not hasattr(target, "draft_input")


@pytest.mark.parametrize("draft_vocab,norm_before_residual", [(50, False), (None, False), (50, True)])
def test_a_wired_drafter_equals_the_plain_one(monkeypatch, draft_vocab, norm_before_residual):
    """A catch-up of 4 tokens (fc on the target's aux states, logits of the last only) and a draft step of 1 from the
    drafter's own hidden: the same logits and hidden states in float32, and the kernel ran in both; with
    norm_before_residual too (the residual is then the kernel's normalised half of x)."""
    target, plain, wired = _drafters(draft_vocab, norm_before_residual=norm_before_residual)
    calls = []
    wired.draft_input = lambda ids, *a: calls.append(tuple(ids.shape)) or draft_input(ids, *a)
    g = torch.Generator().manual_seed(3)
    toks, aux = torch.randint(0, 97, (2, 4), generator=g), torch.randn(2, 4, 3 * 64, generator=g)
    outs = []
    for d in (plain, wired):
        kv = KVCache(1, d.kv_cache_shapes(), 2, 8, torch.float32, "cpu")
        pos = torch.arange(4)[None].expand(2, 4) + torch.tensor([[0], [2]])
        mask = torch.ones(4, 8, dtype=torch.bool).tril()[None].expand(2, 4, 8)
        ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=mask, kv=kv.layers(),
                             logits_index=torch.tensor([[3], [1]]))
        logits, h = d(toks, aux, ctx, from_target=True)
        at = torch.tensor([[4], [6]])
        ctx = ForwardContext(positions=at, write_index=at, attn_mask=torch.ones(2, 1, 8, dtype=torch.bool),
                             kv=kv.layers())
        logits2, h2 = d(torch.tensor([[5], [7]]), h[:, -1:], ctx, from_target=False)
        outs.append((logits, h, logits2, h2))
    for a, b in zip(*outs):
        # float32, two summation orders (numpy in Triton's interpreter, MKL): the hidden states reach ~24, where an
        # AVX-512 host differed by 1.8e-5 (~10 ulp of the largest value); a wrong kernel differs by orders more
        torch.testing.assert_close(a, b, atol=4e-6 * b.abs().max().item(), rtol=1e-5)
    assert calls == [(2, 4), (2, 1)]


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)])
def test_speculation_through_the_kernel_equals_plain(spec):
    def route(target, drafter):
        fuse_projections(drafter)
        use_draft_input_kernel(drafter)

    assert_transformed_engine_equals_plain(route, spec, [[5, 6, 7, 8], [9, 10]], 12)
