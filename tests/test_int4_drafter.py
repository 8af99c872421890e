"""An EAGLE-3 drafter beside a target on the 4-bit CPU path (engine/int4_drafter.py): its weights quantized to 4-bit
groups (lossy, close), the engine converting it, its numba forward computing what its modules compute (a catch-up, a
draft step from its own hidden, a tree level; EAGLE-3.1's flags), and drafters it does not fit keeping their modules.
That the engine's tokens stay plain decoding's with such a drafter: tests/test_int4_weights.py (every speculative
test there runs it)."""

from __future__ import annotations

import pytest
import torch
from test_int4_step import q4_llama
from tiny import tiny_drafter, tiny_llama

from eaglespec.engine import int4_step
from eaglespec.engine.engine import Engine
from eaglespec.engine.int4_drafter import Int4DraftStep, fits, use_int4_drafter
from eaglespec.engine.kv_cache import KVCache
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.layers.context import ForwardContext
from eaglespec.layers.int4_linear import GROUP, Int4Linear, quantize_groups
from eaglespec.config import SpecConfig

CPU = torch.device("cpu")
BF16 = torch.bfloat16


def _dequantized(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    N, K = codes.shape
    g = codes.float().reshape(N, K // GROUP, GROUP)
    return ((g - 8) * scale[..., None] + zero[..., None]).reshape(N, K)


def test_quantized_groups_hold_the_weights_closely():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 128, generator=g) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different scales
    codes, scale, zero = quantize_groups(w)
    assert codes.dtype == torch.int32 and int(codes.min()) >= 0 and int(codes.max()) <= 15
    for t in (scale, zero):  # the kernel's bf16, exactly
        assert torch.equal(t, t.to(BF16).float())
    err = (_dequantized(codes, scale, zero) - w).norm(dim=1) / w.norm(dim=1)
    first = quantize_groups(w, refits=0)
    err0 = (_dequantized(*first) - w).norm(dim=1) / w.norm(dim=1)
    assert float(err.max()) < 0.1 and float(err.mean()) < float(err0.mean())  # the refits fit closer than the range
    # weights that are 4-bit groups already (bf16 scale and zero) come back exactly
    exact = _dequantized(codes, scale, zero)
    assert torch.equal(_dequantized(*quantize_groups(exact)), exact)
    # a constant group: scale 0, every weight its zero
    flat = torch.full((16, 32), 0.375)
    assert torch.equal(_dequantized(*quantize_groups(flat)), flat)
    # the layer multiplies as its dequantized weights do (bf16 activations)
    layer = Int4Linear.quantize(w)
    x = torch.randn(3, 128, generator=g).to(BF16)
    ref = x.float() @ exact.t()
    assert torch.allclose(layer(x).float(), ref, rtol=2**-6, atol=1e-3 * float(ref.abs().max()))
    assert Int4Linear.quantize(torch.randn(8, 40)) is None  # K not a multiple of 32


def _q4_engine_drafter(draft_vocab: int | None = 50, **kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    target = q4_llama(True)
    drafter = prepare_for_inference(tiny_drafter(target, seed=1, draft_vocab=draft_vocab, **kw).to(BF16), CPU, None,
                                    None)
    return target, drafter


def test_the_engine_converts_a_drafter_beside_a_4bit_target():
    target, drafter = _q4_engine_drafter()
    eng = Engine(target, None, drafter=drafter, spec=SpecConfig(2, 1, 3))
    linears = ["fc", "midlayer.self_attn.qkv_proj", "midlayer.self_attn.o_proj", "midlayer.mlp.gate_up_proj",
               "midlayer.mlp.down_proj", "lm_head"]
    assert all(isinstance(drafter.get_submodule(n), Int4Linear) for n in linears)
    assert not any(isinstance(m, torch.nn.Linear) for m in drafter.modules())
    assert isinstance(drafter.cpu_step, Int4DraftStep) and drafter.int4_weights
    eng.reserve(1, 16)
    assert eng.runner.dkv.layers()[0][0].dtype == BF16  # its cache bf16, as the kernels read it
    assert not use_int4_drafter(drafter)  # once
    # beside a dense target nothing changes
    dense, plain_drafter = tiny_llama(seed=0), tiny_drafter(tiny_llama(seed=0), seed=1)
    Engine(dense, None, drafter=plain_drafter, spec=SpecConfig(2, 1, 3))
    assert plain_drafter.cpu_step is None and isinstance(plain_drafter.lm_head, torch.nn.Linear)
    # a drafter without its own vocabulary reads the target's head: that one is left alone
    target, shared = _q4_engine_drafter(draft_vocab=None)
    Engine(target, None, drafter=shared, spec=SpecConfig(2, 1, 3))
    assert isinstance(shared.lm_head, torch.nn.Linear) and isinstance(shared.fc, Int4Linear)
    assert shared.lm_head.weight is target.model.embed_tokens.weight


def _wired(dtype: torch.dtype = BF16, **kw) -> torch.nn.Module:
    """A tiny drafter (bf16) holding a tiny target's embedding, converted (quantized, its step attached)."""
    target = tiny_llama(seed=0).to(dtype)
    drafter = prepare_for_inference(tiny_drafter(target, seed=1, **kw).to(dtype), CPU, None, None)
    drafter.set_embed_and_head(*target.get_embed_and_head())
    use_int4_drafter(drafter)
    return drafter


def _run(drafter, kv: KVCache, ids, hidden, positions, slots, mask, from_target, index=None):
    ctx = ForwardContext(positions=torch.tensor([positions]), write_index=torch.tensor([slots]),
                         attn_mask=mask[None], kv=kv.layers(),
                         logits_index=None if index is None else torch.tensor([index]))
    with torch.inference_mode():
        return drafter(torch.tensor([ids]), hidden, ctx, from_target=from_target)


@pytest.mark.parametrize("flag", [None, "norm_before_residual", "norm_output"])
def test_the_drafter_step_computes_what_its_modules_compute(flag):
    """A catch-up of 5 tokens from the target's aux states (the logits of the last two), a draft step from the
    drafter's own hidden, then a tree level of two tokens (each sees the prefix and itself): through the kernels and
    through the modules, logits within bf16 roundings of sums in another order with the same argmax, the next hidden
    likewise."""
    drafter = _wired()
    if flag == "norm_before_residual":
        drafter.midlayer.norm_before_residual = True
    elif flag == "norm_output":
        drafter.norm_output = True
    step = drafter.cpu_step
    g = torch.Generator().manual_seed(3)
    aux = (torch.randn(1, 5, 3 * 64, generator=g)).to(BF16)
    L = 8
    outs = []
    for use in (step, None):
        drafter.cpu_step = use
        kv = KVCache(1, drafter.kv_cache_shapes(), 1, L, BF16, CPU)
        mask = torch.ones(5, L, dtype=torch.bool).tril()
        a = _run(drafter, kv, [5, 17, 3, 9, 30], aux, list(range(5)), list(range(5)), mask, True, [3, 4])
        m1 = torch.zeros(1, L, dtype=torch.bool)
        m1[0, :6] = True
        b = _run(drafter, kv, [int(a[0][0, -1].argmax())], a[1][:, -1:], [5], [5], m1, False)
        tree = torch.zeros(2, L, dtype=torch.bool)
        tree[:, :6] = True
        tree[0, 6] = tree[1, 7] = True
        c = _run(drafter, kv, [11, 40], b[1].expand(1, 2, -1), [6, 6], [6, 7], tree, False)
        outs.append((a, b, c))
    for (lf, hf), (lm, hm) in zip(*outs):
        assert lf.shape == lm.shape and hf.shape == hm.shape and hf.dtype == hm.dtype == BF16
        assert torch.equal(lf.float().argmax(-1), lm.float().argmax(-1))
        assert (lf.float() - lm.float()).abs().max() <= 0.03 * lm.float().abs().max()
        assert (hf.float() - hm.float()).abs().max() <= 0.03 * hm.float().abs().max()
    assert not torch.equal(outs[0][2][0], outs[1][2][0]) or not torch.equal(outs[0][0][0], outs[1][0][0])


def test_drafters_the_step_does_not_fit_keep_their_modules(monkeypatch):
    drafter = _wired()
    assert fits(drafter)
    monkeypatch.setattr(drafter.midlayer.mlp, "act_name", "gelu")
    assert not fits(drafter)
    monkeypatch.undo()
    monkeypatch.setattr(drafter.midlayer.self_attn, "window", 4)
    assert not fits(drafter)
    monkeypatch.undo()
    two = _wired(num_hidden_layers=2)  # a later layer: modules (its products still quantized)
    assert two.cpu_step is None and isinstance(two.layers["1"].self_attn.qkv_proj, Int4Linear)
    monkeypatch.setattr(int4_step, "USE_KERNELS", False)  # a machine without numba: quantized, no step
    plain = _wired()
    assert plain.cpu_step is None and isinstance(plain.lm_head, Int4Linear)
    assert getattr(plain, "kv_dtype", None) is None  # its modules read a cache of its own dtype
    monkeypatch.undo()
    # a forward past the row-wise limit (a long prompt's catch-up) is the modules'
    kv = KVCache(1, drafter.kv_cache_shapes(), 1, 70, BF16, CPU)
    pos = list(range(70))
    ctx = ForwardContext(positions=torch.tensor([pos]), write_index=torch.tensor([pos]),
                         attn_mask=torch.ones(70, 70, dtype=torch.bool).tril()[None], kv=kv.layers())
    aux = torch.randn(1, 70, 3 * 64).to(BF16)
    assert drafter.cpu_step(drafter, torch.tensor([pos]), aux, ctx, True) is None


def test_a_float32_drafters_outputs_are_its_own():
    """The step's scratch arrays never leave it: a float32 drafter's next hidden (norm_output: the final norm's
    output, computed in scratch) survives the next forward of as many tokens."""
    drafter = _wired(torch.float32)
    drafter.norm_output = True
    kv = KVCache(1, drafter.kv_cache_shapes(), 1, 4, drafter.kv_dtype, CPU)
    mask = torch.zeros(1, 4, dtype=torch.bool)
    mask[0, 0] = True
    aux = torch.randn(1, 1, 3 * 64, generator=torch.Generator().manual_seed(0))
    logits, hidden = _run(drafter, kv, [5], aux, [0], [0], mask, True)
    kept = hidden.clone()
    mask[0, 1] = True
    _run(drafter, kv, [int(logits[0, -1].argmax())], hidden, [1], [1], mask, False)
    assert hidden.dtype == torch.float32 and torch.equal(hidden, kept)
