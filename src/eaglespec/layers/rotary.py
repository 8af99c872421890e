"""Rotary position embeddings: inverse frequencies for default / linear / llama3 / yarn / longrope (its short factors),
and their application.

`Rotary(dim, cfg)` turns positions [B, T] into (cos, sin) [B, T, dim/2] (yarn's attention factor folded in), computed
from the positions on the fly: no table bounded by the context length; `dim` is the rotated dims of a head
(`ModelConfig.rotary_dim`). `apply_rotary` rotates halves (the HF / Llama layout); `interleaved=True` rotates adjacent
pairs (DeepSeek's reference layout); either over the first 2 x cos.shape[-1] dims of a head (partial RoPE). The
frequency formulas follow transformers' `rope_utils` so logits agree with it. `pairs_to_halves` reorders a checkpoint's
q / k rows from the pair layout to the halves one (GLM-4, Cohere, ERNIE 4.5 load through it: q and k permuted alike
leave every score, so the model, unchanged, and the engine's RoPE kernels rotate halves).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import RopeConfig
from ..errors import ConfigError


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inv_freq_and_scale(dim: int, cfg: RopeConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [dim/2] (float32) and the factor applied to cos/sin."""
    base = cfg.theta
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if cfg.type == "longrope":  # the short factors (ModelConfig.context_limit keeps sequences within their range)
        if len(cfg.short_factor) != dim // 2:
            raise ConfigError(f"LongRoPE's short_factor has {len(cfg.short_factor)} entries where RoPE over {dim} dims "
                              f"needs {dim // 2}")
        scale = cfg.attention_factor
        if scale is None:
            orig = cfg.original_max_position_embeddings
            scale = 1.0 if cfg.factor <= 1 else math.sqrt(1 + math.log(cfg.factor) / math.log(orig))
        return 1.0 / (torch.tensor(cfg.short_factor) * base ** (torch.arange(0, dim, 2).float() / dim)), scale
    if cfg.type in ("default",) or cfg.factor == 1.0 and cfg.type != "yarn":
        return inv, 1.0
    if cfg.type == "linear":
        return inv / cfg.factor, 1.0
    if cfg.type == "llama3":
        old = cfg.original_max_position_embeddings
        low_wl = old / cfg.low_freq_factor
        high_wl = old / cfg.high_freq_factor
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > low_wl, inv / cfg.factor, inv)
        smooth = (old / wl - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor)
        smoothed = (1 - smooth) * scaled / cfg.factor + smooth * scaled
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        return torch.where(medium, smoothed, scaled), 1.0
    if cfg.type == "yarn":
        factor = cfg.factor
        if cfg.attention_factor is not None:
            attn_factor = cfg.attention_factor
        elif cfg.mscale and cfg.mscale_all_dim:
            attn_factor = _yarn_mscale(factor, cfg.mscale) / _yarn_mscale(factor, cfg.mscale_all_dim)
        else:
            attn_factor = _yarn_mscale(factor)
        orig = cfg.original_max_position_embeddings

        def corr_dim(rot: float) -> float:
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(cfg.beta_fast), corr_dim(cfg.beta_slow)
        if cfg.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrap = 1 - ramp  # 1 where frequencies are kept as they are
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
        return inv, attn_factor
    raise ValueError(f"unknown rope type {cfg.type}")


def yarn_softmax_mscale(cfg: RopeConfig) -> float:
    """DeepSeek's extra softmax factor mscale^2 (1 when yarn is off); applied at every length."""
    if cfg.type != "yarn" or not cfg.mscale_all_dim:
        return 1.0
    m = _yarn_mscale(cfg.factor, cfg.mscale_all_dim)
    return m * m


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                   attn_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] (integers) -> (cos, sin) [..., dim/2] in float32, both times `attn_factor`."""
    freqs = positions.float()[..., None] * inv_freq
    return freqs.cos() * attn_factor, freqs.sin() * attn_factor


class Rotary(nn.Module):
    def __init__(self, dim: int, cfg: RopeConfig) -> None:
        super().__init__()
        self.dim = dim
        self.cfg = cfg
        with torch.device("cpu"):  # arithmetic on the meta device (where models are built) imports torch._dynamo
            inv, self.attn_factor = inv_freq_and_scale(dim, cfg)
        self.register_buffer("inv_freq", inv.to(torch.get_default_device()), persistent=False)
        # engine.transforms may swap in a compiled version: one kernel per forward instead of five (cast and
        # product, cos, scale, sin, scale: ~6.5 us of every drafter forward on the H200)
        self.impl = rotary_cos_sin

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        # `.to(bfloat16)` would round the frequencies (positions * inv_freq loses the angle at long positions):
        # moves follow fn, the dtype stays float32.
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = self.inv_freq.float()
        return self

    def reset_buffers(self) -> None:
        """Recompute the frequencies after the module was materialized from the meta device."""
        inv, _ = inv_freq_and_scale(self.dim, self.cfg)
        self.inv_freq = inv.to(self.inv_freq.device)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.impl(positions, self.inv_freq, self.attn_factor)  # [B, T, dim/2] each


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, R/2] with R <= D the rotated dims (R < D: partial RoPE, the first R dims
    rotated, the last D - R passed through as transformers' GLM / Phi / StableLM do). Computed in float32, returned in
    x's dtype."""
    dtype = x.dtype
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    rot = 2 * cos.shape[-1]
    xf = x[..., :rot].float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        half = rot // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    if rot < x.shape[-1]:
        return torch.cat((out.to(dtype), x[..., rot:]), dim=-1)
    return out.to(dtype)


def pairs_to_halves(w: torch.Tensor, heads: int, rotated: int) -> torch.Tensor:
    """w [heads * head_dim, ...] (q_proj / k_proj rows, or their bias) with each head's first `rotated` rows in
    adjacent-pair order -> the same rows in halves order (evens first, then odds); the other rows unchanged."""
    rows = w.shape[0]
    x = w.reshape(heads, rows // heads, *w.shape[1:])
    rot = x[:, :rotated]
    return torch.cat((rot[:, 0::2], rot[:, 1::2], x[:, rotated:]), 1).reshape(w.shape)


def qk_rows_to_halves(name: str, tensor: torch.Tensor, n_heads: int, n_kv_heads: int,
                      rotated: int) -> torch.Tensor:
    """A checkpoint tensor by its name: q_proj's / k_proj's weight or bias through `pairs_to_halves` (their heads'
    first `rotated` rows), and a per-head q / k norm's weight [heads or 1, head_dim] (Command R+'s) along its head
    dims alike; anything else as it is. The `transform_checkpoint` of the models whose RoPE rotates pairs (GLM-4,
    Cohere, ERNIE 4.5, Llama 4)."""
    if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
        return pairs_to_halves(tensor, n_heads, rotated)
    if name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
        return pairs_to_halves(tensor, n_kv_heads, rotated)
    if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        rows = tensor.reshape(-1, tensor.shape[-1])  # [heads, head_dim]
        return pairs_to_halves(rows.reshape(-1), rows.shape[0], rotated).reshape(tensor.shape)
    return tensor
