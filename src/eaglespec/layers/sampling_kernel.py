"""A request's sampling distribution in Triton kernels: `layers.sampling.target_probs` on CUDA.

The PyTorch path sorts every row (top-k's k-th value and top-p's nucleus need the order), whatever the row's
parameters: ~55 kernels (a radix sort, a scan, scatters, softmax, elementwise) per call on the H200, which made a
sampled SmolLM2 decode step 0.575 ms against 0.441 greedy at one row and 1.13 ms against 0.74 at 32 rows, and a
sampled chain's drafting 7x its greedy cost (docs/benchmarks.md, "Session 20"). Here one program holds a whole row
tile by tile (MAX_TILE entries per step, from L1 / L2 in every pass) and takes only the branches its own parameters
need:
- temperature <= 0: the one-hot of the argmax (the first index among equal maxima: torch.argmax's rule);
- else s = logits / T (float32); with 0 < top_k < V the k-th largest logit is found by bisection over an
  order-preserving integer key of the logits' own bits (16 halvings for bf16 / fp16 logits, 32 for float32; exact:
  dividing by T > 0 keeps the order), and entries below it drop (entries equal to it stay, as in the PyTorch path);
  p = softmax(s);
- with top_p < 1 the nucleus: token j stays iff the mass of the tokens more likely than it is < top_p (the most
  likely token always stays), found by bisection over the same keys (p grows with the logit: the smallest key K with
  mass(key > K) < top_p), then every token at least as likely as K's stays (so tokens of equal probability at the
  nucleus' edge stay together) and p is renormalised. The PyTorch path's rule is the same on the sorted row except
  among tokens of equal probability at that edge, which it orders arbitrarily (its sort).
Up to ONE_TILE entries the row stays in registers and each search halves its key range per step (16 steps for bf16
logits); longer rows are streamed tile by tile in every pass (per-lane partial sums, one reduction per pass, three
pivots per pass: 8 passes per search), the nucleus search over the probabilities written to `out` and read back. The
first version held every row in registers and bisected 31 / 32 times over the float bits: past 16,384 entries the
registers spilled (ptxas: a 904-byte stack frame per thread at 49,152), and one top-p row of 49,152 took 245 us on
one SM; now 82 us (top-k 276 -> 62, both 441 -> 122; 128,256 entries: 537 -> 204, 540 -> 150, 902 -> 301; 32,000:
43 -> 28, 56 -> 27, 84 -> 44; 12,288: 23 -> 16, 27 -> 16, 44 -> 25; docs/benchmarks.md, "Session 23").
A row without top-k and top-p costs one load in that kernel (only rows that filter are ever streamed). Past CHUNK
entries such rows (and greedy ones) are spread over programs of CHUNK entries each instead, in two kernels: chunk
statistics (the maximum of s and the sum of exp(s - it); greedy: the maximum and its first index), then each chunk's
probabilities from its row's merged statistics; the whole-row kernel then runs only for rows that filter (one
program on one SM took 80 us per 49,152-entry row at temperature only, and 30 us per 12,288-entry draft row:
docs/benchmarks.md, "Session 20"; a one-row sampled decode graph went from 0.536 to 0.451 ms with the split,
"Session 21").

`target_probs(logits, temperature, top_k, top_p) -> probs`: logits [N, V] (any float dtype, rows of stride >= V,
last dim contiguous), temperature / top_p [N] float, top_k [N] int -> probs [N, V] float32; probabilities equal the
PyTorch path's up to float32 rounding (tie-free rows).
`sample_probs(logits, temperature, top_k, top_p, noise, table=None) -> (ids, probs)`: the same probabilities and one
token per row drawn by the exponential race (the argmax of p / max(e, 1e-30) over given Exp(1) draws e [N, V], the
rule of `layers.sampling.sample`), one candidate per chunk merged by `argmax_kernel.merge_chunks` (which maps the id
through a drafter's table). Plain rows race inside the chunk-probabilities kernel; rows that filter race in one more
chunk kernel over the probabilities the whole-row kernel wrote (racing inside that one-program kernel cost +30-110 us
per 49,152-entry row); rows of a vocabulary of at most CHUNK entries race in the whole-row kernel. Against
`sample(target_probs(...))` no clamp, division or separate argmax pass over [N, V] is launched.
`fits(V)`: V <= MAX_VOCAB. One program passes over a filtering row, so such a row's time grows with V on one SM. On
the H200 (`benchmarks/sampling_check.py`) the kernels beat the PyTorch path (a sort per row, 500-1,100 us per call at
1-32 rows) in every case at 12,288, 49,152 and 128,256 entries (session 23; before it, rows of 128,256 with top-k and
top-p lost to it at 32 rows): the kernels serve vocabularies of up to 131,072.
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from . import argmax_kernel
from .block_size import pow2
from .pdl import launch_options

MAX_VOCAB = 1 << 17
CHUNK = 4096  # entries per program of an unfiltered row (12 programs for SmolLM2's 49,152, 3 for 12,288)
MAX_TILE = 8192  # entries per step of the whole-row kernel's passes over rows of more than ONE_TILE entries
# up to this many entries the whole-row kernel holds the row in registers (16 warps): at 32,768 the registers spill
# some (a 448-byte stack frame) and still beat the streamed passes (top-p row of 32,000: 28 against 55 us); at 65,536
# the session-22 kernel spilled twice that and the streamed passes win (49,152: 82 us against 245)
ONE_TILE = 32768


def fits(V: int) -> bool:
    return 1 <= V <= MAX_VOCAB


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def race(p, noise_row, offs, valid, V):
        """The exponential race over p's entries: (the maximum of p / max(e, 1e-30), its first index), the rule of
        `layers.sampling.sample` (p >= 0, so valid entries give a ratio >= 0 > -1, the mark of an empty slot)."""
        e = tl.maximum(tl.load(noise_row + offs, mask=valid, other=1.0), 1e-30)
        ratio = tl.where(valid, p / e, -1.0)
        best = tl.max(ratio, 0)
        return best, tl.min(tl.where(ratio == best, offs, V), 0)

    @triton.jit
    def row_params(temp, topk, topp, r, V):
        """Row r's (temperature, top-k, top-p, plain): plain = greedy, or neither top-k (0 < k < V) nor top-p (< 1),
        i.e. a row the chunk kernels compute (the whole-row kernel takes the others)."""
        t = tl.load(temp + r).to(tl.float32)
        k = tl.load(topk + r).to(tl.int32)
        tp = tl.load(topp + r).to(tl.float32)
        return t, k, tp, (t <= 0) | ~(((k > 0) & (k < V)) | (tp < 1.0))

    # the kernels below call these helpers as module globals: Triton 3.6's interpreter resolves a jit function's
    # callees among its module's globals only (as in short_attention_kernel)
    globals().update(_race=race, _row_params=row_params)

    @triton.jit
    def chunk_stats_kernel(x, temp, topk, topp, part_m, part_z, part_i, V, s_x, n_chunks, CHUNK: tl.constexpr,
                           PDL: tl.constexpr = False):
        """Program (r, c) of a row neither top-k nor top-p filters: chunk c's maximum of s = x / T and the sum of
        exp(s - that maximum) (T <= 0: the maximum of x and its first index)."""
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        t, k, tp, plain = _row_params(temp, topk, topp, r, V)
        if plain:  # greedy or unfiltered (the whole-row kernel: the rest)
            offs = c * CHUNK + tl.arange(0, CHUNK)
            valid = offs < V
            v = tl.load(x + r * s_x + offs, mask=valid, other=float("-inf")).to(tl.float32)
            if t <= 0:
                mx = tl.max(v, 0)
                tl.store(part_i + r * n_chunks + c, tl.min(tl.where(valid & (v == mx), offs, V), 0))
                tl.store(part_m + r * n_chunks + c, mx)
            else:
                s = v / t
                mx = tl.max(s, 0)
                tl.store(part_z + r * n_chunks + c, tl.sum(tl.where(valid, tl.exp(s - mx), 0.0), 0))
                tl.store(part_m + r * n_chunks + c, mx)

    @triton.jit
    def chunk_probs_kernel(x, out, temp, topk, topp, part_m, part_z, part_i, noise, race_v, race_i, V, s_x, n_chunks,
                           CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, RACE: tl.constexpr, PDL: tl.constexpr = False):
        """Program (r, c) of an unfiltered row: the row's maximum M and sum Z from its chunks' (Z = sum of z_c
        exp(m_c - M)), then chunk c's exp(s - M) / Z (T <= 0: the one-hot of the row's first maximum); with RACE
        also the chunk's maximum of p / max(e, 1e-30) over the Exp(1) draws e and its first index."""
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        t, k, tp, plain = _row_params(temp, topk, topp, r, V)
        if plain:
            cs = tl.arange(0, BLOCK_C)
            cm = cs < n_chunks
            pm = tl.load(part_m + r * n_chunks + cs, mask=cm, other=float("-inf"))
            big = tl.max(pm, 0)
            offs = c * CHUNK + tl.arange(0, CHUNK)
            valid = offs < V
            if t <= 0:
                first = tl.min(tl.where(cm & (pm == big), tl.load(part_i + r * n_chunks + cs, mask=cm, other=V), V), 0)
                p = tl.where(offs == first, 1.0, 0.0)
            else:
                z = tl.sum(tl.where(cm, tl.load(part_z + r * n_chunks + cs, mask=cm, other=0.0) * tl.exp(pm - big),
                                    0.0), 0)
                v = tl.load(x + r * s_x + offs, mask=valid, other=float("-inf")).to(tl.float32)
                p = tl.where(valid, tl.exp(v / t - big), 0.0) / z
            tl.store(out + r * V + offs, p, mask=valid)
            if RACE:
                best, first = _race(p, noise + r * V, offs, valid, V)
                tl.store(race_v + r * n_chunks + c, best)
                tl.store(race_i + r * n_chunks + c, first)

    @triton.jit
    def tile(row, i, V, TILE: tl.constexpr, KEY_BITS: tl.constexpr):
        """Tile i of a row of logits: (offsets, valid, the values as float32, their order keys: int32 that order as
        the floats do, from the floats' own 16 or 32 bits; the lowest int32 past the row)."""
        offs = i * TILE + tl.arange(0, TILE)
        valid = offs < V
        raw = tl.load(row + offs, mask=valid, other=float("-inf"))
        if KEY_BITS == 16:
            b = raw.to(tl.int16, bitcast=True).to(tl.int32)
            key = tl.where(b < 0, b ^ 0x7FFF, b)
        else:
            b = raw.to(tl.int32, bitcast=True)
            key = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
        return offs, valid, raw.to(tl.float32), tl.where(valid, key, -2147483647 - 1)

    @triton.jit
    def quarters(lo, hi):
        """Three pivots that cut [lo, hi] (int64) into four parts of at most ceil(size / 4) keys."""
        step = (hi - lo + 4) // 4
        return lo + step, lo + 2 * step, lo + 3 * step

    globals().update(_tile=tile, _quarters=quarters)

    @triton.jit
    def target_probs_kernel(x, out, temp, topk, topp, noise, race_v, race_i, V, s_x, TILE: tl.constexpr,
                            N_TILES: tl.constexpr, KEY_BITS: tl.constexpr, FILTERED_ONLY: tl.constexpr = 0,
                            RACE: tl.constexpr = False, PDL: tl.constexpr = False):
        """Program r: the whole row (every row, or with FILTERED_ONLY the rows that top-k / top-p filter); with RACE
        (one tile only) the row's race result. One tile: the row stays in registers and each search halves its
        range per step (KEY_BITS steps). Several tiles: each pass streams the tiles (L1 / L2) into per-lane
        partial sums, reduced once per pass, and tests three pivots (KEY_BITS / 2 passes); the nucleus search
        reads the probabilities back from `out`."""
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        r = tl.program_id(0).to(tl.int64)
        t, k, tp, plain = _row_params(temp, topk, topp, r, V)
        tt = tl.where(t > 0, t, 1.0)
        topk_on = (t > 0) & (k > 0) & (k < V)
        topp_on = (t > 0) & (tp < 1.0)
        if plain.to(tl.int32) * FILTERED_ONLY == 0:  # FILTERED_ONLY: the chunk kernels wrote the plain rows
            row = x + r * s_x
            orow = out + r * V
            if N_TILES == 1:
                offs, valid, v, key = _tile(row, 0, V, TILE, KEY_BITS)
                if t <= 0:  # greedy: the one-hot of the first maximum
                    mx = tl.max(v, 0)
                    p = tl.where(offs == tl.min(tl.where(valid & (v == mx), offs, V), 0), 1.0, 0.0)
                else:
                    s = v / tt
                    lo = tl.min(tl.where(valid, key, 2147483647), 0).to(tl.int64)
                    khi = tl.max(key, 0).to(tl.int64)
                    if topk_on:  # the largest K with count(key >= K) >= k (lo <= K <= hi throughout)
                        hi = khi
                        for _ in range(KEY_BITS):
                            mid = lo + (hi - lo + 1) // 2  # int64: hi - lo may exceed int32
                            big = tl.sum((key >= mid.to(tl.int32)).to(tl.int32), 0) >= k
                            lo = tl.where(big, mid, lo)
                            hi = tl.where(big, hi, mid - 1)
                        s = tl.where(key >= lo.to(tl.int32), s, float("-inf"))
                    e = tl.where(valid, tl.exp(s - tl.max(s, 0)), 0.0)
                    p = e / tl.sum(e, 0)
                    if topp_on:  # the smallest key K >= lo with mass(key > K) < top_p (K = the top key is one)
                        a = lo
                        b = khi
                        for _ in range(KEY_BITS):
                            mid = a + (b - a) // 2
                            small = tl.sum(tl.where(key > mid.to(tl.int32), p, 0.0), 0) < tp
                            b = tl.where(small, mid, b)
                            a = tl.where(small, a, mid + 1)
                        edge = tl.max(tl.where(key == b.to(tl.int32), p, 0.0), 0)  # ties with K's token stay
                        p = tl.where(p >= edge, p, 0.0)
                        p = p / tl.sum(p, 0)
                tl.store(orow + offs, p, mask=valid)
                if RACE:  # only unsplit rows (V <= CHUNK): the split launch races filtering rows in chunk_race_kernel
                    best, first = _race(p, noise + r * V, offs, valid, V)
                    tl.store(race_v + r, best)
                    tl.store(race_i + r, first)
            else:
                # streamed rows are split rows that filter (the launch keeps every other row in one tile): T > 0
                # pass 1: per lane the maximum and the keys' range; then over the lanes
                lane = tl.arange(0, TILE)
                lmax = tl.full((TILE,), float("-inf"), tl.float32)
                lmin_k = lane * 0 + 2147483647
                lmax_k = lane * 0 - 2147483647 - 1
                for i in range(0, N_TILES):
                    offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                    lmax = tl.maximum(lmax, v)
                    lmin_k = tl.minimum(lmin_k, tl.where(valid, key, 2147483647))
                    lmax_k = tl.maximum(lmax_k, key)
                vmax = tl.max(lmax, 0)
                lo = tl.min(lmin_k, 0).to(tl.int64)
                khi = tl.max(lmax_k, 0).to(tl.int64)
                mx = vmax / tt  # = the maximum of s = x / T (dividing by T > 0 keeps the order)
                if topk_on:  # the largest K with count(key >= K) >= k, three pivots per pass
                    hi = khi
                    for _ in range(KEY_BITS // 2):
                        m1, m2, m3 = _quarters(lo, hi)
                        c1 = lane * 0
                        c2 = lane * 0
                        c3 = lane * 0
                        for i in range(0, N_TILES):
                            offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                            c1 += (key >= m1.to(tl.int32)).to(tl.int32)
                            c2 += (key >= m2.to(tl.int32)).to(tl.int32)
                            c3 += (key >= m3.to(tl.int32)).to(tl.int32)
                        g1 = tl.sum(c1, 0) >= k
                        g2 = tl.sum(c2, 0) >= k
                        g3 = tl.sum(c3, 0) >= k
                        new_lo = tl.where(g3, m3, tl.where(g2, m2, tl.where(g1, m1, lo)))
                        hi = tl.where(g3, hi, tl.where(g2, m3 - 1, tl.where(g1, m2 - 1, m1 - 1)))
                        lo = new_lo
                zl = tl.zeros((TILE,), tl.float32)  # the softmax's sum over the kept tokens
                for i in range(0, N_TILES):
                    offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                    zl += tl.where(key >= lo.to(tl.int32), tl.exp(v / tt - mx), 0.0)
                z = tl.sum(zl, 0)
                for i in range(0, N_TILES):  # p (top-k applied), read back by the nucleus' passes below
                    offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                    tl.store(orow + offs, tl.where(key >= lo.to(tl.int32), tl.exp(v / tt - mx) / z, 0.0),
                             mask=valid)
                if topp_on:
                    tl.debug_barrier()  # the row's stores are visible to every thread of the program
                    a = lo  # the smallest key K >= lo with mass(key > K) < top_p (b, the top key, is one)
                    b = khi
                    for _ in range(KEY_BITS // 2):
                        m1, m2, m3 = _quarters(a, b)
                        m1 = m1 - 1  # the last key of each of the first three quarters
                        m2 = m2 - 1
                        m3 = m3 - 1
                        s1 = tl.zeros((TILE,), tl.float32)
                        s2 = tl.zeros((TILE,), tl.float32)
                        s3 = tl.zeros((TILE,), tl.float32)
                        for i in range(0, N_TILES):
                            offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                            p = tl.load(orow + offs, mask=valid, other=0.0)
                            s1 += tl.where(key > m1.to(tl.int32), p, 0.0)
                            s2 += tl.where(key > m2.to(tl.int32), p, 0.0)
                            s3 += tl.where(key > m3.to(tl.int32), p, 0.0)
                        y1 = tl.sum(s1, 0) < tp
                        y2 = tl.sum(s2, 0) < tp
                        y3 = tl.sum(s3, 0) < tp
                        new_a = tl.where(y1, a, tl.where(y2, m1 + 1, tl.where(y3, m2 + 1, m3 + 1)))
                        b = tl.minimum(b, tl.where(y1, m1, tl.where(y2, m2, tl.where(y3, m3, b))))
                        a = new_a
                    el = tl.zeros((TILE,), tl.float32)  # K's probability: tokens as likely as it stay too
                    for i in range(0, N_TILES):
                        offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                        el = tl.maximum(el, tl.where(key == b.to(tl.int32),
                                                     tl.load(orow + offs, mask=valid, other=0.0), 0.0))
                    edge = tl.max(el, 0)
                    kl = tl.zeros((TILE,), tl.float32)
                    for i in range(0, N_TILES):
                        offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                        p = tl.load(orow + offs, mask=valid, other=0.0)
                        kl += tl.where(p >= edge, p, 0.0)
                    kept = tl.sum(kl, 0)
                    for i in range(0, N_TILES):
                        offs, valid, v, key = _tile(row, i, V, TILE, KEY_BITS)
                        p = tl.load(orow + offs, mask=valid, other=0.0)
                        tl.store(orow + offs, tl.where(p >= edge, p, 0.0) / kept, mask=valid)

    @triton.jit
    def chunk_race_kernel(out, noise, temp, topk, topp, race_v, race_i, V, n_chunks, CHUNK: tl.constexpr,
                          PDL: tl.constexpr = False):
        """Program (r, c) of a row that top-k / top-p filters (the whole-row kernel wrote its probabilities): the
        race's candidate of chunk c. (Racing inside the one-program whole-row kernel cost a 49,152-entry row
        +30-110 us on the H200, against ~3 us across the chip here.)"""
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        t, k, tp, plain = _row_params(temp, topk, topp, r, V)
        if plain.to(tl.int32) == 0:  # the plain rows raced in chunk_probs_kernel
            offs = c * CHUNK + tl.arange(0, CHUNK)
            valid = offs < V
            best, first = _race(tl.load(out + r * V + offs, mask=valid, other=0.0), noise + r * V, offs, valid, V)
            tl.store(race_v + r * n_chunks + c, best)
            tl.store(race_i + r * n_chunks + c, first)

    return chunk_stats_kernel, chunk_probs_kernel, target_probs_kernel, chunk_race_kernel


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor) -> torch.Tensor:
    return _launch(logits, temperature, top_k, top_p, None)[0]


def sample_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 noise: torch.Tensor, table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`target_probs` and one draw from each row: noise [N, V] float32 Exp(1) draws -> (ids [N] int64, the argmax of
    p / max(e, 1e-30), the first among equal ones, or table[it] with a [V] int64 table; probs [N, V]). The race runs
    inside the probability kernels (one candidate per chunk) and `argmax_kernel.merge_chunks` picks the row's: past
    CHUNK entries 6 launches instead of `sample(target_probs(...))`'s 8 (no clamp, division or argmax first stage;
    one chunk race for filtering rows), up to CHUNK 3 instead of 6, and no [N, V] quotient."""
    N, V = logits.shape
    assert noise.shape == (N, V) and noise.dtype == torch.float32 and noise.is_contiguous()
    probs, race_v, race_i = _launch(logits, temperature, top_k, top_p, noise)
    if N == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device), probs
    return argmax_kernel.merge_chunks(race_v, race_i, V, table), probs


def _launch(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
            noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """probs [N, V] and, with noise, the race's per-chunk candidates (values [N, C] float32, indices [N, C] int32;
    C = the number of CHUNK-entry chunks when V > CHUNK, else 1)."""
    N, V = logits.shape
    assert fits(V), f"sampling_kernel: V={V}"
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    out = torch.empty(N, V, dtype=torch.float32, device=logits.device)
    split = V > CHUNK
    n_chunks = (V + CHUNK - 1) // CHUNK if split else 1
    race = noise is not None
    race_v = torch.empty(N, n_chunks, dtype=torch.float32, device=logits.device) if race else None
    race_i = torch.empty(N, n_chunks, dtype=torch.int32, device=logits.device) if race else None
    if N == 0:
        return out, race_v, race_i
    # streamed (several tiles) only past CHUNK, where the chunk kernels take the plain and greedy rows
    TILE = pow2(V) if V <= max(ONE_TILE, CHUNK) else MAX_TILE
    warps = 16 if TILE >= 8192 else 8 if TILE >= 4096 else 4
    stats, chunk_probs, whole_row, chunk_race = _kernel()
    args = (temperature.contiguous(), top_k.contiguous(), top_p.contiguous())
    # unused pointers without the race: any tensor of the launch
    race_args = (noise, race_v, race_i) if race else (out, out, out)
    opts = launch_options(logits)
    if split:  # unfiltered rows over chunks, two kernels (the whole-row kernel then skips them)
        part_m, part_z = (torch.empty(N, n_chunks, dtype=torch.float32, device=logits.device) for _ in range(2))
        part_i = torch.empty(N, n_chunks, dtype=torch.int32, device=logits.device)
        stats[(N, n_chunks)](x, *args, part_m, part_z, part_i, V, x.stride(0), n_chunks, CHUNK=CHUNK, num_warps=4,
                             **opts)
        chunk_probs[(N, n_chunks)](x, out, *args, part_m, part_z, part_i, *race_args, V, x.stride(0), n_chunks,
                                   CHUNK=CHUNK, BLOCK_C=pow2(n_chunks, 2), RACE=race, num_warps=4, **opts)
    whole_row[(N,)](x, out, *args, *race_args, V, x.stride(0), TILE=TILE, N_TILES=(V + TILE - 1) // TILE,
                    KEY_BITS=8 * x.element_size(), FILTERED_ONLY=int(split), RACE=race and not split, num_warps=warps,
                    **opts)
    if race and split:  # the filtering rows' race, over chunks (the plain rows' ran in chunk_probs)
        chunk_race[(N, n_chunks)](out, noise, *args, race_v, race_i, V, n_chunks, CHUNK=CHUNK, num_warps=4, **opts)
    return out, race_v, race_i
