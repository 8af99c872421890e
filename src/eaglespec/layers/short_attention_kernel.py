"""Attention of a few query tokens over the KV cache in two Triton kernels (split-K, then a combine), for the decode,
verify and drafter steps of small batches; and of prompts of up to 512 tokens in a third (below).

On the H200 PyTorch's SDPA picks cuDNN for these: 6.9 us per layer for one decode token at a few hundred cached
positions (the largest kernel of a SmolLM2 decode step), and for several query tokens (verify, drafter catch-up) a
kernel that also puts a memset node per layer into the step's CUDA graph. Here every (row, kv head, BLOCK_KV cached
positions) is its own program, so a short query is spread over the whole chip, and no node but kernels is captured.

`short_attention(q, k_cache, v_cache, rows, mask, scale, sinks=None, softcap=None) -> out`:
  q [B, T, H, D] (RoPE applied), k_cache / v_cache [Bc, S, Hkv, D] (one layer's, with this forward's keys written;
  finite everywhere: the engine's caches start as zeros), rows [B] int64 cache rows, mask [B, T, K] bool over cache
  positions [0, K) (K <= S), scale (None: D ** -0.5).
  out [B, T, H, D] in q's dtype: for query head h, kv head h // (H / Hkv) (GQA), softmax over the visible positions
  (and, with `sinks` [H], gpt-oss's sink logit of the head, which takes its share and gives no value; `softcap`,
  Gemma 2's, caps the scaled scores as cap * tanh(s / cap) first: `attention.sdpa_written_out`'s terms).
  Usable when `fits(B, T, H, Hkv, D, dtype)`: T * H / Hkv <= MAX_QUERY_ROWS or T <= MAX_PROMPT_TOKENS (prompts:
  below; float32 steps only up to FLOAT32_MAX_QUERY_ROWS query rows), B <= MAX_BATCH (any B for T = 1), D a power
  of two >= 16.
Kernel 1, program ((b * Hkv + kv head) * NQ + query tile, split): the G = H / Hkv query heads of that kv head times
the T tokens (query row r = t * G + g, padded to BLOCK_Q >= 16 for tl.dot; one tile unless a one-row step has more
than MAX_QUERY_ROWS query rows, which go in tiles of that many) against positions [split * BLOCK_KV, + BLOCK_KV):
scores, mask, the block's row max m, sum l and unnormalised output o in float32 scratch. In steps of SKIP_MIN_ROWS
rows or more a block no query sees is skipped (m = -inf) after the mask's load (continuous batches hold rows much
shorter than their length bucket); one-row steps read the block's keys and values beside the mask instead, one
memory round trip fewer (hidden scores are -inf, and 0 x a finite value is 0). A single split (K <= BLOCK_KV) writes
the output itself. Kernel 2, program (b * Hkv + kv head) * NQ + query tile: the log-sum-exp merge of the splits, its
loop unrolled up to UNROLL_MAX_SPLITS (every split's loads issued at once; merging in the last split program to
finish instead, through an arrival counter, was right but no faster on the H200: docs/benchmarks.md, "Session 15").
Blocks of 128 positions and the unrolled merge made a SmolLM2 layer's attention 8-35% cheaper than blocks of 64 at
512-2,048 cached positions (`benchmarks/attention_split_check.py`, session 25); programs that took several blocks
each lost. Probabilities enter the PV product in the cache dtype, as flash attention kernels do. Rows whose mask is
all false give 0 (SDPA gives NaN; the engine never reads those). Built on first use, so that `TRITON_INTERPRET=1`
(CPU tests) takes effect.

Prompts (T * G > MAX_QUERY_ROWS, ONE_ROW_MAX_QUERY_ROWS in one-row steps; T <= MAX_PROMPT_TOKENS): one kernel,
program (b * Hkv + kv head, query tile) holds BLOCK_Q = 64 query rows and runs over the cached positions in blocks
of PROMPT_BLOCK_KV with an online softmax (flash attention's loop), skipping blocks its rows do not see (causal
prompts: the blocks past the tile). On the H200 an admission's prefill graph spent ~20 us per layer in SDPA's cuDNN
kernel, its memset and three elementwise kernels around it (the mask as a bias, copies): 45% of a 64-token prefill
(`benchmarks/prefill_trace.py`, session 16).
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

MAX_QUERY_ROWS = 64  # T * (H / Hkv): SmolLM2 (G = 3) up to 21 query tokens, Llama-8B (G = 4) up to 16
# one-row steps of up to this many query rows take the split kernels in tiles of MAX_QUERY_ROWS (a one-row tree's
# verify: S6 K8 D48 is 144 rows for SmolLM2); past it, and in steps of several rows past MAX_QUERY_ROWS, the prompt
# kernel. On the H100 (session 62, `benchmarks/spec_phase_trace.py`, random weights, ~180 cached positions) the prompt
# kernel's 9 programs took 12.3 us a layer of that 48-token verify, against 4.6 + 1.7 us for a 16-token one's split
# and combine.
ONE_ROW_MAX_QUERY_ROWS = 256
MAX_PROMPT_TOKENS = 512  # longer prompts keep SDPA (flash / cuDNN kernels tuned for long sequences)
MAX_BATCH = 32  # measured on the H200 (step_kernels_check --only=batches): a SmolLM2 S3 K1 D4 step of 16 / 32 rows
#               1.59 -> 1.31 / 1.77 -> 1.37 ms against SDPA past 8 rows; 8 rows unchanged (docs/benchmarks.md, session 11)
# One query token (decode, a chain's drafter levels) takes the kernel at any batch size: its block skipping reads each
# row's own prefix where SDPA reads every row's whole length bucket. Regenerating ShareGPT answers with SmolLM2 on the
# H200 at 1,024 rows (session 40, benchmarks/regen_profile.py): a decode step of ~900 rows 7.04 -> 4.99 ms, 64-256
# rows 2.01 -> 1.70 ms (medians); per layer at 1,024 rows of 16-1,024 positions 181 us against SDPA's 576, the same
# error against float32 (benchmarks/decode_rows_check.py).
BLOCK_KV = 128  # cached positions per split program (64 until session 25: attention_split_check.py, H200)
# Two one-row variants measured slower and removed (session 63, benchmarks/spec_phase_trace.py, random SmolLM2 weights,
# docs/benchmarks.md): one split of 256 positions instead of two and the combine (every decode step's first length
# bucket without the combine kernel): decode graph 0.424 -> 0.462 ms on the H200; and the split programs loading the
# cache written by earlier steps before the programmatic-launch wait: decode 0.431 -> 0.449 ms on an H100.
PROMPT_BLOCK_KV = 64  # positions per step of the prompt kernel's loop (its tiles hold 64 query rows)
SKIP_MIN_ROWS = 2  # steps of this many rows or more read a block's keys and values only if a query sees it
UNROLL_MAX_SPLITS = 16  # the combine's loop over splits is unrolled up to this many splits
# the kernels' shared jit helpers, bound here by `_kernels()` (see there)
_block_scores = _pv_product = _online_block = _merge_split = _query_tile = _store_output = None


# float32 steps of more query rows (T * G) than this go to SDPA; None: float32 as bf16 (tests under Triton's
# interpreter set it so, to run the kernels through an engine). In float32 the kernels multiply with IEEE float32 FMAs
# (no tensor cores), and tiles past 16 query rows spill: on the H200 (session 37) the prompt kernel made a float32
# tree S6 K8 D48, whose 48-token verify is 144 query rows, run at 156 tok/s against 536 through SDPA (MT-bench 1-10,
# `benchmarks/float32_tree_probe.sh`, FLOAT32_DOT off in both; plain decoding, whose prefills took it, 1,102 -> 1,180
# tok/s), and the split kernel spent 180 us per call on that tree's 8-token drafter steps (24 query rows, 32-row tiles)
# against 15 us on a decode step's 3 (`benchmarks/float32_step_trace.py`, random weights). bf16 is unaffected; a float32
# chain (at most 12 query rows) keeps the kernels.
FLOAT32_MAX_QUERY_ROWS: int | None = 16


def fits(B: int, T: int, H: int, Hkv: int, D: int, dtype: torch.dtype | None = None) -> bool:
    """Whether `short_attention` takes a step of this shape and q dtype (None: any dtype; float32 only up to
    FLOAT32_MAX_QUERY_ROWS query rows)."""
    if dtype == torch.float32 and FLOAT32_MAX_QUERY_ROWS is not None and T * (H // Hkv) > FLOAT32_MAX_QUERY_ROWS:
        return False
    return ((B <= MAX_BATCH or T == 1) and (T * (H // Hkv) <= MAX_QUERY_ROWS or T <= MAX_PROMPT_TOKENS)
            and D >= 16 and D & (D - 1) == 0 and H % Hkv == 0)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def block_scores(qv, k, v, row, pos, pv, vis, kvh, d, s_kr, s_kp, s_kh, scale, cap, IEEE: tl.constexpr,
                     CAP: tl.constexpr):
        """One block of cached positions for a query tile: (scores [BLOCK_Q, BLOCK_KV], scaled (CAP: soft-capped,
        cap * tanh(s / cap)), -inf where hidden; the block's values [BLOCK_KV, D])."""
        kv_off = row * s_kr + pos[:, None] * s_kp + kvh * s_kh + d[None, :]
        kk = tl.load(k + kv_off, mask=pv[:, None], other=0.0)
        vv = tl.load(v + kv_off, mask=pv[:, None], other=0.0)
        if IEEE:
            s = tl.dot(qv, tl.trans(kk), input_precision="ieee")
        else:
            s = tl.dot(qv, tl.trans(kk))
        s = s * scale
        if CAP:  # tanh(x) = 1 - 2 / (exp(2x) + 1): +-1 where exp saturates
            s = cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))
        return tl.where(vis, s, float("-inf")), vv

    @triton.jit
    def pv_product(p, vv, IEEE: tl.constexpr):
        """p [BLOCK_Q, BLOCK_KV] float32 @ vv [BLOCK_KV, D], the probabilities in the cache dtype."""
        if IEEE:
            return tl.dot(p.to(vv.dtype), vv, input_precision="ieee")
        return tl.dot(p.to(vv.dtype), vv)

    # the kernels below call the helpers as module globals: Triton 3.6's interpreter resolves a jit function's
    # callees among its module's globals only, not in this builder's scope
    globals().update(_block_scores=block_scores, _pv_product=pv_product)

    @triton.jit
    def query_tile(q, rows, b, kvh, r, d, T, G, s_qb, s_qt, s_qh):
        """Query rows r = t * G + g of row b's kv head kvh: (t, g, r's validity t < T, b's cache row, the queries
        [BLOCK_Q, D], zero past T)."""
        t = r // G
        g = r % G
        rv = t < T
        qv = tl.load(q + b * s_qb + t[:, None] * s_qt + (kvh * G + g)[:, None] * s_qh + d[None, :],
                     mask=rv[:, None], other=0.0)
        return t, g, rv, tl.load(rows + b), qv

    @triton.jit
    def online_block(qv, k, v, row, pos, pv, vis, kvh, d, s_kr, s_kp, s_kh, scale, cap, m_i, l_i, acc,
                     IEEE: tl.constexpr, CAP: tl.constexpr):
        """Flash attention's online-softmax update of (row max m_i, sum l_i, unnormalised output acc) by one block of
        cached positions."""
        s, vv = _block_scores(qv, k, v, row, pos, pv, vis, kvh, d, s_kr, s_kp, s_kh, scale, cap, IEEE, CAP)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)  # 0 while nothing was seen (m_i = -inf)
        p = tl.exp(s - m_safe[:, None])  # exp(-inf) = 0 where hidden
        return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + _pv_product(p, vv, IEEE)

    @triton.jit
    def store_output(out, acc, l, m, sinks, b, t, g, valid, kvh, G, d, s_ob, s_ot, s_oh, SINKS: tl.constexpr):
        """The normalised output acc / l of query rows (t, g) into out[b, t, kvh * G + g, :] where valid (l = 0:
        a row that saw nothing stores 0). SINKS: each head's sink logit joins the denominator, exp(sink - m) beside
        the scores' sum l (relative to their max m), and no value."""
        if SINKS:
            sk = tl.load(sinks + kvh * G + g, mask=valid, other=0.0).to(tl.float32)
            l = tl.where(m == float("-inf"), l, l + tl.exp(sk - m))
        res = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(out + b * s_ob + t[:, None] * s_ot + (kvh * G + g)[:, None] * s_oh + d[None, :],
                 res.to(out.dtype.element_ty), mask=valid[:, None])

    globals().update(_online_block=online_block, _query_tile=query_tile, _store_output=store_output)

    @triton.jit
    def split_kernel(q, k, v, rows, mask, o_part, m_part, l_part, out, sinks, T, G, HKV, K, NSPLIT, NQ,
                     s_qb, s_qt, s_qh, s_kr, s_kp, s_kh, s_mb, s_mt, s_ob, s_ot, s_oh, scale, cap,
                     BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr,
                     SKIP: tl.constexpr, DIRECT: tl.constexpr, CAP: tl.constexpr, SINKS: tl.constexpr,
                     PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)  # (b * HKV + kv head) * NQ + query tile
        sp = tl.program_id(1)
        b = pid // (HKV * NQ)
        kvh = (pid // NQ) % HKV
        ri = tl.arange(0, BLOCK_Q)  # the tile's rows, as the partial results index them
        r = (pid % NQ) * BLOCK_Q + ri  # query row r = t * G + g
        d = tl.arange(0, D)
        t, g, rv, row, qv = _query_tile(q, rows, b, kvh, r, d, T, G, s_qb, s_qt, s_qh)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, D], tl.float32)
        pos = sp * BLOCK_KV + tl.arange(0, BLOCK_KV)
        pv = pos < K
        vis = tl.load(mask + b * s_mb + t[:, None] * s_mt + pos[None, :], mask=rv[:, None] & pv[None, :], other=0) != 0
        if SKIP:  # the block's keys and values are read only if a query sees it (after the mask's load)
            if tl.max(vis.to(tl.int32)) > 0:
                m_i, l_i, acc = _online_block(qv, k, v, row, pos, pv, vis, kvh, d, s_kr, s_kp, s_kh, scale, cap,
                                              m_i, l_i, acc, IEEE, CAP)
        else:  # read at once, beside the mask (hidden scores are -inf, and the cache holds finite values only)
            m_i, l_i, acc = _online_block(qv, k, v, row, pos, pv, vis, kvh, d, s_kr, s_kp, s_kh, scale, cap,
                                          m_i, l_i, acc, IEEE, CAP)
        if DIRECT:  # one split: this program's result is the output
            _store_output(out, acc, l_i, m_i, sinks, b, t, g, rv, kvh, G, d, s_ob, s_ot, s_oh, SINKS)
        else:
            base = pid * NSPLIT + sp
            tl.store(o_part + (base * BLOCK_Q + ri[:, None]) * D + d[None, :], acc)
            tl.store(m_part + base * BLOCK_Q + ri, m_i)
            tl.store(l_part + base * BLOCK_Q + ri, l_i)

    @triton.jit
    def merge_split(o_part, m_part, l_part, base, r, d, mx, tot, acc, BLOCK_Q: tl.constexpr, D: tl.constexpr):
        """Online log-sum-exp merge of split `base`'s (m, l, o) into (mx, tot, acc)."""
        m = tl.load(m_part + base * BLOCK_Q + r)
        seen = m != float("-inf")
        o = tl.load(o_part + (base * BLOCK_Q + r[:, None]) * D + d[None, :], mask=seen[:, None], other=0.0)
        m_new = tl.maximum(mx, m)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(mx - m_safe)
        w = tl.where(seen, tl.exp(m - m_safe), 0.0)
        tot = tot * alpha + w * tl.load(l_part + base * BLOCK_Q + r)
        return m_new, tot, acc * alpha[:, None] + w[:, None] * o

    globals().update(_merge_split=merge_split)

    @triton.jit
    def combine_kernel(o_part, m_part, l_part, out, sinks, T, G, HKV, NQ, s_ob, s_ot, s_oh, NSPLIT: tl.constexpr,
                       BLOCK_Q: tl.constexpr, D: tl.constexpr, UNROLL: tl.constexpr, SINKS: tl.constexpr,
                       PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)  # (b * HKV + kv head) * NQ + query tile, as in split_kernel
        b = pid // (HKV * NQ)
        kvh = (pid // NQ) % HKV
        ri = tl.arange(0, BLOCK_Q)
        r = (pid % NQ) * BLOCK_Q + ri
        t = r // G
        g = r % G
        d = tl.arange(0, D)
        mx = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        tot = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, D], tl.float32)
        if UNROLL:  # every split's loads issued up front
            for sp in tl.static_range(NSPLIT):
                mx, tot, acc = _merge_split(o_part, m_part, l_part, pid * NSPLIT + sp, ri, d, mx, tot, acc,
                                            BLOCK_Q, D)
        else:
            for sp in range(0, NSPLIT):
                mx, tot, acc = _merge_split(o_part, m_part, l_part, pid * NSPLIT + sp, ri, d, mx, tot, acc,
                                            BLOCK_Q, D)
        _store_output(out, acc, tot, mx, sinks, b, t, g, t < T, kvh, G, d, s_ob, s_ot, s_oh, SINKS)

    @triton.jit
    def prompt_kernel(q, k, v, rows, mask, out, sinks, T, G, HKV, K, NQ,
                      s_qb, s_qt, s_qh, s_kr, s_kp, s_kh, s_mb, s_mt, s_ob, s_ot, s_oh, scale, cap,
                      BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr,
                      CAP: tl.constexpr, SINKS: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        b = pid // (HKV * NQ)
        kvh = (pid // NQ) % HKV
        r = (pid % NQ) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # query row r = t * G + g
        d = tl.arange(0, D)
        t, g, rv, row, qv = _query_tile(q, rows, b, kvh, r, d, T, G, s_qb, s_qt, s_qh)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, D], tl.float32)
        start = 0
        while start < K:  # (a `for` over a runtime bound fails in Triton 3.6's interpreter)
            pos = start + tl.arange(0, BLOCK_KV)
            start += BLOCK_KV
            pv = pos < K
            vis = tl.load(mask + b * s_mb + t[:, None] * s_mt + pos[None, :], mask=rv[:, None] & pv[None, :],
                          other=0) != 0
            if tl.max(vis.to(tl.int32)) > 0:  # a block no row of the tile sees is skipped
                m_i, l_i, acc = _online_block(qv, k, v, row, pos, pv, vis, kvh, d, s_kr, s_kp, s_kh, scale, cap,
                                              m_i, l_i, acc, IEEE, CAP)
        _store_output(out, acc, l_i, m_i, sinks, b, t, g, rv, kvh, G, d, s_ob, s_ot, s_oh, SINKS)

    return split_kernel, combine_kernel, prompt_kernel


def short_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
                    mask: torch.Tensor, scale: float | None = None, sinks: torch.Tensor | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    B, T, H, D = q.shape
    Hkv = k_cache.shape[2]
    G, K = H // Hkv, mask.shape[-1]
    assert fits(B, T, H, Hkv, D) and k_cache.shape[-1] == D and K <= k_cache.shape[1], "short_attention: shape"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    assert k_cache.dtype == v_cache.dtype == q.dtype, "short_attention: the cache holds q's dtype"
    mask = mask.contiguous()
    dev = q.device
    scale = D ** -0.5 if scale is None else scale
    # sinks [H] (gpt-oss) and the soft cap (Gemma 2), as `attention.sdpa_written_out` applies them
    extra = dict(CAP=softcap is not None, SINKS=sinks is not None)
    cap = float(softcap) if softcap is not None else 1.0
    if T * G > (ONE_ROW_MAX_QUERY_ROWS if B == 1 else MAX_QUERY_ROWS):  # a prompt: tiles of 64 rows, each looping
        out = torch.empty(B, T, H, D, dtype=q.dtype, device=dev)
        nq = (T * G + MAX_QUERY_ROWS - 1) // MAX_QUERY_ROWS
        _kernels()[2][(B * Hkv * nq,)](
            q, k_cache, v_cache, rows, mask, out, sinks if sinks is not None else out, T, G, Hkv, K, nq,
            q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            mask.stride(0), mask.stride(1), out.stride(0), out.stride(1), out.stride(2), scale, cap,
            BLOCK_Q=MAX_QUERY_ROWS, BLOCK_KV=PROMPT_BLOCK_KV, D=D, IEEE=q.dtype == torch.float32, **extra,
            **launch_options(q))
        return out
    bq = pow2(min(T * G, MAX_QUERY_ROWS), 16)
    nq = (T * G + bq - 1) // bq  # query tiles (several only in one-row steps past MAX_QUERY_ROWS query rows)
    nsplit = (K + BLOCK_KV - 1) // BLOCK_KV
    out = torch.empty(B, T, H, D, dtype=q.dtype, device=dev)
    direct = nsplit == 1
    parts = 0 if direct else B * Hkv * nq * nsplit
    o_part = torch.empty(parts, bq, D, dtype=torch.float32, device=dev)
    m_part = torch.empty(parts, bq, dtype=torch.float32, device=dev)
    l_part = torch.empty(parts, bq, dtype=torch.float32, device=dev)
    split, combine, _ = _kernels()
    split[(B * Hkv * nq, nsplit)](
        q, k_cache, v_cache, rows, mask, o_part, m_part, l_part, out, sinks if sinks is not None else out,
        T, G, Hkv, K, nsplit, nq, q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), mask.stride(0), mask.stride(1), out.stride(0), out.stride(1), out.stride(2),
        scale, cap, BLOCK_Q=bq, BLOCK_KV=BLOCK_KV, D=D, IEEE=q.dtype == torch.float32,
        SKIP=B >= SKIP_MIN_ROWS, DIRECT=direct, num_warps=4, **extra, **launch_options(q))
    if not direct:
        combine[(B * Hkv * nq,)](o_part, m_part, l_part, out, sinks if sinks is not None else out, T, G, Hkv, nq,
                                 out.stride(0), out.stride(1), out.stride(2), NSPLIT=nsplit, BLOCK_Q=bq, D=D,
                                 UNROLL=nsplit <= UNROLL_MAX_SPLITS, SINKS=sinks is not None,
                                 **launch_options(q))  # NSPLIT constexpr: one build per length bucket
    return out

