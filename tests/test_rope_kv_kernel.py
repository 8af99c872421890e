"""The fused RoPE + KV-store Triton kernel, run by Triton's interpreter on the CPU, against the PyTorch path."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import assert_transformed_engine_equals_plain  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.transforms import fuse_projections, use_rope_store_kernel  # noqa: E402
from eaglespec.layers.rope_kv_kernel import rope_store, rope_store_reference  # noqa: E402


# (head_dim, rotated dims): full RoPE; Phi-3's 96 (halves of 48: padded and masked); GLM-4's half; Phi-4-mini's 3/4
HEAD_SHAPES = [(32, 32), (48, 48), (32, 16), (48, 36)]


@pytest.mark.parametrize("heads", [(6, 2), (9, 3), (4, 1)])  # padded tiles: 8 / 16 / 8 heads, 2 / 4 / 1 v heads
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 0.0), (torch.bfloat16, 2 ** -7)])
@pytest.mark.parametrize("D,R", HEAD_SHAPES)
def test_kernel_matches_reference(dtype, rtol, heads, D, R):
    g = torch.Generator().manual_seed(0)
    (H, Hkv), (B, T, S, Bc) = heads, (2, 3, 12, 3)
    qkv = torch.randn(B, T, H + 2 * Hkv, D, generator=g).to(dtype)
    cos, sin = torch.randn(B, T, R // 2, generator=g), torch.randn(B, T, R // 2, generator=g)
    caches = [torch.full((Bc, S, Hkv, D), 7.0, dtype=dtype) for _ in range(4)]  # poisoned: unwritten stays 7
    rows, widx = torch.tensor([2, 0]), torch.tensor([[1, 2, 3], [9, 10, 11]])
    q1 = rope_store(qkv, cos, sin, caches[0], caches[1], rows, widx, H, Hkv)
    q2 = rope_store_reference(qkv, cos, sin, caches[2], caches[3], rows, widx, H, Hkv)
    # float32: equal; bf16: at most one rounding step apart (a relative 2^-7), both rounded once from float32
    torch.testing.assert_close(q1.float(), q2.float(), rtol=rtol, atol=0.0)
    torch.testing.assert_close(caches[0].float(), caches[2].float(), rtol=rtol, atol=0.0)
    assert torch.equal(caches[1], caches[3])  # v is copied, not computed
    assert int((caches[0] == 7.0).all(-1).all(-1).sum()) == Bc * S - B * T  # exactly B*T entries written
    k_new = caches[0][rows[:, None], widx]  # [B, T, Hkv, D]
    assert torch.equal(k_new[..., R:], qkv[:, :, H : H + Hkv, R:])  # the unrotated tail, copied
    assert torch.equal(q1[..., R:], qkv[:, :, :H, R:])


def test_engine_with_the_kernel_equals_plain():
    """Fused projections + the kernel through the whole engine (float32): greedy speculation still equals plain."""

    def prepare(target, drafter):
        for m in (target, drafter):
            use_rope_store_kernel(fuse_projections(m))
        assert target.model.layers[0].self_attn.rope_store is rope_store

    assert_transformed_engine_equals_plain(prepare, SpecConfig(3, 2, 5), [[1, 2, 3, 4], list(range(10, 18))], 12)


@pytest.mark.parametrize("folded", [False, True])
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-6), (torch.bfloat16, 2 ** -6)])
@pytest.mark.parametrize("D,R", [(32, 32), (48, 24)])
def test_kernel_applies_per_head_norms(dtype, rtol, folded, D, R):
    """Qwen3's q / k head norms before RoPE (`head_norms`), with and without the folded input norm's scale: the
    reference's values (float32: up to the last bits of 1/sqrt; bf16: a rounding step or two, as the module rounds the
    normalised heads, then their product with the weight)."""
    g = torch.Generator().manual_seed(1)
    H, Hkv, B, T, S, Bc = 6, 2, 2, 3, 12, 3
    qkv = (3 * torch.randn(B, T, H + 2 * Hkv, D, generator=g)).to(dtype)
    cos, sin = torch.randn(B, T, R // 2, generator=g), torch.randn(B, T, R // 2, generator=g)
    norms = ((1 + 0.3 * torch.randn(D, generator=g)).to(dtype), (1 + 0.3 * torch.randn(D, generator=g)).to(dtype), 1e-6)
    norm_of = (torch.randn(B, T, 40, generator=g).to(dtype), 1e-5) if folded else None
    caches = [torch.full((Bc, S, Hkv, D), 7.0, dtype=dtype) for _ in range(4)]
    rows, widx = torch.tensor([2, 0]), torch.tensor([[1, 2, 3], [9, 10, 11]])
    q1 = rope_store(qkv, cos, sin, caches[0], caches[1], rows, widx, H, Hkv, norm_of=norm_of, head_norms=norms)
    q2 = rope_store_reference(qkv, cos, sin, caches[2], caches[3], rows, widx, H, Hkv, norm_of=norm_of,
                              head_norms=norms)
    atol = rtol * float(q2.abs().max())
    torch.testing.assert_close(q1.float(), q2.float(), rtol=rtol, atol=atol)
    torch.testing.assert_close(caches[0].float(), caches[2].float(), rtol=rtol, atol=atol)
    unnormed = rope_store_reference(qkv, cos, sin, caches[2].clone(), caches[3].clone(), rows, widx, H, Hkv,
                                    norm_of=norm_of)
    assert (q1.float() - unnormed.float()).abs().max() > 0.1  # the norms changed q


def test_qwen3_attention_takes_the_kernel_with_its_head_norms():
    """A tiny Qwen3 target (QKNormAttention) with fused projections, the RoPE + KV-store kernel and the short-query
    attention kernel (float32): plain and speculative greedy tokens equal the untransformed target's."""
    from tiny import assert_speculation_equals_plain, randomize_moe, tiny_drafter

    from eaglespec.config import EngineConfig, ModelConfig
    from eaglespec.engine.engine import Engine
    from eaglespec.engine.transforms import use_short_attention_kernel
    from eaglespec.models import get_model_class
    from eaglespec.sampling_params import SamplingParams

    cfg = ModelConfig.from_hf(dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=97,
                                   hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                                   rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False))
    target = get_model_class(cfg.architecture)(cfg).eval()
    randomize_moe(target, 0)  # O(1) logits, norms' weights away from 1
    prompts, params = [[1, 2, 3, 4], list(range(10, 30))], SamplingParams(max_new_tokens=12, ignore_eos=True)
    ref = [o.token_ids for o in Engine(target, None, EngineConfig(max_batch_size=2)).generate(prompts, params)]
    drafter = tiny_drafter(target, seed=1, hidden=64)
    use_short_attention_kernel(use_rope_store_kernel(fuse_projections(target)))
    attn = target.model.layers[0].self_attn
    assert attn.rope_store is rope_store and attn.attn_kernel is not None and attn.head_norms() is not None
    assert assert_speculation_equals_plain(target, drafter, prompts, params, [SpecConfig(3, 2, 5)]) == ref
