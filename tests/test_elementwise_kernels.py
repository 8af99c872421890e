"""The per-row Triton kernels that replace `torch.compile` on CUDA (RMSNorm, add + RMSNorm, RoPE's cos/sin, SiLU
gating), run by Triton's interpreter on the CPU: against the PyTorch functions in float32 and bf16, for any leading
shape and empty steps; and a tiny target and drafter wired through them (`use_elementwise_kernels`, with the
Triton attention and norm + projection kernels off so that these carry the norms) still give plain greedy tokens,
plainly and speculating."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain  # noqa: E402

from eaglespec.config import RopeConfig, SpecConfig  # noqa: E402
from eaglespec.engine.transforms import fuse_projections, use_elementwise_kernels  # noqa: E402
from eaglespec.layers.elementwise_kernels import (add_rms_norm_rows, rms_norm_rows, rope_rows,  # noqa: E402
                                                  rotary_cos_sin_rows, silu_mul_rows)
from eaglespec.layers.mlp import GatedMLP, silu_mul  # noqa: E402
from eaglespec.layers.norm import RMSNorm, add_rms_norm, rms_norm  # noqa: E402
from eaglespec.layers.rotary import Rotary, apply_rotary, inv_freq_and_scale, rotary_cos_sin  # noqa: E402

# bf16: the same roundings, float32 sums in another order: a rounding flips by an ulp now and then (two roundings in
# a row: at most two ulps, 2^-6 relative)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 5, 576), (7, 100), (0, 64)])
@pytest.mark.parametrize("weight_dtype", ["same", "float32"])
def test_norms_match_the_pytorch_functions(dtype, shape, weight_dtype):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(*shape, generator=g) * 3).to(dtype)
    d = torch.randn(*shape, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype if weight_dtype == "same" else torch.float32)
    y = rms_norm_rows(h, w, 1e-5)
    ref = rms_norm(h, w, 1e-5)
    assert y.dtype == ref.dtype and y.shape == ref.shape  # float32 weights promote, as the module path does
    torch.testing.assert_close(y, ref, atol=TOL[dtype], rtol=TOL[dtype])
    h2, y2 = add_rms_norm_rows(h, d, w, 1e-6)
    rh, ry = add_rms_norm(h, d, w, 1e-6)
    # one rounding of the same sum (exact in float32; Triton's interpreter rounds float32 -> bf16 its own way)
    torch.testing.assert_close(h2, rh, atol=TOL[dtype] if dtype != torch.float32 else 0, rtol=TOL[dtype])
    torch.testing.assert_close(y2, ry, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("rope", [RopeConfig(), RopeConfig(type="yarn", factor=4.0, original_max_position_embeddings=512)],
                         ids=["default", "yarn"])
@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (0, 3)])
def test_cos_sin_match_the_pytorch_function(rope, shape):
    inv, factor = inv_freq_and_scale(64, rope)
    positions = torch.randint(0, 4000, shape, generator=torch.Generator().manual_seed(1))
    got, want = rotary_cos_sin_rows(positions, inv, factor), rotary_cos_sin(positions, inv, factor)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape == (*shape, 32)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # angles of up to 4000 rad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 2 * 96), (4, 3, 2 * 1536), (0, 2 * 8)])
def test_silu_mul_matches_the_pytorch_function(dtype, shape):
    gu = (torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    got, want = silu_mul_rows(gu), silu_mul(gu)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 64, 64), (2, 3, 4, 16), (3, 2, 1, 64), (1, 5, 3, 6), (0, 2, 4, 8)])
def test_rope_matches_the_pytorch_function(dtype, interleaved, shape):
    """MLA's RoPE: a slice of a wider tensor (q_pe of q, k_pe of the latent projection's output), pairs or halves."""
    B, T, H, D = shape
    g = torch.Generator().manual_seed(D)
    x = torch.randn(B, T, H, D + 24, generator=g).to(dtype)[..., 24:]
    angle = torch.randn(B, T, D // 2, generator=g) * 3
    got, want = rope_rows(x, angle.cos(), angle.sin(), interleaved), apply_rotary(x, angle.cos(), angle.sin(),
                                                                                  interleaved)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])


def test_mla_targets_take_the_rope_kernel_and_keep_their_tokens():
    """`use_elementwise_kernels` gives MLA attention the RoPE kernel; a DeepSeek-V3 target so wired decodes and
    speculates as the untransformed one."""
    from tiny import tiny_drafter, tiny_moe

    from eaglespec.config import EngineConfig
    from eaglespec.engine.engine import Engine
    from eaglespec.layers.mla import MLAttention
    from eaglespec.sampling_params import SamplingParams

    target = tiny_moe("deepseek_v3", num_hidden_layers=2, qk_rope_head_dim=16)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 5], list(range(10, 30))]
    ref = [o.token_ids for o in Engine(target, None).generate(prompts, params)]
    drafter = tiny_drafter(target, seed=1, hidden=target.config.hidden_size)
    use_elementwise_kernels(target)
    assert all(a.rope is rope_rows for a in target.modules() if isinstance(a, MLAttention))
    eng = Engine(target, None, EngineConfig(max_batch_size=2), drafter=drafter, spec=SpecConfig(3, 2, 6))
    assert [o.token_ids for o in eng.generate(prompts, params)] == ref


def _wire(target, drafter):
    for m in (target, drafter):
        fuse_projections(m)
        use_elementwise_kernels(m)
    assert all(r.impl is rotary_cos_sin_rows for r in target.modules() if isinstance(r, Rotary))
    assert all(n.impl is rms_norm_rows and n.add_impl is add_rms_norm_rows
               for n in target.modules() if isinstance(n, RMSNorm))
    assert all(m.gated_act is silu_mul_rows for m in drafter.modules() if isinstance(m, GatedMLP))


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)], ids=["chain", "tree"])
def test_engine_with_the_kernels_equals_plain(spec):
    assert_transformed_engine_equals_plain(_wire, spec, [[1, 2, 3, 4, 5], list(range(10, 30))], 12)
