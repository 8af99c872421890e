"""Folded norms (engine.transforms.fold_norms) and the long-step layer path they enable: the norm's scale applied by the
SiLU-gating kernel and the RoPE + KV-store kernel after the projection, run by Triton's interpreter on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from test_norm_linear_kernel import few_programs  # noqa: E402
from tiny import tiny_drafter, tiny_llama  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.transforms import (  # noqa: E402
    fold_norms, fuse_projections, use_norm_linear_kernel, use_rope_store_kernel,
)
from eaglespec.layers.context import ForwardContext  # noqa: E402
from eaglespec.layers.mlp import silu_mul  # noqa: E402
from eaglespec.layers.norm import rms_norm, rms_scale  # noqa: E402
from eaglespec.layers.norm_silu_kernel import norm_silu_mul, norm_silu_mul_reference  # noqa: E402
from eaglespec.layers.rope_kv_kernel import rope_store, rope_store_reference  # noqa: E402
from eaglespec.models.base import PreNormDecoderLayer  # noqa: E402


def with_norm_weights(model: torch.nn.Module, seed: int = 3) -> torch.nn.Module:
    """Random RMSNorm weights in [0.5, 1.5) (the tiny models keep ones, which a fold would not notice)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return model


@pytest.mark.parametrize("M,K,I", [(1, 48, 40), (5, 200, 700), (3, 64, 512)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2 ** -7)])
def test_norm_silu_matches_the_norm_then_gating(M, K, I, dtype, tol):
    """silu(r * gate) * (r * up) equals the module path's order, norm(h) @ W^T then gating, with W's columns scaled
    by the norm's weight: the identity the folded layers rely on."""
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(2, M, K, generator=g) * 3).to(dtype)
    w = torch.randn(2 * I, K, generator=g) / K ** 0.5
    nw = 0.5 + torch.rand(K, generator=g)
    out = norm_silu_mul(h @ (w * nw).T.to(dtype), h, 1e-5)
    assert out.shape == (2, M, I) and out.dtype == dtype
    ref = norm_silu_mul_reference(h @ (w * nw).T.to(dtype), h, 1e-5)
    scale = ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol * scale
    module = silu_mul(rms_norm(h.float(), nw, 1e-5) @ w.T)  # the unfolded order, float32
    assert (out.float() - module).abs().max().item() <= (1e-5 if dtype == torch.float32 else 0.05) * scale


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2 ** -5)])
def test_rope_store_applies_the_norm_scale(dtype, tol):
    g = torch.Generator().manual_seed(1)
    B, T, H, Hkv, D, K, S, Bc = 2, 3, 6, 2, 32, 40, 12, 3
    qkv = torch.randn(B, T, H + 2 * Hkv, D, generator=g).to(dtype)
    x = (torch.randn(B, T, K, generator=g) * 4).to(dtype)
    cos, sin = torch.randn(B, T, D // 2, generator=g), torch.randn(B, T, D // 2, generator=g)
    caches = [torch.full((Bc, S, Hkv, D), 7.0, dtype=dtype) for _ in range(4)]
    rows, widx = torch.tensor([2, 0]), torch.tensor([[1, 2, 3], [9, 10, 11]])
    q1 = rope_store(qkv, cos, sin, caches[0], caches[1], rows, widx, H, Hkv, norm_of=(x, 1e-5))
    q2 = rope_store_reference(qkv, cos, sin, caches[2], caches[3], rows, widx, H, Hkv, norm_of=(x, 1e-5))
    for a, b in ((q1, q2), (caches[0], caches[2]), (caches[1], caches[3])):
        assert (a.float() - b.float()).abs().max().item() <= tol * b.float().abs().max().item()
    plain = rope_store_reference(qkv, cos, sin, caches[2].clone(), caches[3].clone(), rows, widx, H, Hkv)
    r = rms_scale(x, 1e-5)[..., None]  # [B, T, 1, 1]: the scale is what the norm argument changes
    scaled = plain.float() * r
    assert (q2.float() - scaled).abs().max().item() <= 2 * tol * scaled.abs().max().item()


def folded_tiny(max_rows: int) -> torch.nn.Module:
    m = with_norm_weights(tiny_llama(seed=0))
    return fold_norms(use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(m)), max_rows=max_rows))


def test_fold_keeps_the_function_on_every_path(monkeypatch):
    """Folding moves each norm's weight into the projection after it: the fused few-row kernel and the folded path
    (here without a cache: the PyTorch scale before RoPE) still give the unfolded model's logits (float32)."""
    few_programs(monkeypatch)
    ref = with_norm_weights(tiny_llama(seed=0))
    m = folded_tiny(max_rows=3)
    layer = m.model.layers[0]
    assert layer.folded_norms and torch.equal(layer.input_layernorm.weight, torch.ones(64))
    assert not torch.equal(layer.self_attn.qkv_proj.weight,
                           torch.cat([ref.model.layers[0].self_attn.q_proj.weight,
                                      ref.model.layers[0].self_attn.k_proj.weight,
                                      ref.model.layers[0].self_attn.v_proj.weight]))
    calls = []
    folded = PreNormDecoderLayer._forward_folded
    monkeypatch.setattr(PreNormDecoderLayer, "_forward_folded", lambda *a: calls.append(1) or folded(*a))
    ids = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])
    for n, folded_calls in ((5, 6), (3, 0)):  # 5 rows, past the kernel's 3: all 6 layers; 3 rows: the fused kernel
        calls.clear()
        got = m(ids[:1, :n], ForwardContext.plain(1, n, ids.device)).logits
        want = ref(ids[:1, :n], ForwardContext.plain(1, n, ids.device)).logits
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        assert len(calls) == folded_calls
    assert fold_norms(m) is m and torch.equal(layer.input_layernorm.weight, torch.ones(64))  # idempotent


def test_folded_layers_update_only_what_the_forward_owns():
    """The folded path updates the residual stream in place: captured aux states and the caller's inputs_embeds
    must not change under it (float32, aux layers -1, 1 and 4 of 6)."""
    ref = with_norm_weights(tiny_llama(seed=0))
    m = folded_tiny(max_rows=0)
    for x in (ref, m):
        x.set_eagle3_layers_to_capture([-1, 1, 4])
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    embeds = ref.embed(ids)
    kept = embeds.clone()
    got = m(None, ForwardContext.plain(1, 5, ids.device), inputs_embeds=embeds)
    want = ref(ids, ForwardContext.plain(1, 5, ids.device))
    assert torch.equal(embeds, kept)
    assert torch.allclose(got.aux_hidden, want.aux_hidden, rtol=1e-5, atol=1e-4)  # the residual stream grows
    assert torch.allclose(got.logits, want.logits, atol=1e-5)


def test_only_layers_with_the_norm_kernel_are_folded():
    m = fold_norms(use_rope_store_kernel(fuse_projections(with_norm_weights(tiny_llama(seed=0)))))
    assert not any(layer.folded_norms for layer in m.model.layers)  # no norm_linear: not the measured policy
    assert not torch.equal(m.model.layers[0].input_layernorm.weight, torch.ones(64))


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(2, 2, 4)])
def test_engine_with_folded_norms_equals_plain(monkeypatch, spec):
    """Greedy speculation and plain decoding with every target step on the folded path (the fused kernel's row limit
    set to 0: prefills, decode and verify steps, over the KV cache, so that the RoPE + KV-store kernel applies the
    scale) give the unfolded model's tokens, float32, for a chain and a tree."""
    from eaglespec.engine.engine import Engine
    from eaglespec.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    prompts = [[1, 2, 3, 4], list(range(10, 17))]
    target = with_norm_weights(tiny_llama(seed=0))
    ref = [o.token_ids for o in Engine(target, None).generate(prompts, params)]
    drafter = tiny_drafter(target, seed=1)
    fold_norms(use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(target)), max_rows=0))
    rows: list[int] = []
    folded = PreNormDecoderLayer._forward_folded
    monkeypatch.setattr(PreNormDecoderLayer, "_forward_folded",
                        lambda self, h, *a: rows.append(h.shape[0] * h.shape[1]) or folded(self, h, *a))
    assert [o.token_ids for o in Engine(target, None).generate(prompts, params)] == ref
    assert [o.token_ids for o in Engine(target, None, drafter=drafter, spec=spec).generate(prompts, params)] == ref
    assert {2, 2 * spec.draft_tokens} <= set(rows)  # a 2-row decode step and a 2-row verify step among them
