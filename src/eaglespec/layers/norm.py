"""RMSNorm computed in float32 (as transformers and DeepSeek do), returned in the input dtype.

`rms_norm` is the function, `rms_scale` its per-row scale alone (`rms_scaled` applies it to a projection), and
`add_rms_norm` the residual add fused with the next norm (h + d, norm(h + d)); the module's `impl` / `add_impl` may
be swapped for compiled versions (one kernel each) by engine.transforms. `OffsetRMSNorm` is Gemma's: weights stored as
offsets from 1, the product taken in float32 before the one rounding (not an `RMSNorm`, so that no kernel written for
Llama's roundings replaces it); `BiasFreeLayerNorm` is Cohere's LayerNorm (mean removed, a weight and no bias, in
float32, rounded once); `UnitRMSNorm` an RMSNorm whose weight is fixed ones (Llama 4's q / k norm)."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., K] -> the float32 per-row scale [..., 1] that RMSNorm multiplies x by (1 / sqrt(mean(x^2) + eps)): what
    is left of a norm whose weight was folded into the projection after it (engine.transforms.fold_norms)."""
    return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)


def rms_scaled(y: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """y [*lead, ...] (a projection of x [*lead, K] through weights with the norm's weight folded in) times x's
    `rms_scale`, in float32: the rest of the norm, applied after the projection."""
    r = rms_scale(x, eps)  # [*lead, 1]
    return y.float() * r.reshape(r.shape + (1,) * (y.dim() - r.dim()))


def add_rms_norm(h: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    h = h + d
    return h, rms_norm(h, weight, eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.impl = rms_norm
        self.add_impl = add_rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x, self.weight, self.eps)

    def add_forward(self, h: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + d, norm(h + d))."""
        return self.add_impl(h, d, self.weight, self.eps)


class UnitRMSNorm(RMSNorm):
    """An RMSNorm without a learned weight (Llama 4's q / k norm): `weight` is a non-persistent buffer of ones, so
    code and kernels that apply an RMSNorm's weight take it unchanged, and no checkpoint holds it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)
        del self.weight
        self.register_buffer("weight", torch.ones(dim), persistent=False)

    def reset_buffers(self) -> None:
        """Ones again after materialising from the meta device."""
        with torch.no_grad():
            self.weight.fill_(1.0)


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + weight), in float32, rounded once to x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm (`weight` as the checkpoint holds it: the offset from 1, zeros at init)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(x, self.weight, self.eps)


class BiasFreeLayerNorm(nn.Module):
    """Cohere's LayerNorm: (x - mean(x)) / sqrt(var(x) + eps) * weight, in float32, rounded once to x's dtype."""

    def __init__(self, dim: int | tuple[int, ...], eps: float = 1e-5) -> None:
        """`dim` a tuple: a weight per leading index too (Command R+'s q / k norms, [heads, head_dim]), the statistics
        still over the last dim."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        c = x32 - x32.mean(-1, keepdim=True)
        return (c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)
