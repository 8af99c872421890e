"""Numba kernels for a decoder layer's small work on the 4-bit CPU path (engine/int4_step.py): one call each for the
residual add + RMSNorm, RoPE + KV store + attention, and SiLU gating, in place of ~70 PyTorch operators a layer whose
dispatch cost most of a one-row step (docs/benchmarks.md, "Session 71"). Importing this module imports numba; the
caller falls back to the PyTorch path where that fails.

Arrays are float32 (numpy views of the engine's tensors) or, where marked "bf16 or bits", either a float32 array
holding bf16 values or a uint16 array of a bf16 tensor's bits (`tensor.view(torch.uint16).numpy()`: numba has no
bf16), which a kernel widens on reading (`as_f32`) or narrows on writing (`store`) at no loss: the layer step hands
the 4-bit products' bf16 outputs and inputs so, without a conversion in PyTorch (~2-4 us each, eight a layer). The
KV caches are bits. "bf16" below means a float32 holding a bfloat16 value, rounded to nearest even as
`Tensor.to(torch.bfloat16)` rounds (`round_bf16`): the kernels round where the PyTorch path (layers/norm.py,
rotary.py, row_attention.py, mlp.py in bf16) rounds, so that the model computes the same function to within
summation order.

Row-invariant by construction: each token's outputs are computed from that token's inputs alone (and, in the
attention, its visible keys in cache order and their count) by the same compiled loop, whatever the number of tokens
in the call: a speculative verify of D tokens gives every token the bits a one-token decode step gives it, which is
what keeps speculation lossless in bf16 (engine/int4_weights.py). `fastmath` (reassociated sums, vectorised) is a
property of the compiled code, the same for every call, so it does not break that.

- `add_rms_norm(h, d, w, eps, x)`: h [M, K] <- bf16(h + d) (d zeros for a first layer, whose input is h alone);
  x [M, K] <- bf16(w * bf16(h / sqrt(mean(h^2) + eps))); d and x bf16 or bits.
- `two_rms_norms(e, we, eps_e, h, wh, eps_h, x)`: e, h [M, K] (bf16) -> x [M, 2 K] = (RMSNorm(e), RMSNorm(h)), each as
  above (an EAGLE-3 drafter's input: its token embedding and incoming hidden, engine/int4_drafter.py).
- `rope_store_attend(qkv, cos, sin, k_cache, v_cache, rows, slots, vis_n, vis_idx, H, Hkv, scale, out)`:
  qkv [M, (H + 2 Hkv) D] (bf16 values); cos / sin [M, D / 2] float32; caches [Bc, S, Hkv, D] bf16 as uint16, their
  bits (numba has no bf16; keys and values are bf16 values, which half of float32's bytes hold exactly, and at long
  contexts reading the cache is most of the attention's time); token m's rotated key and its value stored at
  (rows[m], slots[m]) for every m first; then token m attends over the vis_n[m] cache
  positions of its row that vis_idx[m, :vis_n[m]] lists (vis_idx of width 0: positions 0 .. vis_n[m] - 1) -> out
  [M, H D] (bf16). RoPE on halves; scores, softmax and the weighted sum in float32. qkv and out bf16 or bits.
- `silu_mul(gu, out)`: gu [M, 2 I] (gate, then up; bf16) -> out [M, I] = bf16(bf16(silu(gate)) * up); both bf16 or
  bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload


# The three helpers below are numba overloads (their machine code is chosen by the array's type where a kernel is
# compiled); the Python bodies compute the same for callers outside the kernels.
def as_f32(a: np.ndarray) -> np.ndarray:
    """A bf16-or-bits array as float32: a float32 array itself, a uint16 one widened into a new one."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a


def out_f32(out: np.ndarray) -> np.ndarray:
    """Where to compute an output bound for `out`: a float32 `out` itself, else a new float32 array."""
    return np.empty(out.shape, np.float32) if out.dtype == np.uint16 else out


def store(out: np.ndarray, x: np.ndarray) -> None:
    """x (float32 of bf16 values, from `out_f32(out)`) into `out`: nothing for a float32 `out` (x is it), the top
    half of each value's bits for a uint16 one."""
    if out.dtype == np.uint16:
        out[...] = (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def _bits(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.uint16


@overload(as_f32)
def _as_f32(a):
    if _bits(a):
        def widen(a):
            x = np.empty(a.shape, np.float32)
            u, b = x.reshape(-1).view(np.uint32), a.reshape(-1)
            for i in range(b.size):
                u[i] = np.uint32(b[i]) << np.uint32(16)
            return x
        return widen
    return lambda a: a


@overload(out_f32)
def _out_f32(out):
    if _bits(out):
        return lambda out: np.empty(out.shape, np.float32)
    return lambda out: out


@overload(store)
def _store(out, x):
    if _bits(out):
        def narrow(out, x):
            u, b = x.reshape(-1).view(np.uint32), out.reshape(-1)
            for i in range(b.size):
                b[i] = np.uint16(u[i] >> np.uint32(16))
        return narrow
    return lambda out, x: None


@njit(cache=True, nogil=True)
def round_bf16(x: np.ndarray) -> None:
    """x (any shape, contiguous float32) rounded in place to the nearest bfloat16, ties to even (finite values)."""
    u = x.reshape(-1).view(np.uint32)
    for i in range(u.size):
        v = u[i]
        u[i] = (v + np.uint32(0x7FFF) + ((v >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)


@njit(cache=True, nogil=True, fastmath=True)
def _normalize(h: np.ndarray, eps: float, x: np.ndarray, col: int) -> None:
    """x[m, col:col + K] <- h[m] / sqrt(mean(h[m]^2) + eps) for every row m of h [M, K] (unrounded)."""
    M, K = h.shape
    for m in range(M):
        acc = np.float32(0.0)
        for k in range(K):
            acc += h[m, k] * h[m, k]
        r = np.float32(1.0) / np.sqrt(acc / np.float32(K) + np.float32(eps))
        for k in range(K):
            x[m, col + k] = h[m, k] * r


@njit(cache=True, nogil=True, fastmath=True)
def _weigh(x: np.ndarray, w: np.ndarray, col: int) -> None:
    """x[m, col:col + K] *= w [K] for every row m."""
    for m in range(x.shape[0]):
        for k in range(w.shape[0]):
            x[m, col + k] *= w[k]


@njit(cache=True, nogil=True, fastmath=True)
def add_rms_norm(h: np.ndarray, d: np.ndarray, w: np.ndarray, eps: float, x: np.ndarray) -> None:
    """Module docstring."""
    M, K = h.shape
    d32, x32 = as_f32(d), out_f32(x)
    for m in range(M):
        for k in range(K):
            h[m, k] += d32[m, k]
    round_bf16(h)
    _normalize(h, eps, x32, 0)
    round_bf16(x32)
    _weigh(x32, w, 0)
    round_bf16(x32)
    store(x, x32)


@njit(cache=True, nogil=True, fastmath=True)
def two_rms_norms(e: np.ndarray, we: np.ndarray, eps_e: float, h: np.ndarray, wh: np.ndarray, eps_h: float,
                  x: np.ndarray) -> None:
    """Module docstring."""
    K = e.shape[1]
    _normalize(e, eps_e, x, 0)
    _normalize(h, eps_h, x, K)
    round_bf16(x)
    _weigh(x, we, 0)
    _weigh(x, wh, K)
    round_bf16(x)


@njit(cache=True, nogil=True, fastmath=True)
def rope_store_attend(qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray,
                      rows: np.ndarray, slots: np.ndarray, vis_n: np.ndarray, vis_idx: np.ndarray, H: int, Hkv: int,
                      scale: float, out_bits: np.ndarray) -> None:
    """Module docstring."""
    qkv, out = as_f32(qkv), out_f32(out_bits)
    M = qkv.shape[0]
    D = k_cache.shape[3]
    half = D // 2
    g = H // Hkv  # query head h reads KV head h // g
    q = np.empty((M, H, D), np.float32)
    k = np.empty((M, Hkv, D), np.float32)
    for m in range(M):  # RoPE on halves, in float32, rounded to bf16 (apply_rotary)
        for hh in range(H + Hkv):
            base = hh * D
            for i in range(half):
                x1, x2 = qkv[m, base + i], qkv[m, base + half + i]
                c, s = cos[m, i], sin[m, i]
                a, b = x1 * c - x2 * s, x2 * c + x1 * s
                if hh < H:
                    q[m, hh, i], q[m, hh, half + i] = a, b
                else:
                    k[m, hh - H, i], k[m, hh - H, half + i] = a, b
    round_bf16(q)
    round_bf16(k)
    kb, qkvb = k.view(np.uint32), qkv.view(np.uint32)  # bf16 values: their top 16 bits are the bf16
    vbase = (H + Hkv) * D
    for m in range(M):  # every token's key and value into the cache before any token attends
        r, sl = rows[m], slots[m]
        for kh in range(Hkv):
            for i in range(D):
                k_cache[r, sl, kh, i] = np.uint16(kb[m, kh, i] >> np.uint32(16))
                v_cache[r, sl, kh, i] = np.uint16(qkvb[m, vbase + kh * D + i] >> np.uint32(16))
    gathered = vis_idx.shape[1] > 0
    sc = np.float32(scale)
    row_bits = np.empty(D, np.uint32)  # one cached key or value row, widened to float32
    row = row_bits.view(np.float32)
    for m in range(M):
        r, n = rows[m], vis_n[m]
        s = np.empty((g, n), np.float32)
        acc = np.empty((g, D), np.float32)
        for kh in range(Hkv):
            for j in range(n):  # the g query heads of this KV head share each key's load
                pos = vis_idx[m, j] if gathered else j
                for i in range(D):
                    row_bits[i] = np.uint32(k_cache[r, pos, kh, i]) << np.uint32(16)
                for gi in range(g):
                    dot = np.float32(0.0)
                    for i in range(D):
                        dot += q[m, kh * g + gi, i] * row[i]
                    s[gi, j] = dot * sc
            for gi in range(g):
                mx = np.float32(-3.4e38)  # (no infinities under fastmath)
                for j in range(n):
                    mx = max(mx, s[gi, j])
                tot = np.float32(0.0)
                for j in range(n):
                    e = np.exp(s[gi, j] - mx)
                    s[gi, j] = e
                    tot += e
                for j in range(n):
                    s[gi, j] /= tot
                for i in range(D):
                    acc[gi, i] = 0.0
            for j in range(n):  # and each value's, summed in cache order for every query head
                pos = vis_idx[m, j] if gathered else j
                for i in range(D):
                    row_bits[i] = np.uint32(v_cache[r, pos, kh, i]) << np.uint32(16)
                for gi in range(g):
                    p = s[gi, j]
                    for i in range(D):
                        acc[gi, i] += p * row[i]
            for gi in range(g):
                o = (kh * g + gi) * D
                for i in range(D):
                    out[m, o + i] = acc[gi, i]
    round_bf16(out)
    store(out_bits, out)


@njit(cache=True, nogil=True, fastmath=True)
def silu_mul(gu_bits: np.ndarray, out_bits: np.ndarray) -> None:
    """Module docstring."""
    gu, out = as_f32(gu_bits), out_f32(out_bits)
    M, N2 = gu.shape
    N = N2 // 2
    for m in range(M):
        for i in range(N):
            x = gu[m, i]
            out[m, i] = x / (np.float32(1.0) + np.exp(-x))
    round_bf16(out)
    for m in range(M):
        for i in range(N):
            out[m, i] *= gu[m, N + i]
    round_bf16(out)
    store(out_bits, out)


def warm() -> None:
    """Call each kernel once on tiny arrays of the types the step passes, so that numba loads (or, the first time on
    a machine, compiles and caches: ~10 s) their machine code now, at the model's load, not in its first step
    (~0.5 s, most of it LLVM's start; loaded in a thread beside the model's load it slowed that load as much)."""
    f32, i64 = np.float32, np.int64
    h, w, x = np.zeros((1, 4), f32), np.ones(4, f32), np.zeros((1, 4), f32)
    add_rms_norm(h, np.zeros((1, 4), f32), w, 1e-5, x)
    kc, vc = np.zeros((1, 2, 1, 2), np.uint16), np.zeros((1, 2, 1, 2), np.uint16)
    idx = np.zeros((1, 0), i64)
    rope_store_attend(np.zeros((1, 6), f32), np.ones((1, 1), f32), np.zeros((1, 1), f32), kc, vc, np.zeros(1, i64),
                      np.zeros(1, i64), np.ones(1, i64), idx, 1, 1, 0.5, np.zeros((1, 2), f32))
    silu_mul(np.zeros((1, 4), f32), np.zeros((1, 2), f32))
    u16 = np.uint16  # the layer step's types: the products' bf16 inputs and outputs as bits
    add_rms_norm(h, np.zeros((1, 4), u16), w, 1e-5, np.zeros((1, 4), u16))
    rope_store_attend(np.zeros((1, 6), u16), np.ones((1, 1), f32), np.zeros((1, 1), f32), kc, vc, np.zeros(1, i64),
                      np.zeros(1, i64), np.ones(1, i64), idx, 1, 1, 0.5, np.zeros((1, 2), u16))
    silu_mul(np.zeros((1, 4), u16), np.zeros((1, 2), u16))
    two_rms_norms(np.zeros((1, 2), f32), np.ones(2, f32), 1e-5, np.zeros((1, 2), f32), np.ones(2, f32), 1e-5, x)
