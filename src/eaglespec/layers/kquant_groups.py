"""GGUF weights of other groups than Q4_0 / Q4_1 / Q8_0 (Q5_0 / Q5_1 / Q5_K, Q6_K; Q4_K, Q3_K, Q2_K; IQ3_S, IQ4_NL /
IQ4_XS) recovered from the loader's float32 weights as sums of 4-bit products for PyTorch's groupwise kernel
(layers/int4_linear.py).

`kquant_terms(w)`: w float32 [N, K] (K a multiple of GROUP) -> [(row start, row end, terms)], contiguous runs of rows
covering 0..N, each run's terms a list of (codes uint8 [n, K] in 0..15, scale [n, K / GROUP], zero [n, K / GROUP]) in
the kernel's form w = sum over terms of (codes - 8) scale + zero; or None where some row holds a group of none of the
forms below (float weights; most IQ types' groups). A row takes the first form it fits, in the order its chunk of rows
takes from its first row (the form of the fewest terms there first: `_chunk_order`), and a run is a stretch of rows
with the same count (a fused q / k / v projection of Q4_K q and k rows and Q6_K v rows, as llama.cpp's
Q4_K_M mix writes them: one term for q and k, four for v). `kquant_runs(w, start, feed)` is the same recovery handing
each chunk's terms on as it finds them (Int4Linear packs them at once, never holding a tensor's codes: int4_linear.
TermBuilder). The forms:

  1 term    every group of 32 affine with 16 levels: w = s c + lo, c in 0..15 (Q4_K: w = d sc q - dmin m; IQ3_S,
            whose signed grid values, odd integers up to 15, times a block scale lie on 16 levels; Q4_0 and Q4_1 are
            taken before, by `four_bit_groups`): codes c, scale s, zero lo + 8 s.
  2 terms   affine with up to 256 levels (Q5_0 / Q5_1 / Q5_K: 32; a Q8_0 block; IQ4_NL / IQ4_XS, whose 16 levels
            are integers in -127..113 times the block's scale): c = 16 h + l, h's term codes h + b
            with scale 16 s and zero 0, l's codes l with scale s and zero lo + 8 s - 16 s (b - 8), the offset b per
            group chosen to keep that zero within a few s (the kernel rounds it to bf16).
  4 terms   symmetric groups of 16 (Q6_K: w = d sc q, sc an int8 per 16 weights, q in -32..31): each half of a
            group of 32 has its own scale, which the kernel's groups of 32 cannot hold in one term; with u = q + 32 =
            16 h + l, s (u - 32) = s (l - 8) + 8 s (2 h - 3), the half's l-term and h-term (codes 2 h + 5) carry
            scale s and 8 s, the other half's codes 8 (nothing), zeros 0. Where every half's codes, on its
            coarsest grid, lie in -8..7 (Q3_K: w = d sc q, sc 6 bits a 16, q in -4..3), 2 terms: each half's
            codes q + 8 with its scale s, the other half's 8.
  3 terms   affine groups of 16 with up to 16 levels (Q2_K: w = d sc q - dmin m, sc and m 4 bits a 16, q in 0..3):
            each half has its own minimum, which a term's zero (one a group of 32) cannot hold; half 0's codes
            c0 with scale s0 and zero 0 (half 1's codes 8), half 1's codes c1 with scale s1 and zero z1 = lo1 + 8 s1
            (half 0's 8), and a term of codes 9 in half 0 and 8 in half 1 with scale z0 - z1 (z0 = lo0 + 8 s0).

Recovery (layers/kquant_kernels.py, numba: without it nothing is taken here): a group's step is found from its
values alone, and a group is taken where every value lies within 1e-3 of a step of its grid point. A group of float
weights cannot pass (32 values each that near a grid of at most 256 levels, or 16 of at most 16), so acceptance means
accuracy: the weights are the file's to the loader's float32 rounding and the kernel's bf16 scales and zeros (as
layers/int4_linear.py's Q4_1 groups; a Q2_K half's offset is two bf16 zeros, z1 and z0 - z1).

Why: llama.cpp's K-quant mixes (Q4_K_M, Q5_K_M, Q6_K) are what most GGUF files hold; without this they load dense,
float32 on the CPU, 7-8x the bytes a step reads.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, TypeVar

import torch

from .int4_linear import GROUP, row_chunks

_HALF = GROUP // 2  # Q6_K's, Q3_K's and Q2_K's scale group
_WHOLE, _HALVES, _AFFINE_HALVES = 0, 1, 2  # the forms a row's groups are taken in (module docstring)
_ORDER = (_WHOLE, _HALVES, _AFFINE_HALVES)  # the order a row takes the first it fits in: the fewest products first
_LEAST = {_WHOLE: 1, _HALVES: 2, _AFFINE_HALVES: 3}  # the fewest terms each form can take a row in

Terms = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
R = TypeVar("R")  # what `kquant_runs`' caller builds of a run


def _kernels() -> ModuleType | None:
    """layers/kquant_kernels.py, or None where numba is not installed."""
    try:
        from . import kquant_kernels
    except ImportError:
        return None
    return kquant_kernels


def kquant_kernels_installed() -> bool:
    """Whether this recovery can run (numba installed)."""
    return _kernels() is not None


def affine_groups(g: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """g float32 [m, n] -> (ok [m] bool, codes [m, n] float in 0..levels-1, step [m], lo [m]) with g = step codes +
    lo within 1e-3 of a step where ok (kquant_kernels.affine)."""
    m, n = g.shape
    codes, step, lo = torch.empty(m, n), torch.empty(m), torch.empty(m)  # (the kernel writes every element)
    ok = torch.empty(m, dtype=torch.uint8)
    _kernels().affine(g.contiguous().numpy(), levels, codes.numpy(), step.numpy(), lo.numpy(), ok.numpy())
    return ok.bool(), codes, step, lo


def symmetric_halves(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g float32 [m, n] -> (ok [m] bool, q [m, n] float in -32..63, step [m] >= 0) with g = step q within 1e-3 of a
    step where ok (kquant_kernels.symmetric)."""
    m, n = g.shape
    q, step, ok = torch.empty(m, n), torch.empty(m), torch.empty(m, dtype=torch.uint8)  # (as affine_groups)
    _kernels().symmetric(g.contiguous().numpy(), q.numpy(), step.numpy(), ok.numpy())
    return ok.bool(), q, step


def _affine_terms(codes: torch.Tensor, step: torch.Tensor, lo: torch.Tensor, n_terms: int) -> Terms:
    """Rows of groups codes [n, G, GROUP] (steps and minima [n, G, 1]) as 1 or 2 terms (module docstring), codes
    uint8."""
    n = codes.shape[0]
    if n_terms == 1:
        return [(codes.to(torch.uint8).reshape(n, -1), step[..., 0], (lo + 8 * step)[..., 0])]
    h, l = torch.div(codes, 16, rounding_mode="floor"), codes % 16
    top = h.amax(-1, keepdim=True)
    # the h-term's offset b in 0..15 - top whose l-term zero lo + 8 s - 16 s (b - 8) is nearest 0
    want = 8 + torch.where(step > 0, (lo + 8 * step) / (16 * step.clamp(min=1e-30)), torch.zeros_like(step)).round()
    b = torch.minimum(torch.maximum(want, torch.zeros_like(want)), 15 - top)
    hi_term = ((h + b).to(torch.uint8).reshape(n, -1), (16 * step)[..., 0], torch.zeros_like(step[..., 0]))
    lo_term = (l.to(torch.uint8).reshape(n, -1), step[..., 0], (lo + 8 * step - 16 * step * (b - 8))[..., 0])
    return [hi_term, lo_term]


def _half_terms(q: torch.Tensor, step: torch.Tensor, n_terms: int) -> Terms:
    """Rows of halves q [n, G, 2, _HALF] (steps [n, G, 2, 1]) as 4 terms (module docstring), or as 2 where every
    code lies in -8..7 (Q3_K's -4..3): each half's codes q + 8 with its scale, the other half's 8; codes uint8."""
    n = q.shape[0]
    if n_terms == 2:
        parts: tuple = (((q + 8).to(torch.uint8), 1.0),)
    else:
        u = (q + 32).to(torch.uint8)
        parts = ((u & 15, 1.0), ((u >> 4) * 2 + 5, 8.0))  # (l, s), (2 h + 5, 8 s)
    eight = torch.full((), 8, dtype=torch.uint8)
    terms: Terms = []
    for codes, mult in parts:
        for half in (0, 1):
            mine = torch.arange(2).view(1, 1, 2, 1) == half  # this term's half of each group; the other's codes 8
            scale = mult * step[:, :, half, 0]  # [n, G]
            terms.append((torch.where(mine, codes, eight).reshape(n, -1), scale, torch.zeros_like(scale)))
    return terms


def _affine_half_terms(c: torch.Tensor, step: torch.Tensor, lo: torch.Tensor) -> Terms:
    """Rows of affine halves (codes c [n, G, 2, _HALF] in 0..15, steps and minima [n, G, 2, 1]) as 3 terms (module
    docstring), codes uint8."""
    n = c.shape[0]
    first = torch.arange(2).view(1, 1, 2, 1) == 0
    eight, nine = (torch.full((), v, dtype=torch.uint8) for v in (8, 9))
    c = c.to(torch.uint8)
    s0, s1 = step[:, :, 0, 0], step[:, :, 1, 0]  # [n, G]
    z0, z1 = lo[:, :, 0, 0] + 8 * s0, lo[:, :, 1, 0] + 8 * s1  # each half's zero as its own term would hold it
    return [(torch.where(first, c, eight).reshape(n, -1), s0, torch.zeros_like(s0)),
            (torch.where(first, eight, c).reshape(n, -1), s1, z1),
            (torch.where(first, nine, eight).expand_as(c).reshape(n, -1), z0 - z1, torch.zeros_like(s0))]


def _chunk_runs(g: torch.Tensor, order: tuple[int, ...] = _ORDER
                ) -> list[tuple[int, int, int, Terms]] | None:
    """A chunk of rows g [n, G, GROUP] -> its runs (terms a row, first row, end, terms), or None where a row fits no
    form of `order`. Each row takes the first form of `order` it fits."""
    n, G, _ = g.shape
    count = torch.zeros(n, dtype=torch.int64)
    form = torch.zeros(n, dtype=torch.int64)  # how the row's groups were taken: _WHOLE, _HALVES or _AFFINE_HALVES
    codes = step = lo = q = hstep = None  # [n, G, GROUP] / [n, G, 1] x 2; [n, G, 2, _HALF] / [n, G, 2, 1]
    ac = astep = alo = None  # [n, G, 2, _HALF] / [n, G, 2, 1] x 2

    def whole(t: torch.Tensor | None, got: torch.Tensor, rest: torch.Tensor, every: bool) -> torch.Tensor:
        """`got` (the rows `rest`) as all n rows: itself where every row was tried, else scattered."""
        if every:
            return got
        t = torch.zeros(n, *got.shape[1:]) if t is None else t
        t[rest] = got
        return t

    for tried in order:
        rest = count == 0
        m = int(rest.sum())
        if m == 0:
            break
        every = m == n
        part = g if every else g[rest]
        if tried == _WHOLE:  # whole groups: 1 or 2 terms
            ok, c, s, low = affine_groups(part.reshape(-1, GROUP), 256)
            ok, c = ok.view(m, G).all(-1), c.view(m, G, GROUP)
            codes, step = whole(codes, c, rest, every), whole(step, s.view(m, G, 1), rest, every)
            lo = whole(lo, low.view(m, G, 1), rest, every)
            count[rest] = torch.where(ok, torch.where(c.amax(-1).amax(-1) < 16, 1, 2), 0)
        elif tried == _HALVES:
            hok, hq, hs = symmetric_halves(part.reshape(-1, _HALF))
            ok = hok.view(m, G * 2).all(-1)
            narrow = (hq.view(m, -1).amin(-1) >= -8) & (hq.view(m, -1).amax(-1) <= 7)
            count[rest] = torch.where(ok, torch.where(narrow, 2, 4), 0)
            form[rest] = torch.where(ok, _HALVES, 0)
            q, hstep = whole(q, hq.view(m, G, 2, _HALF), rest, every), whole(hstep, hs.view(m, G, 2, 1), rest, every)
        else:  # affine halves of up to 16 levels: 3 terms
            aok, a_c, a_s, a_lo = affine_groups(part.reshape(-1, _HALF), 16)
            ok = aok.view(m, G * 2).all(-1)
            count[rest] = torch.where(ok, 3, 0)
            form[rest] = torch.where(ok, _AFFINE_HALVES, 0)
            ac, alo = whole(ac, a_c.view(m, G, 2, _HALF), rest, every), whole(alo, a_lo.view(m, G, 2, 1), rest, every)
            astep = whole(astep, a_s.view(m, G, 2, 1), rest, every)
    if bool((count == 0).any()):
        return None
    if bool((count == 2).any()):  # (affine ones: whole groups)
        # one-term rows among two-term ones go as two terms (codes < 16 are two-term codes with h = 0): each run costs
        # a product call a term and a concatenation, more than a chunk's rows' second product. Such chunks occur
        # where a file was requantized from 4-bit values (llama-quantize --allow-requantize of a Q4_1 file to Q5_K_M:
        # Q5_1 / Q5_K rows whose groups fit 16 levels beside rows that do not, 90-150 runs a layer before), and at
        # a fused projection's boundary between a Q4_K and a Q5_K tensor (one chunk's rows at most).
        count = torch.where(count == 1, 2, count)
    key = 4 * count + form  # runs of one count and one form (kquant_terms joins neighbours of one count)
    edges = [0] + ((key[1:] != key[:-1]).nonzero()[:, 0] + 1).tolist() + [n]
    runs = []
    for a, b in zip(edges[:-1], edges[1:]):
        k, f = int(count[a]), int(form[a])
        terms = (_half_terms(q[a:b], hstep[a:b], k) if f == _HALVES
                 else _affine_half_terms(ac[a:b], astep[a:b], alo[a:b]) if f == _AFFINE_HALVES
                 else _affine_terms(codes[a:b], step[a:b], lo[a:b], k))
        runs.append((k, a, b, terms))
    return runs


def _chunk_order(g1: torch.Tensor) -> tuple[int, ...]:
    """The order a chunk's rows try the forms in, from its first row g1 [1, G, GROUP]: the form that takes that row in
    the fewest terms first (of two that tie, the halves: Q3_K's rows fit whole groups too, on a grid of their super-
    block's scale, found only by the whole groups' slowest candidates), then _ORDER's. A search that fails, or finds
    late, is the slow part of the recovery (a Q2_K row fails the whole groups' and the halves' searches, a Q3_K row
    costs ~70 ns a weight as whole groups, against ~15 for Q4_K's), and rows of a chunk are of one type but where a
    fused projection's tensors meet (there, rows of the other type may take more terms than they could: one chunk)."""
    best, fewest = _WHOLE, 5
    for i, f in enumerate(_ORDER):
        if not any(_LEAST[h] < fewest or (_LEAST[h] == fewest and h == _HALVES) for h in _ORDER[i:]):
            break  # no form left can take the row in fewer terms (nor tie where a tie goes to it): the same answer
            # without their searches (a Q4_K row's failing search as halves was ~20% of its chunk's recovery)
        got = _chunk_runs(g1, (f,))
        if got is not None and (got[0][0] < fewest or (got[0][0] == fewest and f == _HALVES)):
            best, fewest = f, got[0][0]
    return (best,) + tuple(f for f in _ORDER if f != best)


def kquant_runs(w: torch.Tensor, start: Callable[[int], R], feed: Callable[[R, Terms], Any]
                ) -> list[tuple[int, int, R]] | None:
    """The recovery of `kquant_terms`, a chunk of rows at a time: each run of rows (start, end, `start(terms a row)`)
    is fed each of its chunks' terms as the chunk is recovered (`feed(run's value, terms)`), so that no more than a
    chunk's codes need be held at once (Int4Linear packs them as they come: int4_linear.TermBuilder); None where a
    row fits no form (the chunks before it were fed: the caller drops them)."""
    N, K = w.shape
    if K % GROUP or _kernels() is None:
        return None
    g_all = w.float().reshape(N, K // GROUP, GROUP)
    runs: list[list] = []  # [terms a row, first row, end, start(terms a row)]
    for rows in row_chunks(N, K):
        r = rows.start
        got = _chunk_runs(g_all[rows], _chunk_order(g_all[rows][:1]))
        if got is None:
            return None
        for k, a, b, terms in got:
            if not (runs and runs[-1][0] == k and runs[-1][2] == r + a):  # else the run goes on from the chunk before
                runs.append([k, r + a, r + b, start(k)])
            runs[-1][2] = r + b
            feed(runs[-1][3], terms)
    return [(a, b, value) for _, a, b, value in runs]


def kquant_terms(w: torch.Tensor) -> list[tuple[int, int, Terms]] | None:
    """Module docstring (codes uint8 here), every run's terms whole: `kquant_runs` joining each term's chunks."""
    runs = kquant_runs(w, lambda k: [], lambda parts, terms: parts.append(terms))
    if runs is None:
        return None
    return [(a, b, [tuple(torch.cat([t[i][j] for t in parts]) for j in range(3))  # type: ignore[misc]
                    for i in range(len(parts[0]))])
            for a, b, parts in runs]
