"""o_proj's residual add as a Triton kernel (layers/add_linear_kernel.py), run by Triton's interpreter on the CPU:
h += x @ W^T in place equals `h.addmm_(x, W.t())`, padding rows are never written, and the shapes it refuses."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402

from eaglespec.layers.add_linear_kernel import BLOCK_K, BLOCK_N, MAX_ROWS, add_linear_, fits  # noqa: E402


@pytest.mark.parametrize("M", [1, 17, 64, 100])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2 ** -7)])
def test_add_linear_equals_addmm(M, dtype, tol):
    """Rows of a wider buffer (h and x with row strides of their own), one dtype, against addmm_ on copies; the rows
    after M hold NaN and stay as they were (the last block's padding rows read row M - 1 and are not stored)."""
    g = torch.Generator().manual_seed(M)
    N, K = 2 * BLOCK_N, 2 * BLOCK_K
    buf = torch.full((M + 7, N + 16), float("nan"), dtype=dtype)
    h = buf[:M, :N]
    h.copy_(torch.randn(M, N, generator=g) * 2)
    x = (torch.randn(M, K + 8, generator=g)).to(dtype)[:, :K]
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    want = h.float().addmm_(x.float(), w.float().t())
    out = add_linear_(h, x, w)
    assert out is h and h.dtype == dtype
    assert (h.float() - want).abs().max().item() <= tol * want.abs().max().item()
    assert torch.isnan(buf[M:]).all() and torch.isnan(buf[:, N:]).all()  # nothing outside h is written


def test_shapes_it_refuses():
    assert fits(MAX_ROWS, BLOCK_N, BLOCK_K) and fits(1, 9 * BLOCK_N, 9 * BLOCK_K)
    assert not fits(MAX_ROWS + 1, BLOCK_N, BLOCK_K)  # long prefills keep cuBLAS
    assert not fits(0, BLOCK_N, BLOCK_K)
    assert not fits(8, BLOCK_N + 1, BLOCK_K) and not fits(8, BLOCK_N, BLOCK_K + 16)
    with pytest.raises(AssertionError, match="add_linear_: shape"):
        add_linear_(torch.zeros(4, BLOCK_N), torch.zeros(4, BLOCK_K + 1), torch.zeros(BLOCK_N, BLOCK_K + 1))
