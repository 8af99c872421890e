"""numba kernels of layers/kquant_groups.py: each group's step and integer codes recovered from its float32 values.

`affine(g, levels, codes, step, lo, ok)`: g float32 [m, n] (a row a group); for each group finds a step s > 0 and
integer codes c in 0..levels-1 with g = s c + lo (lo the group's minimum) within TOL of a step everywhere, writing
codes [m, n] (float32), step [m], lo [m] and ok [m] (uint8; a constant group: step 0, codes 0, ok; a group that
fits no grid: codes 0, not ok). Every element of the outputs is written: they may come uncleared.
`symmetric(g, codes, step, ok)`: the same for g = s q, q in -32..63 (a Q6_K half of 16; a negative file scale comes
back positive, q negated; an all-zero group: step 0).

The candidates, first to last (the first that fits wins): the range over the level counts of the usual types (15 / 31
for affine groups, 32 / 31 for symmetric halves: what the quantizers put at the extremes; for affine groups also the
largest magnitude over 127 / 16 / 8, Q8_0's, Q5_0's and Q4_0's step, whose codes may be sparse: a Q8_0 group requantized
from 4-bit weights uses one code in ~16), then the distance from the lowest value to the next one up (from the highest
down; for halves the smallest nonzero magnitude) divided by k = 1..KS_AFFINE (16) or 1..KS_SYMMETRIC (64: a half of two
distinct values, requantized from 4 bits, puts its smallest at any code), then the smallest gap between the sorted
values divided by k. A candidate's codes are rounded against it, then the step is taken again from the largest value
over its code (more digits than a gap) and every value checked against that step. Where an affine group's codes share a
factor f (the values on a grid f times coarser, which a candidate missed) and the coarser codes fit 16 levels, the
coarser grid is taken: one product, not two; a symmetric half's codes are always divided by their common factor (a
Q3_K half, q in -4..3, first fits the range over 32 on a grid 8 times finer; on its own, two products, not four). Any
exact grid of the allowed levels whose step is one of these candidates
is found (and every candidate below the smallest step the levels allow, span / (levels - 1), is skipped); a group of
float weights is not (32 values each within TOL of a step of a grid).

Why numba: PyTorch's reductions over rows of 32 and its masked updates cost ~25-75 ns a weight for this search (a 1B
Q4_K_M model ~50 s at load); these loops ~5-20 ns a weight, one core (docs/benchmarks.md "Session 74").
"""

from __future__ import annotations

import numpy as np
from numba import njit

TOL = 1e-3  # of a step: how far a value may sit from its grid point (the loader's float32 roundings are ~1e-6 of it)
KS_AFFINE = 16  # divisors of a gap tried for affine groups (a 16-level group's codes: gaps of up to 15 steps)
KS_SYMMETRIC = 64  # for symmetric halves (|q| <= 63: the smallest magnitude over any of its possible codes)


@njit(cache=True, nogil=True)
def _fits(t: np.ndarray, s: float, lo_code: int, levels: int, out: np.ndarray) -> float:
    """The step of the grid t lies on, if the candidate s leads to it, else 0: codes c = rint(t / s) within lo_code..
    lo_code + levels - 1 (written to out), the step taken again from the largest |t| over its |c| (a candidate from a
    gap carries the float32 rounding of two values, which 255 codes would multiply past TOL), and every t / step within
    TOL of its code."""
    if not (s > 0.0) or not np.isfinite(s):
        return 0.0
    inv = 1.0 / s
    big, top = 0.0, 0.0
    for j in range(t.shape[0]):
        c = np.rint(t[j] * inv)
        if c < lo_code or c >= lo_code + levels:
            return 0.0
        out[j] = c
        if abs(c) > top:
            big, top = abs(t[j]), abs(c)
    if top == 0.0:
        return 0.0
    step = big / top
    inv = 1.0 / step
    for j in range(t.shape[0]):
        if abs(t[j] * inv - out[j]) > TOL:
            return 0.0
    return step


@njit(cache=True, nogil=True)
def _gap_search(t: np.ndarray, gap: float, lo_code: int, levels: int, out: np.ndarray, ks: int,
                least: float) -> float:
    """The step of the first of gap / 1..ks that fits (`_fits`), or 0; none below `least` (the smallest step whose
    codes the levels could hold) is tried."""
    if not np.isfinite(gap):
        return 0.0
    for k in range(1, ks + 1):
        if gap / k < least:
            return 0.0
        step = _fits(t, gap / k, lo_code, levels, out)
        if step > 0.0:
            return step
    return 0.0


@njit(cache=True, nogil=True)
def _sorted_gap(t: np.ndarray, eps: float) -> float:
    """The smallest gap between t's sorted distinct values above eps, or inf."""
    u = np.sort(t)
    best = np.inf
    for j in range(1, u.shape[0]):
        d = u[j] - u[j - 1]
        if d > eps and d < best:
            best = d
    return best


@njit(cache=True, nogil=True)
def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


@njit(cache=True, nogil=True)
def _codes_gcd(out: np.ndarray, n: int) -> int:
    """The common factor of the integer codes out[:n] (their magnitudes; 0 where all are 0), stopping at 1, the usual
    answer (a modulo a code cost more than the search itself: Q6_K halves 12.1 -> 6.9 ns a weight with the stop)."""
    f = 0
    for j in range(n):
        f = _gcd(f, abs(int(out[j])))
        if f == 1:
            break
    return f


@njit(cache=True, nogil=True)
def _affine_search(t: np.ndarray, span: float, amax: float, bottom: float, top: float, eps: float, levels: int,
                   out: np.ndarray) -> float:
    """The step of the first candidate (module docstring) on whose grid t lies with codes 0..levels-1, or 0."""
    least = span / (levels - 1) * (1 - TOL)  # a grid of `levels` levels has no smaller step, and no smaller gap
    if min(bottom, top) < least:
        return 0.0
    s = _fits(t, span / 15, 0, levels, out)
    if s == 0.0:
        s = _fits(t, span / 31, 0, levels, out)
    for n_levels in (127.0, 16.0, 8.0):  # Q8_0's, Q5_0's and Q4_0's steps: the largest magnitude over these
        if s == 0.0:
            s = _fits(t, amax / n_levels, 0, levels, out)
    if s == 0.0:
        s = _gap_search(t, bottom, 0, levels, out, KS_AFFINE, least)
    if s == 0.0:
        s = _gap_search(t, top, 0, levels, out, KS_AFFINE, least)
    if s == 0.0:
        s = _gap_search(t, _sorted_gap(t, eps), 0, levels, out, KS_AFFINE, least)
    return s


@njit(cache=True, nogil=True)
def affine(g: np.ndarray, levels: int, codes: np.ndarray, step: np.ndarray, lo: np.ndarray, ok: np.ndarray) -> None:
    m, n = g.shape
    t = np.empty(n, dtype=np.float64)
    out = np.empty(n, dtype=np.float64)
    for i in range(m):
        a, b = g[i, 0], g[i, 0]
        for j in range(n):
            a = min(a, g[i, j])
            b = max(b, g[i, j])
        span = np.float64(b) - np.float64(a)
        lo[i] = a
        if span == 0.0:
            step[i] = 0.0
            codes[i, :] = 0.0
            ok[i] = 1
            continue
        for j in range(n):
            t[j] = np.float64(g[i, j]) - np.float64(a)
        eps = span * 1e-6
        bottom, top = np.inf, np.inf
        for j in range(n):  # the gaps next to the extremes
            if t[j] > eps:
                bottom = min(bottom, t[j])
            if span - t[j] > eps:
                top = min(top, span - t[j])
        amax = max(abs(np.float64(a)), abs(np.float64(b)))
        s = _affine_search(t, span, amax, bottom, top, eps, levels, out)
        hi = 0.0
        for j in range(n):
            hi = max(hi, out[j])
        if s > 0.0 and hi > 15.0:  # a finer grid than the values need (codes sharing a factor f): the coarser one,
            f = _codes_gcd(out, n)  # if 16 levels hold it
            if f > 1 and int(hi) // f <= 15:
                s *= f
                for j in range(n):
                    out[j] = out[j] // f
        ok[i] = s > 0.0
        step[i] = s
        for j in range(n):  # (every code written: the caller's arrays are not cleared)
            codes[i, j] = out[j] if s > 0.0 else 0.0


@njit(cache=True, nogil=True)
def symmetric(g: np.ndarray, codes: np.ndarray, step: np.ndarray, ok: np.ndarray) -> None:
    m, n = g.shape
    t = np.empty(n + 1, dtype=np.float64)  # the values and a zero (the grid holds 0)
    out = np.empty(n + 1, dtype=np.float64)
    for i in range(m):
        amax = 0.0
        for j in range(n):
            t[j] = g[i, j]
            amax = max(amax, abs(t[j]))
        t[n] = 0.0
        if amax == 0.0:
            step[i] = 0.0
            codes[i, :] = 0.0
            ok[i] = 1
            continue
        s = _fits(t, amax / 32, -32, 96, out)
        if s == 0.0:
            s = _fits(t, amax / 31, -32, 96, out)
        eps = amax * 1e-6
        small = np.inf
        if s == 0.0:  # the smallest nonzero magnitude
            for j in range(n):
                if abs(t[j]) > eps:
                    small = min(small, abs(t[j]))
        if s == 0.0:
            s = _gap_search(t, small, -32, 96, out, KS_SYMMETRIC, amax / 63 * (1 - TOL))
        if s == 0.0:
            s = _gap_search(t, _sorted_gap(t, eps), -32, 96, out, KS_SYMMETRIC, amax / 63 * (1 - TOL))
        if s > 0.0:  # the coarsest grid of these values (a Q3_K half, q in -4..3, is first found 8 times finer)
            f = _codes_gcd(out, n)
            if f > 1:
                s *= f
                for j in range(n):
                    out[j] = out[j] / f
        ok[i] = s > 0.0
        step[i] = s
        for j in range(n):  # (every code written: the caller's arrays are not cleared)
            codes[i, j] = out[j] if s > 0.0 else 0.0
