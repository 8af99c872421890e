"""Speculative sampling's acceptance down a chain in two Triton kernels (CUDA): `spec/verify.py`'s sampled-chain rule
after the target's distributions and the random draws.

The PyTorch rule runs ~12 operators per draft depth and a bonus draw over the whole vocabulary per depth: on the
H200 a one-row sampled verify of a chain of 3 spent 204 us in ~88 elementwise kernels around the target's forward
(docs/benchmarks.md, "Session 20"). Here the acceptance is a few scalar loads per row, repeated by every program of
the row, and the bonus one pass over the vocabulary split into chunks:

1. program (b, c): walks row b's chain (below) to its accepted length m, then over chunk c of the vocabulary
   computes the residual res = max(q_m - r_m, 0) (r_m = 0 when every draft was accepted), its sum, the first index
   of the largest res / e and the first index of the largest q_m / e;
2. program b: merges its chunks. The bonus is the residual's pick, or q_m's when the residual is all zero (q_m ==
   r_m exactly: a rejection then had probability 0); it writes m, the path and the committed tokens.

`accept_sampled_chain(probs, draft_probs, draft_index, tokens, u, e, S1) -> (accept_len, path, committed, bonus)`:
  probs [B, D, V] float32 (the target's processed distribution q_i at node i), draft_probs [B, D-1, Vd] float32 (r_i:
  the distribution node i+1's token was drawn from), draft_index [V] int64 (target id -> draft id, -1 outside the
  draft vocabulary) or None (Vd == V, the same ids), tokens [B, D] int64 (node i's token; node 0 the root), u [B,
  D-1] float32 uniforms in [0, 1), e [B, V] float32 Exp(1) draws (> 0), S1 = S + 1 >= D. Node i+1's token x is
  accepted when u_i * r_i(x) < q_i(x) (probability min(1, q/r)) and every node before it was; m = the accepted count;
  bonus = argmax(res / e) over the first rejection's residual (the exponential race: a draw from res renormalised),
  or over q_{D-1} when all were accepted. Outputs are `spec/verify.VerifyResult`'s fields for a chain: accept_len
  [B] (= best), path [B, S1] = min(j, m), committed [B, S1] = the accepted tokens, then the bonus as padding, bonus
  [B]. Given the same u and e the values equal `spec/verify.verify_sampled_chain_rule`'s exactly (ties: the first
  index, torch.argmax's rule).
`fits(V, D)`: V <= MAX_VOCAB and 2 <= D <= MAX_NODES. Built on first use, so that `TRITON_INTERPRET=1` (CPU tests)
takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

CHUNK = 4096  # vocabulary entries per stage-1 program (12 for SmolLM2's 49,152)
MAX_VOCAB = 1 << 22
MAX_NODES = 64  # chain nodes walked per program (the walk is unrolled: one build per D)


def fits(V: int, D: int) -> bool:
    return 1 <= V <= MAX_VOCAB and 2 <= D <= MAX_NODES


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def chunk_kernel(probs, dprobs, dindex, tokens, u, e, acc_len, part_rv, part_ri, part_rs, part_qv, part_qi,
                     V, Vd, n_chunks, D: tl.constexpr, HAS_INDEX: tl.constexpr, CHUNK: tl.constexpr,
                     PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1)
        # the walk: node i+1 (token x, drawn from r_i) is accepted at node i iff u_i * r_i(x) < q_i(x)
        m = tl.zeros([], tl.int64)
        alive = tl.full([], 1, tl.int1)
        for i in tl.static_range(D - 1):
            x = tl.load(tokens + b * D + i + 1)
            qx = tl.load(probs + (b * D + i) * V + x)
            if HAS_INDEX:
                dx = tl.load(dindex + x)
            else:
                dx = x
            rx = tl.load(dprobs + (b * (D - 1) + i) * Vd + tl.maximum(dx, 0))
            rx = tl.where(dx >= 0, rx, 0.0)
            alive = alive & (tl.load(u + b * (D - 1) + i) * rx < qx)
            m += alive.to(tl.int64)
        rej = m < D - 1  # a rejection at node m: the bonus comes from max(q_m - r_m, 0)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        ok = offs < V
        q = tl.load(probs + (b * D + m) * V + offs, mask=ok, other=0.0)
        if HAS_INDEX:
            di = tl.load(dindex + offs, mask=ok, other=-1)
        else:
            di = offs.to(tl.int64)
        mr = tl.minimum(m, D - 2)  # r_m exists only below the last node
        r = tl.load(dprobs + (b * (D - 1) + mr) * Vd + tl.maximum(di, 0), mask=ok & (di >= 0) & rej, other=0.0)
        res = tl.maximum(q - r, 0.0)
        ek = tl.maximum(tl.load(e + b * V + offs, mask=ok, other=1.0), 1e-30)
        rv = tl.where(ok, res / ek, -1.0)  # padding below every real ratio (>= 0)
        qv = tl.where(ok, q / ek, -1.0)
        best_r = tl.max(rv, 0)
        best_q = tl.max(qv, 0)
        base = b * n_chunks + c
        tl.store(part_rv + base, best_r)
        tl.store(part_ri + base, tl.min(tl.where(rv == best_r, offs, V), 0))
        tl.store(part_rs + base, tl.sum(res, 0))
        tl.store(part_qv + base, best_q)
        tl.store(part_qi + base, tl.min(tl.where(qv == best_q, offs, V), 0))
        if c == 0:
            tl.store(acc_len + b, m)

    @triton.jit
    def row_kernel(tokens, acc_len, part_rv, part_ri, part_rs, part_qv, part_qi, path, committed, bonus_out,
                   V, n_chunks, D: tl.constexpr, S1, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr,
                   PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        ok = offs < n_chunks
        base = b * n_chunks + offs
        rv = tl.load(part_rv + base, mask=ok, other=-2.0)
        ri = tl.load(part_ri + base, mask=ok, other=V)
        qv = tl.load(part_qv + base, mask=ok, other=-2.0)
        qi = tl.load(part_qi + base, mask=ok, other=V)
        total = tl.sum(tl.load(part_rs + base, mask=ok, other=0.0), 0)
        pick_r = tl.min(tl.where(rv == tl.max(rv, 0), ri, V), 0)
        pick_q = tl.min(tl.where(qv == tl.max(qv, 0), qi, V), 0)
        bonus = tl.where(total > 0, pick_r, pick_q).to(tl.int64)
        m = tl.load(acc_len + b)
        tl.store(bonus_out + b, bonus)
        j = tl.arange(0, BLOCK_S)
        js = j < S1
        tl.store(path + b * S1 + j, tl.minimum(j, m), mask=js)
        drafted = tl.load(tokens + b * D + j + 1, mask=js & (j < m), other=0)
        tl.store(committed + b * S1 + j, tl.where(j < m, drafted, bonus), mask=js)

    return chunk_kernel, row_kernel


def accept_sampled_chain(probs: torch.Tensor, draft_probs: torch.Tensor, draft_index: torch.Tensor | None,
                         tokens: torch.Tensor, u: torch.Tensor, e: torch.Tensor,
                         S1: int) -> tuple[torch.Tensor, ...]:
    B, D, V = probs.shape
    Vd = draft_probs.shape[-1]
    assert fits(V, D) and D <= S1, f"accept_sampled_chain: V={V}, D={D}, S+1={S1}"
    assert draft_probs.shape == (B, D - 1, Vd) and (draft_index is not None or Vd == V)
    assert probs.dtype == draft_probs.dtype == u.dtype == e.dtype == torch.float32
    assert draft_index is None or (draft_index.shape == (V,) and draft_index.dtype == torch.int64)
    dev = probs.device
    n_chunks = (V + CHUNK - 1) // CHUNK
    part_rv, part_rs, part_qv = (torch.empty(B, n_chunks, dtype=torch.float32, device=dev) for _ in range(3))
    part_ri, part_qi = (torch.empty(B, n_chunks, dtype=torch.int32, device=dev) for _ in range(2))
    m, bonus = (torch.empty(B, dtype=torch.int64, device=dev) for _ in range(2))
    path, committed = (torch.empty(B, S1, dtype=torch.int64, device=dev) for _ in range(2))
    chunk, row = _kernels()
    tokens = tokens.contiguous()
    dindex = draft_index if draft_index is not None else tokens  # unread without HAS_INDEX
    chunk[(B, n_chunks)](probs.contiguous(), draft_probs.contiguous(), dindex, tokens, u.contiguous(),
                         e.contiguous(), m, part_rv, part_ri, part_rs, part_qv, part_qi, V, Vd, n_chunks, D=D,
                         HAS_INDEX=draft_index is not None, CHUNK=CHUNK, num_warps=4, **launch_options(probs))
    row[(B,)](tokens, m, part_rv, part_ri, part_rs, part_qv, part_qi, path, committed, bonus, V, n_chunks, D=D,
              S1=S1, BLOCK=pow2(n_chunks, 16), BLOCK_S=pow2(S1, 2), num_warps=1, **launch_options(probs))
    return m, path, committed, bonus
