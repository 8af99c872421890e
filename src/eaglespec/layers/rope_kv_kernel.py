"""One Triton kernel for the start of GQA attention: RoPE on q and k, and k / v written into the KV cache.

Unfused, this is a RoPE chain for q and k (or one compiled kernel) plus two `index_put` scatters per layer; at batch 1
on a GPU each is a few microseconds of mostly launch latency, so one kernel saves ~3 launches per layer.

`rope_store(qkv, cos, sin, k_cache, v_cache, rows, write_index, n_heads, n_kv_heads, norm_of=None) -> q`:
  qkv [B, T, H + 2*Hkv, D] (q heads, then k, then v: the fused projection's output), cos / sin [B, T, R/2] float32
  (R <= D the rotated dims: R < D is partial RoPE, the first R dims of a head rotated and the rest passed through),
  caches [Bc, S, Hkv, D] (one layer's views), rows [B] int64 cache rows, write_index [B, T] int64 positions.
  Returns q [B, T, H, D] rotated; k rotated and v are stored at (rows[b], write_index[b, t]). RoPE rotates halves
  (the Llama layout) in float32, exactly as layers/rotary.apply_rotary does. Program b*t: one token, all its heads
  as one [H + Hkv, R/2] tile per rotated half (q and k; extents padded to powers of 2 and masked, so any even D and
  R), the unrotated [H + Hkv, D - R] tail when R < D, v as [Hkv, D]; one program per (token, head), the first
  layout, cost more where the norm's scale is applied (each of a token's 12 programs recomputed it) and no less
  elsewhere (H200, session 19, `spec_phase_trace.py`: 30 calls in SmolLM2's 128-row verify 93.6 -> 69.2 us, in the
  one-row verify of 4 41.0 -> 35.2 us, the decode steps unchanged).
  `rope_store_reference` is the same computation in PyTorch (the fallback, and the tests' reference).
  With `norm_of=(h, eps)`, h [B, T, K] the projection's input, q, k and v are first multiplied by h's RMSNorm scale
  1 / sqrt(mean(h^2) + eps) in float32: the attention's input norm, its weight folded into q/k/v
  (`engine.transforms.fold_norms`), applied after the projection instead of in a kernel before it.
  With `head_norms=(q_weight, k_weight, eps)` (Qwen3's `QKNormAttention`), every q head and every k head is then
  RMS-normalised over its D values and multiplied by q_weight or k_weight [D] before RoPE, with the module's rounding
  points (normalised, rounded to qkv's dtype, times the weight, rounded again).
The kernel is built on first use, so that `TRITON_INTERPRET=1` (set by the CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .norm import rms_norm, rms_scaled
from .pdl import launch_options
from .rotary import apply_rotary


def rope_store_reference(qkv, cos, sin, k_cache, v_cache, rows, write_index, n_heads: int, n_kv_heads: int,
                         norm_of: tuple[torch.Tensor, float] | None = None,
                         head_norms: tuple[torch.Tensor, torch.Tensor, float] | None = None):
    H, Hkv = n_heads, n_kv_heads
    if norm_of is not None:
        qkv = rms_scaled(qkv, *norm_of).to(qkv.dtype)
    qk = qkv[:, :, : H + Hkv]
    if head_norms is not None:
        qw, kw, eps = head_norms
        qk = torch.cat((rms_norm(qk[:, :, :H], qw, eps), rms_norm(qk[:, :, H:], kw, eps)), 2)
    qk = apply_rotary(qk, cos, sin)
    k_cache[rows[:, None], write_index] = qk[:, :, H:].to(k_cache.dtype)
    v_cache[rows[:, None], write_index] = qkv[:, :, H + Hkv :].to(v_cache.dtype)
    return qk[:, :, :H]


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rope_store_kernel(qkv, cos, sin, q_out, k_cache, v_cache, rows, widx, x, K, eps, qw, kw, head_eps,
                          T, NH_IN, H, HKV, s_cache_row, s_cache_pos, D: tl.constexpr, RH: tl.constexpr,
                          NORM: tl.constexpr, HEAD_NORM: tl.constexpr, BLOCK_K: tl.constexpr, NHP: tl.constexpr,
                          VP: tl.constexpr, RHP: tl.constexpr, PASS: tl.constexpr, PP: tl.constexpr,
                          DP: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        # one token: all its heads as [NHP, RHP] tiles per rotated half (q heads, then k heads), the unrotated tail
        # [NHP, PP] when PASS (partial RoPE), v [VP, DP]
        bt = tl.program_id(0)
        b = bt // T
        hh = tl.arange(0, NHP)[:, None]
        offs = tl.arange(0, RHP)[None, :]
        in_half = offs < RH
        rotated = hh < H + HKV
        m1 = rotated & in_half
        src = qkv + (bt * NH_IN + hh) * D
        x1 = tl.load(src + offs, mask=m1, other=0.0).to(tl.float32)
        x2 = tl.load(src + RH + offs, mask=m1, other=0.0).to(tl.float32)
        if PASS:
            offs_p = tl.arange(0, PP)[None, :]
            mp = rotated & (offs_p < D - 2 * RH)
            xp = tl.load(src + 2 * RH + offs_p, mask=mp, other=0.0).to(tl.float32)
        r = 1.0
        if NORM:  # the folded norm's scale of this token (rms_scale's float32 formula), from its row of x [B*T, K]
            offs_k = tl.arange(0, BLOCK_K)
            xr = tl.load(x + bt.to(tl.int64) * K + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            r = 1.0 / tl.sqrt(tl.sum(xr * xr, axis=0) / K + eps)
            x1 = x1 * r
            x2 = x2 * r
            if PASS:
                xp = xp * r
        if HEAD_NORM:  # each q / k head's RMSNorm (the module's roundings: normalised, rounded, times the weight)
            dt = qkv.dtype.element_ty
            ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
            if PASS:
                ss += tl.sum(xp * xp, axis=1)
            rh = 1.0 / tl.sqrt(ss / D + head_eps)  # [NHP]
            is_qh = hh < H
            w1 = tl.where(is_qh, tl.load(qw + offs, mask=in_half, other=0.0).to(tl.float32),
                          tl.load(kw + offs, mask=in_half, other=0.0).to(tl.float32))
            w2 = tl.where(is_qh, tl.load(qw + RH + offs, mask=in_half, other=0.0).to(tl.float32),
                          tl.load(kw + RH + offs, mask=in_half, other=0.0).to(tl.float32))
            x1 = ((x1 * rh[:, None]).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
            x2 = ((x2 * rh[:, None]).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
            if PASS:
                in_p = offs_p < D - 2 * RH
                wp = tl.where(is_qh, tl.load(qw + 2 * RH + offs_p, mask=in_p, other=0.0).to(tl.float32),
                              tl.load(kw + 2 * RH + offs_p, mask=in_p, other=0.0).to(tl.float32))
                xp = ((xp * rh[:, None]).to(dt).to(tl.float32) * wp).to(dt).to(tl.float32)
        c = tl.load(cos + bt * RH + offs, mask=in_half, other=0.0)
        s = tl.load(sin + bt * RH + offs, mask=in_half, other=0.0)
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
        is_q = hh < H
        qdst = q_out + (bt * H + tl.where(is_q, hh, 0)) * D
        tl.store(qdst + offs, o1.to(q_out.dtype.element_ty), mask=is_q & in_half)
        tl.store(qdst + RH + offs, o2.to(q_out.dtype.element_ty), mask=is_q & in_half)
        row = tl.load(rows + b)
        pos = tl.load(widx + bt)
        base = row * s_cache_row + pos * s_cache_pos
        is_k = (hh >= H) & rotated
        kdst = k_cache + base + tl.where(is_k, hh - H, 0) * D
        tl.store(kdst + offs, o1.to(k_cache.dtype.element_ty), mask=is_k & in_half)
        tl.store(kdst + RH + offs, o2.to(k_cache.dtype.element_ty), mask=is_k & in_half)
        if PASS:
            tl.store(qdst + 2 * RH + offs_p, xp.to(q_out.dtype.element_ty), mask=is_q & mp)
            tl.store(kdst + 2 * RH + offs_p, xp.to(k_cache.dtype.element_ty), mask=is_k & mp)
        jj = tl.arange(0, VP)[:, None]
        offs_v = tl.arange(0, DP)[None, :]
        is_v = (jj < HKV) & (offs_v < D)
        vv = tl.load(qkv + (bt * NH_IN + H + HKV + jj) * D + offs_v, mask=is_v, other=0.0)
        if NORM:  # rounded once, from float32, as q and k are
            vv = vv.to(tl.float32) * r
        tl.store(v_cache + base + jj * D + offs_v, vv.to(v_cache.dtype.element_ty), mask=is_v)

    return rope_store_kernel


def rope_store(qkv, cos, sin, k_cache, v_cache, rows, write_index, n_heads: int, n_kv_heads: int,
               norm_of: tuple[torch.Tensor, float] | None = None,
               head_norms: tuple[torch.Tensor, torch.Tensor, float] | None = None) -> torch.Tensor:
    B, T, NH, D = qkv.shape
    RH = cos.shape[-1]  # rotated dims / 2 (< D / 2: partial RoPE)
    assert NH == n_heads + 2 * n_kv_heads and 0 < 2 * RH <= D
    assert k_cache.stride(-1) == 1 and k_cache.stride(-2) == D and k_cache.stride() == v_cache.stride()
    qkv = qkv.contiguous()
    q = torch.empty(B, T, n_heads, D, dtype=qkv.dtype, device=qkv.device)
    x, eps = (qkv, 0.0) if norm_of is None else (norm_of[0].contiguous(), float(norm_of[1]))
    K = x.shape[-1]
    assert norm_of is None or x.shape[:2] == (B, T)
    H, HKV = n_heads, n_kv_heads
    qw, kw, head_eps = head_norms if head_norms is not None else (qkv, qkv, 0.0)
    _kernel()[(B * T,)](
        qkv, cos.contiguous(), sin.contiguous(), q, k_cache, v_cache, rows.contiguous(), write_index.contiguous(),
        x, K, eps, qw, kw, float(head_eps), T, NH, H, HKV, k_cache.stride(0), k_cache.stride(1), D=D, RH=RH,
        NORM=norm_of is not None, HEAD_NORM=head_norms is not None, BLOCK_K=pow2(K), NHP=pow2(H + HKV),
        VP=pow2(HKV), RHP=pow2(RH), PASS=2 * RH < D, PP=pow2(D - 2 * RH), DP=pow2(D),
        **launch_options(q),
    )
    return q
