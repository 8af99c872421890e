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


@pytest.mark.parametrize("heads", [(6, 2), (9, 3), (4, 1)])  # padded tiles: 8 / 16 / 8 heads, 2 / 4 / 1 v heads
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 0.0), (torch.bfloat16, 2 ** -7)])
def test_kernel_matches_reference(dtype, rtol, heads):
    g = torch.Generator().manual_seed(0)
    (H, Hkv), (B, T, D, S, Bc) = heads, (2, 3, 32, 12, 3)
    qkv = torch.randn(B, T, H + 2 * Hkv, D, generator=g).to(dtype)
    cos, sin = torch.randn(B, T, D // 2, generator=g), torch.randn(B, T, D // 2, generator=g)
    caches = [torch.full((Bc, S, Hkv, D), 7.0, dtype=dtype) for _ in range(4)]  # poisoned: unwritten stays 7
    rows, widx = torch.tensor([2, 0]), torch.tensor([[1, 2, 3], [9, 10, 11]])
    q1 = rope_store(qkv, cos, sin, caches[0], caches[1], rows, widx, H, Hkv)
    q2 = rope_store_reference(qkv, cos, sin, caches[2], caches[3], rows, widx, H, Hkv)
    # float32: equal; bf16: at most one rounding step apart (a relative 2^-7), both rounded once from float32
    torch.testing.assert_close(q1.float(), q2.float(), rtol=rtol, atol=0.0)
    torch.testing.assert_close(caches[0].float(), caches[2].float(), rtol=rtol, atol=0.0)
    assert torch.equal(caches[1], caches[3])  # v is copied, not computed
    assert int((caches[0] == 7.0).all(-1).all(-1).sum()) == Bc * S - B * T  # exactly B*T entries written


def test_engine_with_the_kernel_equals_plain():
    """Fused projections + the kernel through the whole engine (float32): greedy speculation still equals plain."""

    def prepare(target, drafter):
        for m in (target, drafter):
            use_rope_store_kernel(fuse_projections(m))
        assert target.model.layers[0].self_attn.rope_store is rope_store

    assert_transformed_engine_equals_plain(prepare, SpecConfig(3, 2, 5), [[1, 2, 3, 4], list(range(10, 18))], 12)
