"""The EAGLE-3 drafter's input in one Triton kernel: embedding lookup, both input norms, their concatenation, RoPE's
cos/sin.

Every drafter forward starts with x = cat(input_layernorm(embed[t]), hidden_norm(h)) and the cos/sin tables of its
positions. In PyTorch that is an index-select, two RMSNorm kernels, a concatenation and a cos/sin kernel (compiled:
five launches), none of which takes part in programmatic dependent launch (layers/pdl.py), so each pays its whole
launch latency inside the graph: on the H200 the index-select alone advanced an 8-row chain's step by ~6 us per
drafter forward (docs/benchmarks.md, "Session 14"). Here program r handles row r of the [B, T] step.

`draft_input(ids, embed, h, w_e, eps_e, w_h, eps_h, positions, inv_freq, attn_factor) -> (x, cos, sin)`:
  ids [B, T] target token ids, embed [V, H] (the target's embedding), h [B, T, H] the incoming hidden (fc's output
  or the drafter's own previous output; any strides with a contiguous last dimension, broadcast dims included),
  w_e / w_h [H] the two norms' weights, positions [B, T] integers, inv_freq [H_rot/2] float32 ->
  x [B, T, 2H] in h's dtype, cos / sin [B, T, H_rot/2] float32.
  Rounded as `layers/norm.rms_norm` rounds (the normalised row to the input dtype, then its product with the weight)
  and as `layers/rotary.rotary_cos_sin` computes (float32 position times inverse frequency, cos / sin, times the
  attention factor), so results differ from `draft_input_reference` only by the order of the float32 sums and the
  last bits of cos / sin.
`fits(H, half_rot)`: widths one program holds in one block.
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .norm import rms_norm
from .pdl import launch_options
from .rotary import rotary_cos_sin

MAX_WIDTH = 8192  # hidden sizes up to this are read as one block per row


def fits(H: int, half_rot: int) -> bool:
    return 1 <= H <= MAX_WIDTH and 1 <= half_rot <= MAX_WIDTH


def draft_input_reference(ids: torch.Tensor, embed: torch.Tensor, h: torch.Tensor, w_e: torch.Tensor, eps_e: float,
                          w_h: torch.Tensor, eps_h: float, positions: torch.Tensor, inv_freq: torch.Tensor,
                          attn_factor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.cat((rms_norm(embed[ids], w_e, eps_e), rms_norm(h, w_h, eps_h)), dim=-1)
    cos, sin = rotary_cos_sin(positions, inv_freq, attn_factor)
    return x, cos, sin


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def draft_input_kernel(ids, s_ib, s_it, emb, h, s_hb, s_ht, we, wh, pos, s_pb, s_pt, inv, x, cos, sin,
                           T, eps_e, eps_h, attn_factor, H: tl.constexpr, HALF: tl.constexpr,
                           BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: the norm weights and frequencies are never written by a step; read them early
            tl.extra.cuda.gdc_launch_dependents()
        r = tl.program_id(0)
        b = r // T
        t = r - b * T
        dt = x.dtype.element_ty
        rk = tl.arange(0, BLOCK_H)
        km = rk < H
        wev = tl.load(we + rk, mask=km, other=0.0).to(tl.float32)
        whv = tl.load(wh + rk, mask=km, other=0.0).to(tl.float32)
        rf = tl.arange(0, BLOCK_R)
        fm = rf < HALF
        invf = tl.load(inv + rf, mask=fm, other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
        tok = tl.load(ids + b * s_ib + t * s_it).to(tl.int64)
        e = tl.load(emb + tok * H + rk, mask=km, other=0.0).to(tl.float32)
        e = (e / tl.sqrt(tl.sum(e * e, axis=0) / H + eps_e)).to(dt).to(tl.float32)
        tl.store(x + r * (2 * H) + rk, (e * wev).to(dt), mask=km)
        hv = tl.load(h + b * s_hb + t * s_ht + rk, mask=km, other=0.0).to(tl.float32)
        hv = (hv / tl.sqrt(tl.sum(hv * hv, axis=0) / H + eps_h)).to(dt).to(tl.float32)
        tl.store(x + r * (2 * H) + H + rk, (hv * whv).to(dt), mask=km)
        p = tl.load(pos + b * s_pb + t * s_pt).to(tl.float32)
        f = p * invf
        tl.store(cos + r * HALF + rf, tl.cos(f) * attn_factor, mask=fm)
        tl.store(sin + r * HALF + rf, tl.sin(f) * attn_factor, mask=fm)

    return draft_input_kernel


def _strides(t: torch.Tensor) -> tuple[int, int]:
    return t.stride(0), t.stride(1)


def draft_input(ids: torch.Tensor, embed: torch.Tensor, h: torch.Tensor, w_e: torch.Tensor, eps_e: float,
                w_h: torch.Tensor, eps_h: float, positions: torch.Tensor, inv_freq: torch.Tensor,
                attn_factor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T = ids.shape
    H = embed.shape[1]
    half = inv_freq.shape[0]
    assert fits(H, half) and h.shape == (B, T, H) and h.stride(-1) == 1 and positions.shape == (B, T)
    assert embed.is_contiguous() and w_e.is_contiguous() and w_h.is_contiguous() and inv_freq.dtype == torch.float32
    dev = h.device
    x = torch.empty(B, T, 2 * H, dtype=h.dtype, device=dev)
    cos = torch.empty(B, T, half, dtype=torch.float32, device=dev)
    sin = torch.empty(B, T, half, dtype=torch.float32, device=dev)
    _kernel()[(B * T,)](ids, *_strides(ids), embed, h, *_strides(h), w_e, w_h, positions, *_strides(positions),
                        inv_freq, x, cos, sin, T, eps_e, eps_h, attn_factor, H=H, HALF=half, BLOCK_H=pow2(H),
                        BLOCK_R=pow2(half), num_warps=4, **launch_options(h))
    return x, cos, sin
