"""MLA's absorbed attention over the latent cache as two Triton kernels, for steps of few query tokens (decode,
verify, drafting) on CUDA.

The eager absorbed path (`MLAttention._absorbed`) reads the layer's cache prefix into a [B, K, r + rope] copy in the
model dtype and runs SDPA with one shared KV head of r + rope = 576 dims for H = 64 query heads (DeepSeek-V3,
Kimi-K2.5): on an H100 a one-token step of the Kimi-K2.5 slice spent ~140 us a layer there (copies and casts, three
elementwise kernels of 21-28 us, SDPA's two float32 GEMVs of 17-20 us; session 56, `benchmarks/step_trace.py OUT
kimi-k2.5-slice`), where the latent cache of a few hundred positions is well under a MB.

`mla_attention(q_lat, q_pe, cache, rows, mask, scale) -> o_lat`:
  q_lat [B, T, H, R] (the queries with W_UK folded in: q_nope . k_nope == q_lat . c), q_pe [B, T, H, P] (RoPE
  applied; both in any layout whose last dim is contiguous: einsum's q_lat of a verify step is head-major, and a copy
  would cost a launch), cache [Bc, S, R + P] (one layer's latent cache, this forward's entries written: the
  normalised latent c, then the rope'd shared key k_pe), rows [B] int64 cache rows, mask [B, T, K] bool over cache
  positions [0, K) (K <= S), scale float.
  o_lat [B, T, H, R] in q_lat's dtype: for each query row, the softmax over its visible positions of
  (q_lat . c + q_pe . k_pe) * scale, times c. Rows that see nothing give 0 (SDPA gives NaN; the engine never reads
  them). Usable when `fits(T, H, R, P, dtype, device)`: R and P powers of two >= 16, T <= MAX_QUERY_TOKENS, the
  cache in q's dtype, a block of positions within the device's shared memory (`block_kv`).
Kernel 1, program (b * QT + query tile, split): a tile of the T * H query rows (row r = t * H + h) against its
  splits' blocks of BLOCK_KV positions, flash attention's online softmax; a block no row of the tile sees is skipped
  after the mask's load (rows much shorter than their graph's length bucket read only their own prefix). One load of
  a block's latents [BLOCK_KV, R] serves both products (scores and output). Writes float32 partials (row max m, sum
  l, unnormalised output o).
Kernel 2, program b * T * H + query row: the log-sum-exp merge of the splits, in q's dtype.
Splits: enough programs to fill the chip (TARGET_PROGRAMS), each of at least MIN_SPLIT_BLOCKS blocks (a power of
  two of them), at most MAX_SPLITS, so that a one-token step over a long context is spread over the SMs while a short
  one stays one split, and eager steps (whose length grows by one a step) build the kernels once per doubling.
Probabilities enter the output product in the cache dtype (as flash attention kernels do); float32 multiplies in IEEE
float32 (no TF32). Measured (session 56, H100, the Kimi-K2.5 slice with random bf16 weights, CUDA graphs): a decode
step 2.56 -> 2.23 ms, a 4-token verify 4.00 -> 3.71; an 8-token verify 5.66 -> 5.75 (its 512 query rows are 32 tiles,
each reading every block). The tile (`query_tile`): every program of a tile reads its split's blocks, so many query
rows over a long cache want larger tiles, which cost more a program; by the work T * H * K, 16 rows (4 warps) up to
600K, 32 (8 warps) up to 2M, 64 past it, the best of each of session 59's cells on an H100 (T 1-48, K 256-4,096;
an 8-token verify over 4,096 positions 77 -> 49 us).
Both kernels launch with programmatic dependent launch where the device has it (layers/pdl.py), waiting first: every
input is written by an earlier kernel of the step. Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes
effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .norm_linear_dot_kernel import shared_limit
from .pdl import interpreted, launch_options

MAX_QUERY_TOKENS = 64  # T: a tree verify of up to 64 tokens; longer steps keep the eager path (SDPA)
# (T * H * K up to which, query rows a program, num_warps): the tiles by a step's work (`query_tile`); 16 is tl.dot's
# least M (an H = 64 decode step is 4 tiles)
QUERY_TILES: tuple[tuple[int | None, int, int], ...] = ((600_000, 16, 4), (2_000_000, 32, 8), (None, 64, 8))
BLOCK_Q: int | None = None  # set: every step takes this tile (benchmarks/mla_kernel_check.py's A/B), WARPS warps
WARPS: int | None = None
TARGET_PROGRAMS = 132  # programs kernel 1 aims for (an H100's SMs); splits = TARGET / (B * tiles), >= 1
MIN_SPLIT_BLOCKS = 4  # blocks a split takes at least: fewer, longer splits where the chip is already full
MAX_SPLITS = 64  # the combine's loop over splits is unrolled


def fits(T: int, H: int, R: int, P: int, dtype: torch.dtype, device: torch.device | None = None) -> bool:
    """Whether `mla_attention` takes a step of T query tokens, H heads, latent rank R and rope dim P in dtype (on
    `device`: whose shared memory holds a block, `block_kv`)."""
    pow2_ok = all(d >= 16 and d & (d - 1) == 0 for d in (R, P))
    return (pow2_ok and 1 <= T <= MAX_QUERY_TOKENS and H >= 1
            and dtype in (torch.bfloat16, torch.float16, torch.float32)
            and (device is None or block_kv(R, P, dtype.itemsize, shared_limit(device)) is not None))


def query_tile(T: int, H: int, K: int) -> tuple[int, int]:
    """(query rows a program, num_warps) for a step of T tokens of H heads over K positions (`QUERY_TILES`)."""
    if BLOCK_Q is not None:
        return BLOCK_Q, WARPS or 4
    return next((bq, warps) for bound, bq, warps in QUERY_TILES if bound is None or T * H * K <= bound)


def block_kv(R: int, P: int, itemsize: int, limit: int | None, block_q: int = QUERY_TILES[0][1]) -> int | None:
    """Cached positions a block takes: 64 (bf16) or 32 (float32: as many bytes), halved while an estimate of the
    split kernel's shared memory exceeds `limit` (None: no limit, the interpreter), None below 16 (tl.dot's least).
    The estimate counts the query tile of `block_q` rows, the block's latents twice (one layout per product), its rope
    keys and the probabilities: 157,696 bytes for DeepSeek-V3's R = 512, P = 64 in bf16 at 64 with 16 query rows,
    within an H100's 232,448 where it was measured; a GPU of ~100 KB takes 32."""
    bkv = 64 if itemsize <= 2 else 32
    while limit is not None and bkv >= 16 and (block_q * R + 2 * bkv * R + bkv * P + block_q * bkv) * itemsize > limit:
        bkv //= 2
    return bkv if bkv >= 16 else None


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def split_kernel(ql, qp, cache, rows, mask, m_part, l_part, o_part, TH, H, K, QT, NSPLIT, s_lb, s_lt, s_lh,
                     s_pb, s_pt, s_ph, s_cr, s_cp, s_mb, s_mt, scale, NB_PER: tl.constexpr, R: tl.constexpr,
                     P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, IEEE: tl.constexpr,
                     UPCAST: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: the queries, the cache entries and the mask come from this step's kernels
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        sp = tl.program_id(1)
        b = pid // QT
        rq = (pid % QT) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # query rows r = t * H + h
        qv = rq < TH
        t = rq // H
        dr = tl.arange(0, R)
        dp = tl.arange(0, P)
        tq = t.to(tl.int64)
        hq = (rq % H).to(tl.int64)
        lrow = b.to(tl.int64) * s_lb + tq * s_lt + hq * s_lh  # q_lat in any layout: einsum's of a verify is head-major
        prow = b.to(tl.int64) * s_pb + tq * s_pt + hq * s_ph
        qlat = tl.load(ql + lrow[:, None] + dr[None, :], mask=qv[:, None], other=0.0)  # [BQ, R]
        qpe = tl.load(qp + prow[:, None] + dp[None, :], mask=qv[:, None], other=0.0)  # [BQ, P]
        if UPCAST:  # the interpreter's tl.dot misreads bf16 (NumPy has none)
            qlat = qlat.to(tl.float32)
            qpe = qpe.to(tl.float32)
        crow = cache + tl.load(rows + b).to(tl.int64) * s_cr
        m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
        acc = tl.zeros([BLOCK_Q, R], dtype=tl.float32)
        for i in range(NB_PER):  # the split's blocks (past K in the last split: pv all false, so skipped)
            pos = (sp * NB_PER + i) * BLOCK_KV + tl.arange(0, BLOCK_KV)
            pv = pos < K
            vis = tl.load(mask + b * s_mb + t[:, None] * s_mt + pos[None, :], mask=qv[:, None] & pv[None, :],
                          other=0) != 0  # [BQ, BKV]
            if tl.max(vis.to(tl.int32)) > 0:  # a block no row of the tile sees is not read
                ent = crow + pos.to(tl.int64)[:, None] * s_cp
                c = tl.load(ent + dr[None, :], mask=pv[:, None], other=0.0)  # [BKV, R] latents: keys and values
                kpe = tl.load(ent + R + dp[None, :], mask=pv[:, None], other=0.0)  # [BKV, P]
                if UPCAST:
                    c = c.to(tl.float32)
                    kpe = kpe.to(tl.float32)
                if IEEE:
                    s = tl.dot(qlat, tl.trans(c), input_precision="ieee")
                    s = tl.dot(qpe, tl.trans(kpe), s, input_precision="ieee")
                else:
                    s = tl.dot(qlat, tl.trans(c))
                    s = tl.dot(qpe, tl.trans(kpe), s)
                s = tl.where(vis, s * scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m_i - m_safe)  # 0 while m_i is -inf
                p = tl.exp(s - m_safe[:, None])  # 0 where hidden
                l_i = l_i * alpha + tl.sum(p, 1)
                if IEEE:
                    acc = tl.dot(p.to(c.dtype), c, acc * alpha[:, None], input_precision="ieee")
                else:
                    acc = tl.dot(p.to(c.dtype), c, acc * alpha[:, None])
                m_i = m_new
        part = (b * NSPLIT + sp).to(tl.int64) * TH + rq
        tl.store(m_part + part, m_i, mask=qv)
        tl.store(l_part + part, l_i, mask=qv)
        tl.store(o_part + part[:, None] * R + dr[None, :], acc, mask=qv[:, None])

    @triton.jit
    def combine_kernel(m_part, l_part, o_part, out, TH, NSPLIT, R: tl.constexpr, SP: tl.constexpr,
                       PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: the partials come from the kernel before
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)  # b * TH + query row
        b = pid // TH
        r = pid % TH
        sp = tl.arange(0, SP)
        part = (b * NSPLIT + sp).to(tl.int64) * TH + r
        ms = tl.load(m_part + part, mask=sp < NSPLIT, other=float("-inf"))
        ls = tl.load(l_part + part, mask=sp < NSPLIT, other=0.0)
        top = tl.max(ms, 0)
        top = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp(ms - top)  # 0 for splits that saw nothing
        total = tl.sum(w * ls, 0)
        dr = tl.arange(0, R)
        o = tl.zeros([R], dtype=tl.float32)
        for s in tl.static_range(SP):  # SP >= NSPLIT, a power of two (Triton 3.6's interpreter takes no loop
            ps = (b * NSPLIT + s).to(tl.int64) * TH + r  # bound that is an argument)
            live = s < NSPLIT
            ms_s = tl.load(m_part + ps, mask=live, other=float("-inf"))
            o += tl.load(o_part + ps * R + dr, mask=live & (dr < R), other=0.0) * tl.exp(ms_s - top)
        o = tl.where(total > 0, o / tl.where(total > 0, total, 1.0), 0.0)
        tl.store(out + pid.to(tl.int64) * R + dr, o.to(out.dtype.element_ty))

    return split_kernel, combine_kernel


def plan(B: int, T: int, H: int, K: int, bkv: int, block_q: int) -> tuple[int, int, int, int]:
    """(query tiles, blocks, blocks a split takes, splits) for a step of B rows of T tokens over K positions in
    blocks of bkv, tiles of block_q query rows."""
    qt = -(-T * H // block_q)
    nb = max(1, -(-K // bkv))
    splits = max(1, min(-(-nb // MIN_SPLIT_BLOCKS), -(-TARGET_PROGRAMS // max(1, B * qt)), MAX_SPLITS))
    per = pow2(-(-nb // splits))  # a power of two: few builds of the split kernel as eager steps' lengths grow
    return qt, nb, per, -(-nb // per)


def mla_attention(q_lat: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor, rows: torch.Tensor,
                  mask: torch.Tensor, scale: float) -> torch.Tensor:
    B, T, H, R = q_lat.shape
    P = q_pe.shape[-1]
    K = mask.shape[-1]
    assert fits(T, H, R, P, q_lat.dtype) and cache.shape[-1] == R + P and K <= cache.shape[1], "mla_attention: shape"
    assert cache.dtype == q_lat.dtype == q_pe.dtype and cache.stride(-1) == 1, "mla_attention: the cache's dtype"
    assert q_lat.stride(-1) == 1 and q_pe.stride(-1) == 1, "mla_attention: each query's features contiguous"
    mask = mask.contiguous()
    limit = shared_limit(q_lat.device)
    bq, warps = query_tile(T, H, K)
    bkv = block_kv(R, P, q_lat.element_size(), limit, bq)
    if bkv is None:  # a larger tile past the device's shared memory: the least one, which `fits` checked
        (_, bq, warps) = QUERY_TILES[0]
        bkv = block_kv(R, P, q_lat.element_size(), limit, bq)
    assert bkv is not None, "mla_attention: a block does not fit the device's shared memory (see fits)"
    qt, _, per, nsplit = plan(B, T, H, K, bkv, bq)
    TH = T * H
    dev = q_lat.device
    m_part = torch.empty(B * nsplit * TH, dtype=torch.float32, device=dev)
    l_part = torch.empty_like(m_part)
    o_part = torch.empty(B * nsplit * TH, R, dtype=torch.float32, device=dev)
    out = torch.empty(B, T, H, R, dtype=q_lat.dtype, device=dev)
    if B == 0:
        return out
    split, combine = _kernels()
    split[(B * qt, nsplit)](q_lat, q_pe, cache, rows, mask, m_part, l_part, o_part, TH, H, K, qt, nsplit,
                            *q_lat.stride()[:3], *q_pe.stride()[:3], cache.stride(0), cache.stride(1),
                            mask.stride(0), mask.stride(1), float(scale),
                            NB_PER=per, R=R, P=P, BLOCK_Q=bq, BLOCK_KV=bkv,
                            IEEE=q_lat.dtype == torch.float32, UPCAST=interpreted() and q_lat.dtype != torch.float32,
                            num_warps=warps, **launch_options(q_lat))
    # NB_PER and SP constexpr powers of two: a build per doubling of a step's length, not per length
    combine[(B * TH,)](m_part, l_part, o_part, out, TH, nsplit, R=R, SP=pow2(nsplit, 2), num_warps=4,
                       **launch_options(q_lat))
    return out
