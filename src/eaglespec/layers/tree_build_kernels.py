"""A draft tree's construction as Triton kernels (CUDA): one kernel per drafting level, one for the selection.

`spec/draft.draft_tree` and `spec/tree.build_tree` written in PyTorch launch ~13 small operators per tree level
between two drafter forwards (score sums, the vocabulary map, the frontier's top-k and four gathers, the visibility
update, the next mask) and ~20 to select and lay out the D-1 best candidates (three concatenations, a top-k, a sort,
scatters, gathers): each a CUDA-graph node of 1-3 us on the H200, about 40% of a tree's drafting phase at batch 1
(benchmarks/spec_phase_trace.py). Here each is one program per row.

`draft_level(ids, logp, f_tok, f_score, f_idx, d2t, hidden, vis, own, seq_len, cands, base, first, last, kv_len)`,
for tree level k >= 2 with K frontier slots (`spec/draft.py`'s conventions):
  ids, logp [B, K, K]: the top-K draft ids and log-probabilities at each frontier slot (the drafter's output at this
  level); f_tok [B, K] target ids, f_score [B, K] float32, f_idx [B, K] candidate ids of the frontier; d2t [Vd]:
  draft id -> target id; hidden [B, K, H]: the drafter's outputs at the frontier slots; vis [B, K, W+1] bool: each
  slot's visibility of the scratch entries (column W false); own [K, W+1] bool: the next level's own entries;
  seq_len [B]; cands = (tokens, scores, parents) [B, N] buffers in level order.
  Writes the level's K^2 children at candidate ids base + i*K + c (token d2t[ids], score f_score[i] + logp[i, c],
  parent f_idx[i]); with `first` also the K depth-1 candidates at 0..K-1 (f_tok, f_score, -1). Unless `last`, returns
  the next frontier: the K best children, best first (on equal scores the smaller candidate id), as (f_tok, f_score,
  f_idx, hidden [B, K, H] of their parents' slots, vis = the parent's row | own, and the next level's attention mask
  [B, K, kv_len] bool: cache position p is visible iff p < seq_len or vis[p - seq_len], `context.masked_tail`'s
  values).
`select_tree(cand_tokens, cand_scores, cand_parents, cand_depth, root, D) -> (tokens, parents, depth)` [B, D]: the
  D-1 best candidates (equal scores: the smaller candidate id first, a stable sort's order), laid out in candidate
  order after the root, parents as node ids (root -1, depth 0): `build_tree`'s values. Up to ONE_BLOCK_CANDIDATES
  a candidate's rank is counted against all others at once (an N x N comparison); past it each candidate gets a
  unique int64 key (its float32 score's bits made order-preserving, then BLOCK_N - 1 - id, so that equal scores put
  the smaller id first), the row's keys are sorted in registers (`tl.sort`), and the D-1 keys at or above the
  (D-1)-th largest are kept; the parents' node ids are then gathered through a scratch row (written, then read after
  the block's barrier). It serves N <= MAX_CANDIDATES. On the H100 (session 62, `benchmarks/wide_tree_check.py`) the
  tree S6 K8 D48's 328 candidates took 7.0 us a call this way against 58.6 us through PyTorch's stable sort and ~20
  small operators (counting the ranks 16 candidates at a time against the whole row instead: 24.9 us).

`fits_level(K, H, W)` and `fits_select(N)` say which shapes these kernels take. Built on first use, so that
`TRITON_INTERPRET=1` (CPU tests) takes effect; bool tensors are read and written as bytes.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

# select_tree: N = K + (S-1) K^2 candidates (S6 K8: 328; S16 K8: 968; S24 K8: 1,480; S10 K16: 2,320). Session 73
# measured trees past 1,024 (the bound until then) and K > 8 slow on PyTorch's path (docs/benchmarks.md "Session 73":
# S20 K8 D48 52% of its run drafting, S12 K10 D48 48%): the bounds since, 4,096 candidates and K <= 16.
MAX_CANDIDATES = 4096
ONE_BLOCK_CANDIDATES = 128  # up to this many, every N x N comparison at once; past it a sort of the row
MAX_LEVEL_WIDTH = 16  # draft_level: K <= 16 (K^2 <= 256 children per row)
MAX_HIDDEN = 8192


def fits_level(K: int, H: int, W: int) -> bool:
    return 2 <= K <= MAX_LEVEL_WIDTH and H <= MAX_HIDDEN and W + 1 <= 1024


def fits_select(N: int) -> bool:
    return 1 <= N <= MAX_CANDIDATES


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def draft_level_kernel(ids, logp, f_tok, f_score, f_idx, idx_bs, d2t, hidden, vis, vis_bs, own, seq_len, c_tok,
                           c_score, c_par, n_tok, n_score, n_idx, n_hidden, n_vis, n_mask, N, H, W1, KV, base,
                           K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                           BLOCK_W: tl.constexpr, BLOCK_P: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr,
                           PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0).to(tl.int64)
        pb = tl.program_id(1)  # the block of the next mask's cache positions this program writes
        head = pb == 0  # program (b, 0) also writes everything else of row b
        c = tl.arange(0, BLOCK_C)  # child i * K + j of frontier slot i
        cm = c < K * K
        slot = c // K
        score = tl.load(f_score + b * K + slot, mask=cm, other=0.0) + tl.load(logp + b * K * K + c, mask=cm,
                                                                              other=0.0)
        tok = tl.load(d2t + tl.load(ids + b * K * K + c, mask=cm, other=0), mask=cm, other=0)
        row = b * N + base
        wc = cm & head
        tl.store(c_tok + row + c, tok, mask=wc)
        tl.store(c_score + row + c, score, mask=wc)
        tl.store(c_par + row + c, tl.load(f_idx + b * idx_bs + slot, mask=cm, other=0), mask=wc)
        if FIRST:  # the depth-1 candidates 0..K-1: the frontier this level expanded
            k = tl.arange(0, BLOCK_K)
            km = (k < K) & head
            tl.store(c_tok + b * N + k, tl.load(f_tok + b * K + k, mask=km, other=0), mask=km)
            tl.store(c_score + b * N + k, tl.load(f_score + b * K + k, mask=km, other=0.0), mask=km)
            tl.store(c_par + b * N + k, tl.full([BLOCK_K], -1, tl.int64), mask=km)
        if not LAST:
            s = tl.where(cm, score, float("-inf"))
            h = tl.arange(0, BLOCK_H)
            hm = (h < H) & head
            w = tl.arange(0, BLOCK_W)
            wm = (w < W1) & head
            L = tl.load(seq_len + b)
            p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
            pm = p < KV
            rel = p - L
            tail = pm & (rel >= 0) & (rel < W1)
            for j in tl.static_range(K):
                best = tl.max(s, 0)
                pick = tl.min(tl.where(s == best, c, BLOCK_C), 0)  # the first of equal scores
                s = tl.where(c == pick, float("-inf"), s)
                parent = pick // K
                if pb == 0:
                    tl.store(n_idx + b * K + j, (base + pick).to(tl.int64))
                    tl.store(n_score + b * K + j, best)
                    tl.store(n_tok + b * K + j, tl.sum(tl.where(c == pick, tok, 0), 0))
                hv = tl.load(hidden + (b * K + parent) * H + h, mask=hm, other=0.0)
                tl.store(n_hidden + (b * K + j) * H + h, hv, mask=hm)
                vrow = (tl.load(vis + b * vis_bs + parent * W1 + w, mask=wm, other=0)
                        | tl.load(own + j * W1 + w, mask=wm, other=0))
                tl.store(n_vis + (b * K + j) * W1 + w, vrow, mask=wm)
                v = tl.load(vis + b * vis_bs + parent * W1 + rel, mask=tail, other=0) | tl.load(own + j * W1 + rel,
                                                                                             mask=tail, other=0)
                tl.store(n_mask + (b * K + j) * KV + p, ((rel < 0) | (v != 0)).to(tl.int8), mask=pm)

    @triton.jit
    def select_tree_kernel(c_tok, c_score, c_par, c_depth, depth_stride, root, tok_out, par_out, dep_out, node, N,
                           D, BLOCK_N: tl.constexpr, WIDE: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK_N)
        cm = c < N
        s = tl.load(c_score + b * N + c, mask=cm, other=float("-inf"))
        # padding: -inf at ids >= N, after every candidate in either order below
        if WIDE:  # the D-1 largest of unique keys (score's order-preserving bits, then the id reversed): sorted
            bits = tl.where(s == 0.0, 0.0, s).to(tl.int32, bitcast=True)  # -0.0 as 0.0: equal, as sort has them
            key = ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32) | (BLOCK_N - 1 - c).to(tl.int64)
            thr = tl.sum(tl.where(c == D - 2, tl.sort(key, descending=True), 0), axis=0)  # the (D-1)-th largest
            sel = (key >= thr) & cm & (D > 1)
        else:  # rank[c] = how many candidates come before c: a higher score, or an equal one and a smaller id
            ahead = (s[None, :] > s[:, None]) | ((s[None, :] == s[:, None]) & (c[None, :] < c[:, None]))
            rank = tl.sum(ahead.to(tl.int32), axis=1)
            sel = (rank < D - 1) & cm
        pos = tl.cumsum(sel.to(tl.int32), axis=0)  # node id of a kept candidate: 1 + kept ones before it
        par = tl.load(c_par + b * N + c, mask=cm, other=-1)
        if WIDE:  # the parent's node id through memory: node[b, c] = pos, then a gather after the block's barrier
            tl.store(node + b * N + c, pos, mask=cm)
            tl.debug_barrier()
            ppos = tl.load(node + b * N + tl.maximum(par, 0), mask=sel & (par >= 0), other=0)
        else:
            ppos = tl.sum(tl.where(c[None, :] == par[:, None], pos[None, :], 0), axis=1)  # the parent's node id
        out = b * D + pos
        tl.store(tok_out + out, tl.load(c_tok + b * N + c, mask=cm, other=0), mask=sel)
        tl.store(par_out + out, tl.where(par >= 0, ppos, 0).to(tl.int64), mask=sel)
        tl.store(dep_out + out, tl.load(c_depth + b * depth_stride + c, mask=cm, other=0), mask=sel)
        tl.store(tok_out + b * D, tl.load(root + b))
        tl.store(par_out + b * D, tl.full([], -1, tl.int64))
        tl.store(dep_out + b * D, tl.full([], 0, tl.int64))

    return draft_level_kernel, select_tree_kernel


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int8) if t.dtype == torch.bool else t


def _rows_of(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(t, its batch stride) when each row is contiguous (an expanded constant has batch stride 0: not copied),
    else a contiguous copy."""
    inner = t[0]
    if inner.is_contiguous():
        return t, t.stride(0)
    t = t.contiguous()
    return t, t.stride(0)


def draft_level(ids: torch.Tensor, logp: torch.Tensor, f_tok: torch.Tensor, f_score: torch.Tensor,
                f_idx: torch.Tensor, d2t: torch.Tensor, hidden: torch.Tensor, vis: torch.Tensor, own: torch.Tensor,
                seq_len: torch.Tensor, cands: tuple[torch.Tensor, torch.Tensor, torch.Tensor], base: int,
                first: bool, last: bool, kv_len: int) -> tuple[torch.Tensor, ...] | None:
    """See the module docstring; returns (f_tok, f_score, f_idx, hidden, vis, mask) of the next level, or None for
    the last level."""
    B, K = f_tok.shape
    H = hidden.shape[-1]
    W1 = vis.shape[-1]
    assert fits_level(K, H, W1 - 1), f"draft_level: K={K} H={H} W={W1 - 1}"
    c_tok, c_score, c_par = cands
    dev = f_tok.device
    if last:
        n_tok = n_score = n_idx = n_hidden = n_vis = n_mask = c_tok  # unused
    else:
        n_tok = torch.empty(B, K, dtype=torch.int64, device=dev)
        n_score = torch.empty(B, K, dtype=torch.float32, device=dev)
        n_idx = torch.empty(B, K, dtype=torch.int64, device=dev)
        n_hidden = torch.empty(B, K, H, dtype=hidden.dtype, device=dev)
        n_vis = torch.empty(B, K, W1, dtype=torch.bool, device=dev)
        n_mask = torch.empty(B, K, kv_len, dtype=torch.bool, device=dev)
    import triton

    BLOCK_P = 512
    grid = (B, 1 if last else triton.cdiv(kv_len, BLOCK_P))
    f_idx, idx_bs = _rows_of(f_idx)  # the first level's frontier and visibility are expanded constants
    vis, vis_bs = _rows_of(vis)
    _kernels()[0][grid](ids.contiguous(), logp.contiguous(), f_tok.contiguous(), f_score.contiguous(), f_idx,
                        idx_bs, d2t, hidden.contiguous(), _bytes(vis), vis_bs, _bytes(own.contiguous()),
                        seq_len.contiguous(), c_tok, c_score, c_par, n_tok, n_score, n_idx, n_hidden, _bytes(n_vis),
                        _bytes(n_mask), c_tok.shape[1], H, W1, kv_len, base, K=K, BLOCK_C=pow2(K * K, 2),
                        BLOCK_K=pow2(K, 2), BLOCK_H=pow2(H, 2), BLOCK_W=pow2(W1, 2), BLOCK_P=BLOCK_P, FIRST=first,
                        LAST=last, num_warps=4, **launch_options(f_tok))
    return None if last else (n_tok, n_score, n_idx, n_hidden, n_vis, n_mask)


def select_tree(cand_tokens: torch.Tensor, cand_scores: torch.Tensor, cand_parents: torch.Tensor,
                cand_depth: torch.Tensor, root: torch.Tensor,
                D: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, N = cand_tokens.shape
    assert fits_select(N) and 1 <= D <= N + 1, f"select_tree: N={N} D={D}"
    dev = cand_tokens.device
    tok, par, dep = (torch.empty(B, D, dtype=torch.int64, device=dev) for _ in range(3))
    BN = pow2(N, 16)
    wide = N > ONE_BLOCK_CANDIDATES
    node = torch.empty(B, N if wide else 0, dtype=torch.int32, device=dev)  # each candidate's node id (wide only)
    cd = cand_depth if cand_depth.stride(-1) == 1 else cand_depth.contiguous()  # [B, N], often expanded (stride 0)
    _kernels()[1][(B,)](cand_tokens.contiguous(), cand_scores.contiguous(), cand_parents.contiguous(), cd,
                        cd.stride(0), root.contiguous(), tok, par, dep, node, N, D, BLOCK_N=BN, WIDE=wide,
                        num_warps=4 if BN <= 64 else 8, **launch_options(cand_tokens))
    return tok, par, dep
