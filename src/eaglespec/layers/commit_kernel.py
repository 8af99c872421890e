"""A speculative step's row bookkeeping in two Triton kernels: the commit's advance, and storing the drafter's state.

After a verify the commit advances every row (its committed length and last token) and runs the drafter's catch-up
over the row's T = S+1 new (token, aux state) pairs at positions L..L+T-1, of which the first accept+1 are real; after
any catch-up (commit, prefill, a plain step's) the runner stores the drafter's state per row. In PyTorch these are
about ten small kernels per step (additions, a compare, `where`, row copies), none of which takes part in
programmatic dependent launch (layers/pdl.py), so each pays its whole launch inside the graph: on the H200 a one-row
chain's commit graph spent ~28 us of its 68 in them (docs/benchmarks.md, "Session 15").

`advance_rows(seq_len, last_token, active, rows, accept, bonus, T, kv_len) -> (positions, mask, last)`:
  seq_len, last_token [R] int64 and active [R] bool are the runner's per-row state (updated in place), rows [B] int64
  the cache rows of the step's rows, accept [B] int64 accepted drafts, bonus [B] int64 the token after them. With
  L = seq_len[rows[b]]: positions [B, T] = L + t, mask [B, T, kv_len] bool = (cache position <= L + t) (tokens
  appended in order: `context.causal_mask`), last [B, 1] = accept (the catch-up's last real pair); then
  seq_len[rows[b]] = L + accept + 1 where active, else L, and last_token[rows[b]] = bonus.
`advance_decode(seq_len, last_token, active, rows, tokens)`: a decode step's advance, seq_len[rows[b]] += 1 where
  active and last_token[rows[b]] = tokens[b] (PyTorch's add, `where` and two row copies: ~7 us of a one-row decode
  graph on the H200).
`store_draft_rows(rows, top_ids, top_logp, hidden, logits, d_top_ids, d_top_logp, d_hidden, d_logits)`:
  d_top_ids[rows[b]] = top_ids[b] ([B, K] int64), d_top_logp[rows[b]] = top_logp[b] ([B, K] float32, when given),
  d_hidden[rows[b]] = hidden[b] ([B, H]), d_logits[rows[b]] = logits[b] ([B, Vd], when given), each cast to the
  destination's dtype as a copy would.
Both run the Triton kernel on CUDA (`kernel=None`; True / False force it) and the same operations in PyTorch
elsewhere (`*_reference`). Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .chain_start_kernel import causal_rows_reference
from .pdl import launch_options

CHUNK = 1024  # mask columns / logits per inner iteration


def advance_rows_reference(seq_len: torch.Tensor, last_token: torch.Tensor, active: torch.Tensor, rows: torch.Tensor,
                           accept: torch.Tensor, bonus: torch.Tensor, T: int,
                           kv_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    L = seq_len[rows]
    positions, mask = causal_rows_reference(L, T, kv_len)
    seq_len[rows] = torch.where(active[rows], L + accept + 1, L)
    last_token[rows] = bonus
    return positions, mask, accept[:, None]


def advance_decode_reference(seq_len: torch.Tensor, last_token: torch.Tensor, active: torch.Tensor, rows: torch.Tensor,
                             tokens: torch.Tensor) -> None:
    L = seq_len[rows]
    seq_len[rows] = torch.where(active[rows], L + 1, L)
    last_token[rows] = tokens


def store_draft_rows_reference(rows: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor | None,
                               hidden: torch.Tensor, logits: torch.Tensor | None, d_top_ids: torch.Tensor,
                               d_top_logp: torch.Tensor | None, d_hidden: torch.Tensor,
                               d_logits: torch.Tensor | None) -> None:
    d_top_ids[rows] = top_ids
    if top_logp is not None:
        d_top_logp[rows] = top_logp
    d_hidden[rows] = hidden.to(d_hidden.dtype)
    if logits is not None:
        d_logits[rows] = logits.to(d_logits.dtype)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def advance_kernel(seq_len, last_token, active, rows, accept, bonus, positions, mask, last, T,
                       KV: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        row = tl.load(rows + b)
        L = tl.load(seq_len + row)
        t = tl.arange(0, BLOCK_T)
        tm = t < T
        pos = L + t
        tl.store(positions + b * T + t, pos, mask=tm)
        a = tl.load(accept + b)
        tl.store(last + b, a)
        for k0 in range(0, KV, CHUNK):
            k = k0 + tl.arange(0, CHUNK)
            vis = k[None, :] <= pos[:, None]
            tl.store(mask + (b * T + t[:, None]) * KV + k[None, :], vis, mask=tm[:, None] & (k < KV)[None, :])
        act = tl.load(active + row)
        tl.store(seq_len + row, tl.where(act, L + a + 1, L))
        tl.store(last_token + row, tl.load(bonus + b))

    @triton.jit
    def store_kernel(rows, ids, logp, hid, logits, d_ids, d_logp, d_hid, d_logits, s_ids, s_logp, s_hid, s_logits,
                     K, H, V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, CHUNK: tl.constexpr,
                     HAS_LOGP: tl.constexpr, HAS_LOGITS: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        row = tl.load(rows + b).to(tl.int64)
        kk = tl.arange(0, BLOCK_K)
        km = kk < K
        tl.store(d_ids + row * K + kk, tl.load(ids + b * s_ids + kk, mask=km), mask=km)
        if HAS_LOGP:
            tl.store(d_logp + row * K + kk, tl.load(logp + b * s_logp + kk, mask=km), mask=km)
        hh = tl.arange(0, BLOCK_H)
        hm = hh < H
        hv = tl.load(hid + b * s_hid + hh, mask=hm)
        tl.store(d_hid + row * H + hh, hv.to(d_hid.dtype.element_ty), mask=hm)
        if HAS_LOGITS:
            for v0 in range(0, V, CHUNK):
                v = v0 + tl.arange(0, CHUNK)
                vm = v < V
                x = tl.load(logits + b * s_logits + v, mask=vm)
                tl.store(d_logits + row * V + v, x.to(d_logits.dtype.element_ty), mask=vm)

    @triton.jit
    def decode_advance_kernel(seq_len, last_token, active, rows, tokens, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        row = tl.load(rows + b)
        L = tl.load(seq_len + row)
        tl.store(seq_len + row, tl.where(tl.load(active + row), L + 1, L))
        tl.store(last_token + row, tl.load(tokens + b))

    return advance_kernel, store_kernel, decode_advance_kernel


def advance_rows(seq_len: torch.Tensor, last_token: torch.Tensor, active: torch.Tensor, rows: torch.Tensor,
                 accept: torch.Tensor, bonus: torch.Tensor, T: int, kv_len: int,
                 kernel: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not (seq_len.is_cuda if kernel is None else kernel):
        return advance_rows_reference(seq_len, last_token, active, rows, accept, bonus, T, kv_len)
    B = rows.shape[0]
    assert seq_len.is_contiguous() and last_token.is_contiguous() and active.is_contiguous()
    dev = seq_len.device
    positions = torch.empty(B, T, dtype=torch.int64, device=dev)
    mask = torch.empty(B, T, kv_len, dtype=torch.bool, device=dev)
    last = torch.empty(B, 1, dtype=torch.int64, device=dev)
    # KV constexpr: one build per length bucket (the mask's columns in CHUNK blocks)
    _kernels()[0][(B,)](seq_len, last_token, active, rows.contiguous(), accept.contiguous(), bonus.contiguous(),
                        positions, mask, last, T, KV=kv_len, BLOCK_T=pow2(T), CHUNK=min(CHUNK, pow2(kv_len)),
                        num_warps=4, **launch_options(seq_len))
    return positions, mask, last


def advance_decode(seq_len: torch.Tensor, last_token: torch.Tensor, active: torch.Tensor, rows: torch.Tensor,
                   tokens: torch.Tensor, kernel: bool | None = None) -> None:
    if not (seq_len.is_cuda if kernel is None else kernel):
        return advance_decode_reference(seq_len, last_token, active, rows, tokens)
    assert seq_len.is_contiguous() and last_token.is_contiguous() and active.is_contiguous()
    _kernels()[2][(rows.shape[0],)](seq_len, last_token, active, rows.contiguous(), tokens.contiguous(), num_warps=1,
                                    **launch_options(seq_len))


def store_draft_rows(rows: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor | None, hidden: torch.Tensor,
                     logits: torch.Tensor | None, d_top_ids: torch.Tensor, d_top_logp: torch.Tensor | None,
                     d_hidden: torch.Tensor, d_logits: torch.Tensor | None, kernel: bool | None = None) -> None:
    if not (hidden.is_cuda if kernel is None else kernel):
        return store_draft_rows_reference(rows, top_ids, top_logp, hidden, logits, d_top_ids, d_top_logp, d_hidden,
                                          d_logits)
    B, K = top_ids.shape
    H = hidden.shape[-1]
    V = logits.shape[-1] if logits is not None else 1
    assert d_top_ids.shape[1] == K and d_hidden.shape[1] == H and d_top_ids.is_contiguous() and d_hidden.is_contiguous()
    assert top_ids.stride(-1) == 1 and hidden.stride(-1) == 1 and (logits is None or logits.stride(-1) == 1)
    assert top_logp is None or (top_logp.stride(-1) == 1 and d_top_logp is not None and d_top_logp.is_contiguous())
    assert logits is None or (d_logits is not None and d_logits.shape[1] == V and d_logits.is_contiguous())
    _kernels()[1][(B,)](rows.contiguous(), top_ids, top_logp if top_logp is not None else top_ids, hidden,
                        logits if logits is not None else hidden, d_top_ids,
                        d_top_logp if top_logp is not None else d_top_ids, d_hidden,
                        d_logits if logits is not None else d_hidden, top_ids.stride(0),
                        top_logp.stride(0) if top_logp is not None else 0, hidden.stride(0),
                        logits.stride(0) if logits is not None else 0, K, H, V=V, BLOCK_K=pow2(K), BLOCK_H=pow2(H),
                        CHUNK=min(CHUNK, pow2(V)), HAS_LOGP=top_logp is not None, HAS_LOGITS=logits is not None,
                        num_warps=4, **launch_options(hidden))
