"""Which inference transforms an EngineConfig applies where (engine/transforms.py): the defaults (None) mean CUDA
only, so CPU runs keep the plain, uncompiled layers unless asked."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_llama

from eaglespec.config import EngineConfig
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.layers.norm import RMSNorm, rms_norm


def _norm_impls(model):
    return {m.impl for m in model.modules() if isinstance(m, RMSNorm)}


def test_cpu_defaults_fuse_and_go_weight_major_without_compiling():
    """On the CPU the defaults fuse q/k/v and gate/up and make every projection weight-major (session 19: 15% faster
    plain decoding once weight-major); compiling stays CUDA-only; --no-fuse keeps the checkpoint's projections."""
    from eaglespec.layers.cpu_linear import CpuLinear

    cfg = EngineConfig()
    assert cfg.fuse_projections is None and cfg.compile is None
    m = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), cfg.fuse_projections, cfg.compile)
    attn = m.model.layers[0].self_attn
    assert hasattr(attn, "qkv_proj") and not hasattr(attn, "q_proj")  # fused
    assert type(attn.qkv_proj) is CpuLinear and type(m.model.layers[0].mlp.gate_up_proj) is CpuLinear
    assert _norm_impls(m) == {rms_norm}  # not compiled
    unfused = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), False, cfg.compile)
    attn = unfused.model.layers[0].self_attn
    assert hasattr(attn, "q_proj") and not hasattr(attn, "qkv_proj") and type(attn.q_proj) is CpuLinear


def test_explicit_fuse_on_the_cpu_keeps_the_outputs():
    from eaglespec.layers.context import ForwardContext

    ids = torch.tensor([[1, 2, 3, 4, 5]])
    plain = tiny_llama(seed=0)
    ref = plain(ids, ForwardContext.plain(1, 5, ids.device)).logits
    fused = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), True, False)
    assert hasattr(fused.model.layers[0].self_attn, "qkv_proj")
    assert torch.allclose(fused(ids, ForwardContext.plain(1, 5, ids.device)).logits, ref, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_linear_concatenates_without_initialising(monkeypatch, bias):
    """`fused_linear` gives the parts' outputs side by side, in their dtype, without gradients, and runs nn.Linear's
    init on no real memory (the fused weight's took 0.22 s of a SmolLM2 CPU start-up, overwritten at once)."""
    from torch import nn

    from eaglespec.layers.fused_linear import fused_linear

    g = torch.Generator().manual_seed(0)
    parts = [nn.Linear(24, n, bias=bias, dtype=torch.float64) for n in (16, 8, 8)]
    with torch.no_grad():
        for p in parts:
            for t in p.parameters():
                t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))

    real = {name: getattr(nn.init, name) for name in ("kaiming_uniform_", "uniform_")}

    def meta_only(name):
        def init(t, *args, **kwargs):
            assert t.is_meta, "nn.Linear's init ran on real memory"
            return real[name](t, *args, **kwargs)
        return init

    for name in real:
        monkeypatch.setattr(nn.init, name, meta_only(name))
    fused = fused_linear(*parts)
    x = torch.randn(3, 24, generator=g, dtype=torch.float64)
    assert fused.weight.dtype == torch.float64 and (fused.bias is not None) == bias
    assert not fused.weight.requires_grad and not fused.weight.is_meta
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1))


def test_cuda_defaults_wire_the_triton_kernels(monkeypatch):
    """Which Triton kernels the CUDA defaults put where (plain attribute wiring, checked without a GPU): a Llama
    gets all three, a layer wider than the norm + projection kernel's one-shot width keeps cuBLAS for it, and the
    EAGLE-3 drafter gets the attention kernels (its layer is not a pre-norm decoder layer)."""
    from tiny import tiny_drafter

    import eaglespec.layers.norm_linear_kernel as nlk
    from eaglespec.layers.few_rows_linear import FewRowsLinear
    from eaglespec.layers.norm_linear_kernel import add_norm_linear
    from eaglespec.layers.rope_kv_kernel import rope_store
    from eaglespec.layers.short_attention_kernel import short_attention

    cuda = torch.device("cuda")
    target = tiny_llama(seed=0)
    drafter = tiny_drafter(target, seed=1)
    prepare_for_inference(target, cuda, None, False)
    prepare_for_inference(drafter, cuda, None, False)
    for layer in target.model.layers:
        assert layer.self_attn.rope_store is rope_store and layer.self_attn.attn_kernel.run is short_attention
        # float32 (the tiny models): up to the row grid's 8 rows, longer steps through cuBLAS (FLOAT32_DOT off)
        assert layer.norm_linear is add_norm_linear and layer.norm_linear_rows == nlk.ROW_GRID_ROWS == 8
        assert isinstance(layer.self_attn.o_proj, FewRowsLinear) and layer.self_attn.o_proj.max_rows == 8
        assert isinstance(layer.mlp.down_proj, FewRowsLinear)
    bf16 = prepare_for_inference(tiny_llama(seed=0).to(torch.bfloat16), cuda, None, False)
    for layer in bf16.model.layers:  # bf16: every step of up to MAX_ROWS rows
        assert layer.norm_linear_rows == nlk.MAX_ROWS == 64 and layer.self_attn.o_proj.max_rows == 64
    monkeypatch.setattr(nlk, "FLOAT32_DOT", True)
    assert prepare_for_inference(tiny_llama(seed=0), cuda, None, False).model.layers[0].norm_linear_rows == 64
    monkeypatch.setattr(nlk, "FLOAT32_DOT", False)
    assert isinstance(drafter.fc, FewRowsLinear) and isinstance(drafter.midlayer.mlp.down_proj, FewRowsLinear)
    attn = [m for m in drafter.modules() if hasattr(m, "attn_kernel")]
    assert attn and all(m.attn_kernel.run is short_attention for m in attn)
    monkeypatch.setattr(nlk, "ONE_SHOT_K", 32)  # the tiny model's width 64 is now "too wide"
    wide = prepare_for_inference(tiny_llama(seed=0), cuda, None, False)
    assert all(layer.norm_linear is None for layer in wide.model.layers)
    assert not any(isinstance(m, FewRowsLinear) for m in wide.modules())
    assert all(layer.self_attn.attn_kernel.run is short_attention for layer in wide.model.layers)
    cpu = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), True, False)
    assert all(layer.norm_linear is None and layer.self_attn.attn_kernel is None for layer in cpu.model.layers)


def test_cuda_defaults_leave_the_compiler_only_rope():
    """On CUDA the norms, RoPE's cos/sin and the SiLU gating run as Triton kernels whatever `compile` says (no
    compiler start-up on their first call); with compile on by default, only RoPE outside the RoPE + KV-store kernel
    (MLA) is left to torch.compile; `--no-fuse` keeps the compiled versions of everything (the plain baseline)."""
    from tiny import tiny_drafter

    from eaglespec.engine.transforms import _compiled
    from eaglespec.layers.attention import GQAAttention
    from eaglespec.layers.elementwise_kernels import rms_norm_rows, rotary_cos_sin_rows, silu_mul_rows
    from eaglespec.layers.mlp import GatedMLP
    from eaglespec.layers.norm import RMSNorm
    from eaglespec.layers.rotary import Rotary

    cuda = torch.device("cuda")
    for compile in (None, True, False):
        target = tiny_llama(seed=0)
        drafter = tiny_drafter(target, seed=1)
        for m in (prepare_for_inference(target, cuda, None, compile), prepare_for_inference(drafter, cuda, None, compile)):
            assert all(n.impl is rms_norm_rows for n in m.modules() if isinstance(n, RMSNorm))
            assert all(r.impl is rotary_cos_sin_rows for r in m.modules() if isinstance(r, Rotary))
            assert all(g.gated_act is silu_mul_rows for g in m.modules() if isinstance(g, GatedMLP))
            assert all((a.rope is _compiled["rope"]) == (compile is not False)
                       for a in m.modules() if isinstance(a, GQAAttention))
    plain = prepare_for_inference(tiny_llama(seed=0), cuda, False, None)
    assert all(n.impl is _compiled["norm"] for n in plain.modules() if isinstance(n, RMSNorm))


def test_compiled_rope_tables_equal_eager():
    """RoPE's cos/sin tables as `compile_elementwise` gives them to every Rotary (one fused kernel on the GPU) equal
    the eager ones: the function traces whole (fullgraph) with the module's arguments."""
    import torch._dynamo

    from eaglespec.engine.transforms import RECOMPILE_LIMIT, _compiled, compile_elementwise
    from eaglespec.layers.rotary import Rotary, rotary_cos_sin

    m = tiny_llama(seed=0)
    rot = [r for r in m.modules() if isinstance(r, Rotary)]
    pos = torch.tensor([[0, 5, 17, 300]])
    ref = [r(pos) for r in rot]
    assert rot and all(r.impl is rotary_cos_sin for r in rot)
    compile_elementwise(m)
    assert all(r.impl is _compiled["cos_sin"] for r in rot)
    for r, (c0, s0) in zip(rot, ref):
        c, s = r(pos)
        assert c.shape == c0.shape == (1, 4, r.dim // 2)
        assert torch.allclose(c, c0, atol=1e-6) and torch.allclose(s, s0, atol=1e-6)
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT  # many engines per process (bench, tune)


@torch.no_grad()
def test_mla_rope_goes_through_the_compiled_function():
    """`compile_elementwise` gives MLA attention the compiled RoPE too (its q_pe and k_pe ran as ~10 PyTorch kernels
    each in a CUDA graph of the Kimi-K2.5 slice, session 56), and the compiled function rotates DeepSeek's
    interleaved pairs as the eager one does; a forward through it gives the eager logits."""
    from tiny import tiny_moe

    from eaglespec.engine.transforms import _compiled, compile_elementwise
    from eaglespec.layers.context import ForwardContext
    from eaglespec.layers.mla import MLAttention
    from eaglespec.layers.rotary import apply_rotary

    m = tiny_moe("deepseek_v3", num_hidden_layers=1, first_k_dense_replace=1)
    attn = [a for a in m.modules() if isinstance(a, MLAttention)]
    ids = torch.tensor([[3, 9, 27, 81, 5]])
    ref = m(ids, ForwardContext.plain(*ids.shape)).logits
    assert attn and all(a.rope is apply_rotary for a in attn)
    for a in attn:  # only RoPE compiled here (the norms' and the rest's compiles are tested elsewhere)
        a.rope = _compiled["rope"]
    got = m(ids, ForwardContext.plain(*ids.shape)).logits
    assert torch.allclose(got, ref, atol=1e-5)
    compile_elementwise(m)
    assert all(a.rope is _compiled["rope"] for a in attn)


def test_preparing_a_model_does_not_import_the_compiler():
    """`compile_elementwise` wires functions that set up `torch.compile` on their first call: preparing a model for
    CUDA (whose Triton kernels leave the compiler nothing to run on a GQA model) imports no torch._dynamo. Checked
    in a fresh interpreter (this one has it)."""
    from tiny import imports_compiler

    assert not imports_compiler(
        "import torch\n"
        "from tiny import tiny_llama\n"
        "from eaglespec.engine.transforms import prepare_for_inference\n"
        "prepare_for_inference(tiny_llama(seed=0), torch.device('cuda'), None, None)\n"
        "prepare_for_inference(tiny_llama(seed=0), torch.device('cpu'), None, True)\n"
    )
