"""The 4-bit CPU path's layer step through numba kernels (engine/int4_step.py, layers/int4_step_kernels.py): the
kernels round as PyTorch rounds to bf16, a step computes what the module path computes (its sums in another order),
a verify of several tokens gives each token the bits one-token steps give it (chains and trees), and layers the
step does not fit, or a machine without numba, keep the module path."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from test_int4_weights import stored_llama

import eaglespec.layers

from eaglespec.engine import int4_step
from eaglespec.engine.int4_step import Int4Step, fits
from eaglespec.engine.kv_cache import KVCache
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.engine.verify_cost import machine_key
from eaglespec.layers import int4_step_kernels as kernels
from eaglespec.layers.context import ForwardContext
from eaglespec.layers.norm import OffsetRMSNorm

CPU = torch.device("cpu")


def q4_llama(use_kernels: bool) -> torch.nn.Module:
    """The tiny Llama of GGUF-like 4-bit groups on the 4-bit path, with or without the numba steps."""
    target = stored_llama(True)
    old, int4_step.USE_KERNELS = int4_step.USE_KERNELS, use_kernels
    try:
        prepare_for_inference(target, CPU, None, None, int4=True)
    finally:
        int4_step.USE_KERNELS = old
    return target


def test_the_kernels_round_as_pytorch_does():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * torch.logspace(-6, 6, 4096)
    # exact ties between two bf16 values, both ways of even
    ties = (torch.arange(1, 257, dtype=torch.float32) * 2**-7 + 2**-16)
    for t in (x, ties, -ties):
        a = t.numpy().copy()
        kernels.round_bf16(a)
        assert torch.equal(torch.from_numpy(a), t.to(torch.bfloat16).float())
    h = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    d = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(64, generator=g).to(torch.bfloat16)
    hn, xn = h.float().numpy().copy(), np.empty((3, 64), np.float32)
    kernels.add_rms_norm(hn, d.float().numpy(), w.float().numpy(), 1e-5, xn)
    s = h + d  # the module path: layers/norm.py in bf16
    ref = w * (s.float() * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    assert torch.equal(torch.from_numpy(hn), s.float())
    assert torch.allclose(torch.from_numpy(xn), ref.float(), rtol=2**-7, atol=0)  # within a bf16 step
    # a drafter's two input norms side by side (engine/int4_drafter.py)
    w2 = torch.randn(64, generator=g).to(torch.bfloat16)
    both = np.empty((3, 128), np.float32)
    kernels.two_rms_norms(h.float().numpy(), w.float().numpy(), 1e-5, d.float().numpy(), w2.float().numpy(), 1e-6, both)
    norm = (lambda t, wt, eps: wt * (t.float() * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + eps))
            .to(torch.bfloat16))  # noqa: E731
    ref2 = torch.cat([norm(h, w, 1e-5), norm(d, w2, 1e-6)], -1).float()
    assert torch.allclose(torch.from_numpy(both), ref2, rtol=2**-7, atol=0)
    gu = torch.randn(3, 128, generator=g).to(torch.bfloat16)
    act = np.empty((3, 64), np.float32)
    kernels.silu_mul(gu.float().numpy(), act)
    gate, up = gu.chunk(2, -1)
    assert torch.allclose(torch.from_numpy(act), (torch.nn.functional.silu(gate) * up).float(), rtol=2**-7, atol=0)


def test_the_kernels_take_and_give_bf16_bits_as_they_take_and_give_float32():
    """The layer step hands the kernels its bf16 tensors' bits (uint16 views) in and out; each kernel computes the
    same values as from and into float32 arrays of the same bf16 values, bit for bit."""
    g = torch.Generator().manual_seed(1)
    bf = (lambda *shape: (torch.randn(*shape, generator=g) * 3).to(torch.bfloat16))  # noqa: E731
    bits = (lambda t: t.view(torch.uint16).numpy())  # noqa: E731
    h, d, w = bf(3, 64), bf(3, 64), bf(64).float().numpy()
    # the helpers' Python forms (outside the kernels) widen and narrow alike
    wide = kernels.as_f32(bits(d))
    assert wide.dtype == np.float32 and np.array_equal(wide, d.float().numpy())
    back = torch.empty(3, 64, dtype=torch.bfloat16)
    x32 = kernels.out_f32(bits(back))
    x32[...] = wide
    kernels.store(bits(back), x32)
    assert torch.equal(back, d) and kernels.out_f32(wide) is wide and kernels.as_f32(wide) is wide
    h1, h2 = h.float().numpy().copy(), h.float().numpy().copy()
    x1, x2 = np.empty((3, 64), np.float32), torch.empty(3, 64, dtype=torch.bfloat16)
    kernels.add_rms_norm(h1, d.float().numpy(), w, 1e-5, x1)
    kernels.add_rms_norm(h2, bits(d), w, 1e-5, bits(x2))
    assert np.array_equal(h1, h2) and torch.equal(torch.from_numpy(x1), x2.float())
    gu, a1, a2 = bf(3, 128), np.empty((3, 64), np.float32), torch.empty(3, 64, dtype=torch.bfloat16)
    kernels.silu_mul(gu.float().numpy(), a1)
    kernels.silu_mul(bits(gu), bits(a2))
    assert torch.equal(torch.from_numpy(a1), a2.float())
    # attention: 2 tokens of 4 query heads over 2 KV heads of 8, a cache of 5 positions (3 before them)
    H, Hkv, D, M = 4, 2, 8, 2
    qkv = bf(M, (H + 2 * Hkv) * D)
    cos, sin = torch.rand(M, D // 2, generator=g).numpy(), torch.rand(M, D // 2, generator=g).numpy()
    past = bf(2, 1, 5, Hkv, D)  # keys, values
    outs, caches = [], []
    for take in (lambda t: t.float().numpy(), bits):
        kc, vc = past[0].clone(), past[1].clone()
        out = torch.empty(M, H * D, dtype=torch.bfloat16)
        o32 = np.empty((M, H * D), np.float32)
        i64 = np.int64
        kernels.rope_store_attend(take(qkv), cos, sin, bits(kc), bits(vc), np.zeros(M, i64), np.array([3, 4], i64),
                                  np.array([4, 5], i64), np.zeros((M, 0), i64), H, Hkv, D**-0.5,
                                  o32 if take is not bits else bits(out))
        outs.append(torch.from_numpy(o32) if take is not bits else out.float())
        caches.append((kc, vc))
    assert torch.equal(outs[0], outs[1]) and outs[0].abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(*caches))


def _prefilled(model: torch.nn.Module, prompt: list[int], room: int) -> tuple[KVCache, int]:
    """A cache of one row holding `prompt` (a causal prefill: the module path)."""
    L = len(prompt)
    kv = KVCache(model.config.num_hidden_layers, model.kv_cache_shapes(), 1, L + room, model.kv_dtype, CPU)
    pos = torch.arange(L)[None]
    ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=pos[..., None] >= pos[:, None, :],
                         kv=kv.layers(), causal=True)
    with torch.inference_mode():
        model(torch.tensor([prompt]), ctx)
    return kv, L


def _forward(model, kv: KVCache, ids: list[int], positions: list[int], slots: list[int],
             mask: torch.Tensor) -> torch.Tensor:
    """Logits [T, V] of one cached forward of tokens `ids` at RoPE `positions`, written at cache `slots`, seeing
    `mask` [T, K] of the cache."""
    ctx = ForwardContext(positions=torch.tensor([positions]), write_index=torch.tensor([slots]),
                         attn_mask=mask[None], kv=kv.layers())
    with torch.inference_mode():
        return model(torch.tensor([ids]), ctx).logits[0]


def test_a_verify_gives_every_token_the_bits_of_one_token_steps():
    """A chain of 4 tokens in one forward against the same 4 one at a time; a tree (node 1 and 2 children of 0, 3 of
    2: node 3 sees the prefix, 0, 2 and itself, not 1) against each node's path as one-token steps."""
    model = q4_llama(True)
    assert all(layer.cpu_step is not None for layer in model.model.layers) and model.int4_steps == 6
    prompt, room = [5, 17, 3, 9, 30, 2, 44], 8
    kv, L = _prefilled(model, prompt, room)
    K = L + room
    chain = [11, 40, 7, 1]
    mask = torch.zeros(4, K, dtype=torch.bool)
    for t in range(4):
        mask[t, : L + t + 1] = True
    together = _forward(model, kv, chain, list(range(L, L + 4)), list(range(L, L + 4)), mask)
    kv1, _ = _prefilled(model, prompt, room)
    for t, tok in enumerate(chain):
        one = _forward(model, kv1, [tok], [L + t], [L + t], mask[t : t + 1])
        assert torch.equal(one[0], together[t]), t
    # the tree: tokens at cache slots L..L+3, positions by depth
    tokens, parents, depth = [11, 40, 8, 1], [-1, 0, 0, 2], [0, 1, 1, 2]
    tmask = torch.zeros(4, K, dtype=torch.bool)
    for t in range(4):
        tmask[t, :L] = True
        n = t
        while n >= 0:
            tmask[t, L + n] = True
            n = parents[n]
    kv2, _ = _prefilled(model, prompt, room)
    tree = _forward(model, kv2, tokens, [L + d for d in depth], list(range(L, L + 4)), tmask)
    for t in range(4):  # the node's path alone, one token a step, as plain decoding would commit it
        path, n = [], t
        while n >= 0:
            path.insert(0, n)
            n = parents[n]
        kv3, _ = _prefilled(model, prompt, room)
        for i, node in enumerate(path):
            m = torch.zeros(1, K, dtype=torch.bool)
            m[0, : L + i + 1] = True
            out = _forward(model, kv3, [tokens[node]], [L + i], [L + i], m)
        assert torch.equal(out[0], tree[t]), t
    assert not torch.equal(tree[3], together[2])  # (node 3's path skips node 1: other keys than the chain's)


def test_a_step_computes_what_the_module_path_computes():
    """The same weights through the kernels and through the modules: a prefill then a 3-token verify, logits equal
    to within bf16 roundings of sums taken in another order, and the same argmax."""
    fast, slow = q4_llama(True), q4_llama(False)
    assert slow.int4_steps == 0 and all(layer.cpu_step is None for layer in slow.model.layers)
    prompt = [5, 17, 3, 9, 30, 2, 44, 60, 12]
    outs = []
    for model in (fast, slow):
        kv, L = _prefilled(model, prompt, 4)
        mask = torch.zeros(3, L + 4, dtype=torch.bool)
        for t in range(3):
            mask[t, : L + t + 1] = True
        outs.append(_forward(model, kv, [11, 40, 7], list(range(L, L + 3)), list(range(L, L + 3)), mask))
    a, b = outs
    assert not torch.equal(a, b)  # (the kernels did run)
    assert (a - b).abs().max() <= 0.02 * b.abs().max() and torch.equal(a.argmax(-1), b.argmax(-1))


def test_layers_the_step_does_not_fit_keep_the_module_path(monkeypatch):
    model = q4_llama(True)
    layer = model.model.layers[0]
    assert fits(layer)
    for attr, value in (("window", 4), ("nope", True), ("softcap", 30.0), ("scale", 0.1)):
        monkeypatch.setattr(layer.self_attn, attr, value)
        assert not fits(layer), attr
        monkeypatch.undo()
    monkeypatch.setattr(layer.mlp, "act_name", "gelu")
    assert not fits(layer)
    monkeypatch.undo()
    layer.post_attention_layernorm = OffsetRMSNorm(64)  # Gemma's norm rounds otherwise
    assert not fits(layer)
    # a machine without numba: nothing attached, the module path runs (and a forward's timing is keyed apart)
    plain, stepped = q4_llama(False), machine_key(q4_llama(True))
    monkeypatch.delattr(eaglespec.layers, "int4_step_kernels")
    monkeypatch.setitem(sys.modules, "eaglespec.layers.int4_step_kernels", None)
    assert Int4Step.attach(plain) == 0 and all(m.cpu_step is None for m in plain.model.layers)
    assert machine_key(plain) != stepped


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "modules"])
def test_prefills_and_long_forwards_take_the_module_path(use_kernels):
    """The step declines causal prefills (and forwards past the row-wise attention's 64 tokens): its layers'
    output there is the module path's exactly."""
    model, ref = q4_llama(use_kernels), q4_llama(False)
    prompt = list(range(3, 80))
    for m in (model, ref):
        kv, L = _prefilled(m, prompt, 1)
        pos = torch.arange(L)[None]
        ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=pos[..., None] >= pos[:, None, :],
                             kv=kv.layers(), causal=True)
        with torch.inference_mode():
            m.out = m(torch.tensor([prompt]), ctx).logits
    assert torch.equal(model.out, ref.out)
