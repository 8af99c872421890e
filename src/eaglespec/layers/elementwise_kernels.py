"""The small per-row operations left between the fused kernels, as one Triton kernel each (CUDA): RMSNorm, residual
add + RMSNorm, RoPE's cos/sin of a step's positions, SiLU gating.

A target's final norm (before its head), RoPE's cos/sin (once per forward) and, past the fused kernels' rows, the
drafter's SiLU gating are each ~5 PyTorch kernels. `torch.compile` made each one kernel, but every process then paid
dynamo and Inductor on its first steps: on the H200 `eaglespec generate` spent 4.7 s warming up with them compiled
against 1.5 s without, and plain decoding at one row ran 5.6% slower without (docs/benchmarks.md, "Session 33").
These kernels are the one launch each without the compiler:

- `rms_norm_rows(x, weight, eps) -> y` and `add_rms_norm_rows(h, d, weight, eps) -> (h + d, y)`: x / h / d
  [..., K], weight [K]; the roundings of `layers/norm.rms_norm` / `add_rms_norm` (the sum rounded to the input dtype,
  the normalised row rounded to it, then times the weight in the promoted dtype); results differ from them only by
  the order of the float32 sums and the last bits of the reciprocal square root (as in the fused norm + projection
  kernels). One program per row, K <= MAX_K.
- `rotary_cos_sin_rows(positions, inv_freq, attn_factor) -> (cos, sin)`: positions [...] integers, inv_freq [R]
  float32 -> [..., R] float32 each, as `layers/rotary.rotary_cos_sin` computes them (float32 position times inverse
  frequency, cos / sin, times the factor; Triton's cos / sin are libdevice's, which equalled PyTorch's bit for bit
  in `draft_input_kernel`, session 15). One program per position.
- `rope_rows(x, cos, sin, interleaved) -> y`: x [B, T, H, D] (any strides, the last dim contiguous: MLA's q_pe and
  k_pe are slices), cos / sin [B, T, D/2] float32 -> y [B, T, H, D] in x's dtype, as `layers/rotary.apply_rotary`
  rotates (adjacent pairs when interleaved, else halves; in float32, rounded once; Triton may contract a product and
  a difference into one FMA, so float32 results may differ in the last bit). One program per token, every head.
  MLA's RoPE (`MLAttention.rope`), which ran as ~10 PyTorch kernels per tensor in a CUDA graph (session 56).
- `silu_mul_rows(gate_up) -> act`: gate_up [..., 2I] (gate, then up) -> silu(gate) * up [..., I] in gate_up's dtype,
  rounded as `layers/mlp.silu_mul` rounds (the SiLU to the dtype, then the product; Triton's exp may differ from
  PyTorch's in the last bits of float32, as in `norm_silu_kernel`). Program (row, column block).
Weights and frequencies are read before the programmatic-launch wait (layers/pdl.py). Built on first use, so that
`TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

MAX_K = 16384  # the widest row one program normalises (DeepSeek-V3's 7,168 -> 8,192 lanes)
SILU_BLOCK = 1024  # gating columns per program


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def norm_kernel(h, d, w, h_out, y, K, eps, HAS_D: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        cols = tl.arange(0, BLOCK)
        m = cols < K
        g = tl.load(w + cols, mask=m, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        dt = h_out.dtype.element_ty
        x = tl.load(h + row * K + cols, mask=m, other=0.0)
        if HAS_D:  # the residual sum, rounded to the stream's dtype
            x = (x.to(tl.float32) + tl.load(d + row * K + cols, mask=m, other=0.0).to(tl.float32)).to(dt)
            tl.store(h_out + row * K + cols, x, mask=m)
        xf = x.to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / K + eps)
        out = g * (xf * r).to(dt).to(tl.float32)
        tl.store(y + row * K + cols, out.to(y.dtype.element_ty), mask=m)

    @triton.jit
    def cos_sin_kernel(pos, inv, cos, sin, R, attn_factor, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        cols = tl.arange(0, BLOCK)
        m = cols < R
        f = tl.load(inv + cols, mask=m, other=0.0)
        if PDL:
            tl.extra.cuda.gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        a = tl.load(pos + row).to(tl.float32) * f
        tl.store(cos + row * R + cols, tl.cos(a) * attn_factor, mask=m)
        tl.store(sin + row * R + cols, tl.sin(a) * attn_factor, mask=m)

    @triton.jit
    def silu_kernel(gu, out, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < N
        dt = out.dtype.element_ty
        g = tl.load(gu + row * 2 * N + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu + row * 2 * N + N + cols, mask=m, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u
        tl.store(out + row * N + cols, act.to(dt), mask=m)

    @triton.jit
    def rope_kernel(x, cos, sin, y, T, H, s_xb, s_xt, s_xh, s_cb, s_ct, D: tl.constexpr, INTERLEAVED: tl.constexpr,
                    HP: tl.constexpr, DH: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: x and the step's cos / sin come from earlier kernels
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        n = tl.program_id(0)
        b = (n // T).to(tl.int64)
        t = (n % T).to(tl.int64)
        hh = tl.arange(0, HP)[:, None]
        i = tl.arange(0, DH)[None, :]
        m = (hh < H) & (i < D // 2)
        c = tl.load(cos + b * s_cb + t * s_ct + i, mask=i < D // 2, other=0.0)
        s = tl.load(sin + b * s_cb + t * s_ct + i, mask=i < D // 2, other=0.0)
        if INTERLEAVED:  # pairs (2i, 2i + 1)
            j1 = 2 * i
            j2 = 2 * i + 1
        else:  # halves (i, i + D/2)
            j1 = i
            j2 = i + D // 2
        src = x + b * s_xb + t * s_xt + hh * s_xh
        x1 = tl.load(src + j1, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(src + j2, mask=m, other=0.0).to(tl.float32)
        dst = y + ((b * T + t) * H + hh) * D
        dt = y.dtype.element_ty
        tl.store(dst + j1, (x1 * c - x2 * s).to(dt), mask=m)
        tl.store(dst + j2, (x2 * c + x1 * s).to(dt), mask=m)

    return norm_kernel, cos_sin_kernel, silu_kernel, rope_kernel


def _norm(h: torch.Tensor, d: torch.Tensor | None, weight: torch.Tensor, eps: float
          ) -> tuple[torch.Tensor, torch.Tensor]:
    K = h.shape[-1]
    assert K <= MAX_K and weight.shape == (K,), "elementwise_kernels: norm width"
    h2 = h.reshape(-1, K).contiguous()
    d2 = d.reshape(-1, K).contiguous() if d is not None else None
    h_out = torch.empty_like(h2) if d is not None else h2
    y = torch.empty(h2.shape, dtype=torch.promote_types(weight.dtype, h.dtype), device=h.device)
    if h2.shape[0]:
        block = pow2(K)
        _kernels()[0][(h2.shape[0],)](h2, d2 if d2 is not None else h2, weight, h_out, y, K, eps,
                                      HAS_D=d is not None, BLOCK=block, num_warps=4 if block <= 2048 else 8,
                                      **launch_options(h2))
    return h_out.view(h.shape), y.view(h.shape)


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _norm(x, None, weight, eps)[1]


def add_rms_norm_rows(h: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, eps: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    return _norm(h, d, weight, eps)


def rotary_cos_sin_rows(positions: torch.Tensor, inv_freq: torch.Tensor,
                        attn_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    R = inv_freq.shape[0]
    p = positions.reshape(-1).contiguous()
    cos = torch.empty(*positions.shape, R, dtype=torch.float32, device=positions.device)
    sin = torch.empty_like(cos)
    if p.numel():
        _kernels()[1][(p.numel(),)](p, inv_freq, cos, sin, R, attn_factor, BLOCK=pow2(R), num_warps=1,
                                    **launch_options(p))
    return cos, sin


def silu_mul_rows(gate_up: torch.Tensor) -> torch.Tensor:
    N = gate_up.shape[-1] // 2
    gu = gate_up.reshape(-1, 2 * N).contiguous()
    out = torch.empty(*gate_up.shape[:-1], N, dtype=gate_up.dtype, device=gate_up.device)
    if gu.shape[0]:
        block = min(SILU_BLOCK, pow2(N))
        _kernels()[2][(gu.shape[0], (N + block - 1) // block)](gu, out, N, BLOCK=block, **launch_options(gu))
    return out


def rope_rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    B, T, H, D = x.shape
    assert D % 2 == 0 and x.stride(-1) == 1 and cos.shape == sin.shape == (B, T, D // 2), "rope_rows: shapes"
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty(B, T, H, D, dtype=x.dtype, device=x.device)
    if B * T * H:
        _kernels()[3][(B * T,)](x, cos, sin, y, T, H, x.stride(0), x.stride(1), x.stride(2), cos.stride(0),
                                cos.stride(1), D=D, INTERLEAVED=interleaved, HP=pow2(H), DH=pow2(D // 2),
                                num_warps=4 if H * D > 1024 else 1, **launch_options(x))
    return y
