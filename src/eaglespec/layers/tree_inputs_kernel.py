"""A tree step's positions and masks in one Triton kernel each: the start of a tree's drafting (spec/draft.py
`_draft_tree_kernels`) and of its verify (engine/spec_step.py).

In PyTorch the drafting start is an addition (every level's positions and write slots), the prefix/tail index, a
gather and an or (the first level's mask) and the depth-1 lookup; the verify's start two additions (positions, write
slots) and `context.prefix_tail_mask` (the prefix, a padded tail, a gather, an or): seven and nine kernels outside
programmatic dependent launch (layers/pdl.py), ~15 and ~22 us of a one-row S6 K8 D48 step on an H100 (session 63's
trace; the kernels themselves not yet timed on a GPU).

`tree_draft_start(seq_len, top_ids, table, steps, kv_len) -> (pos_write, mask, tokens)`:
  seq_len [B] int64 (committed lengths L), top_ids [B, K] int64 draft ids, table [Vd] int64 (draft id -> target id).
  pos_write [2, S-1, B, K]: level l + 2's RoPE positions L + l (every slot) and write slots L + l K + j; mask
  [B, K, kv_len] bool: level 2's node j sees the prefix and its own scratch entry (cache position < L or = L + j);
  tokens [B, K] = table[top_ids].
`tree_verify_inputs(seq_len, depth, ancestors, kv_len) -> (positions, write, mask)`:
  depth [B, D] int64 (node depths, root 0), ancestors [B, D, D] bool (node i sees node j). positions [B, D] = L +
  depth, write [B, D] = L + i, mask [B, D, kv_len] bool = (cache position < L) or (L <= position < L + D and
  ancestors[b, i, position - L]): `prefix_tail_mask(L, ancestors, kv_len)`.
On CUDA one program per row; elsewhere (`kernel=False`, the CPU) the PyTorch operations they replace (`*_reference`).
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .context import cached_arange, masked_tail, prefix_tail_mask, tail_index
from .pdl import launch_options

CHUNK = 1024  # mask columns per inner iteration (a block of rows x CHUNK)


@functools.cache  # never evicted: captured CUDA graphs read these tensors by address
def level_offsets(K: int, steps: int, device: torch.device) -> torch.Tensor:
    """[2, S-1, 1, K]: per tree level (2..S), the offsets from L of its RoPE positions (level - 2, every slot) and of
    its write slots ((level - 2) K + j)."""
    lvl = torch.arange(steps - 1, device=device)[:, None, None]
    j = torch.arange(K, device=device)[None, None, :]
    return torch.stack((lvl.expand(steps - 1, 1, K), lvl * K + j))


def tree_draft_start_reference(seq_len: torch.Tensor, top_ids: torch.Tensor, table: torch.Tensor, steps: int,
                               kv_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, K = top_ids.shape
    W = (steps - 1) * K
    pos_write = seq_len[None, None, :, None] + level_offsets(K, steps, seq_len.device)
    index, before = tail_index(seq_len, W, kv_len)
    own = torch.zeros(K, W + 1, dtype=torch.bool, device=seq_len.device)
    own[:, :K] = torch.eye(K, dtype=torch.bool, device=seq_len.device)  # node j owns scratch entry j
    return pos_write, masked_tail(index, before, own.expand(B, K, W + 1)), table[top_ids]


def tree_verify_inputs_reference(seq_len: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                                 kv_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    D = depth.shape[1]
    write = seq_len[:, None] + cached_arange(D, seq_len.device)[None, :]
    return seq_len[:, None] + depth, write, prefix_tail_mask(seq_len, ancestors, kv_len)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def draft_start_kernel(seq_len, top_ids, table, pos_write, mask, tokens, B, K, E, KV: tl.constexpr,
                           BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
                           PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        L = tl.load(seq_len + b)
        e = tl.arange(0, BLOCK_E)[:, None]  # level - 2
        j = tl.arange(0, BLOCK_K)[None, :]
        ok = (e < E) & (j < K)
        at = (e * B + b) * K + j  # [S-1, B, K] offsets of pos_write[0] (pos_write[1] E * B * K further)
        tl.store(pos_write + at, L + e + 0 * j, mask=ok)
        tl.store(pos_write + E * B * K + at, L + e * K + j, mask=ok)
        jj = tl.arange(0, BLOCK_K)
        jm = jj < K
        tl.store(tokens + b * K + jj, tl.load(table + tl.load(top_ids + b * K + jj, mask=jm, other=0)), mask=jm)
        for k0 in range(0, KV, CHUNK):
            k = k0 + tl.arange(0, CHUNK)[None, :]
            vis = (k < L) | (k == L + jj[:, None])
            tl.store(mask + (b * K + jj[:, None]) * KV + k, vis, mask=jm[:, None] & (k < KV))

    @triton.jit
    def verify_inputs_kernel(seq_len, depth, anc, positions, write, mask, D, KV: tl.constexpr, BLOCK_D: tl.constexpr,
                             CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        L = tl.load(seq_len + b)
        t = tl.arange(0, BLOCK_D)
        tm = t < D
        tl.store(positions + b * D + t, L + tl.load(depth + b * D + t, mask=tm, other=0), mask=tm)
        tl.store(write + b * D + t, L + t, mask=tm)
        for k0 in range(0, KV, CHUNK):
            k = k0 + tl.arange(0, CHUNK)[None, :]
            tail = (k >= L) & (k < L + D)
            seen = tl.load(anc + (b * D + t[:, None]) * D + (k - L), mask=tm[:, None] & tail, other=0) != 0
            tl.store(mask + (b * D + t[:, None]) * KV + k, (k < L) | seen, mask=tm[:, None] & (k < KV))

    return draft_start_kernel, verify_inputs_kernel


def tree_draft_start(seq_len: torch.Tensor, top_ids: torch.Tensor, table: torch.Tensor, steps: int, kv_len: int,
                     kernel: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not (seq_len.is_cuda if kernel is None else kernel):
        return tree_draft_start_reference(seq_len, top_ids, table, steps, kv_len)
    B, K = top_ids.shape
    E, dev = steps - 1, seq_len.device
    assert E >= 1 and table.is_contiguous()
    pos_write = torch.empty(2, E, B, K, dtype=torch.int64, device=dev)
    mask = torch.empty(B, K, kv_len, dtype=torch.bool, device=dev)
    tokens = torch.empty(B, K, dtype=torch.int64, device=dev)
    chunk = min(CHUNK, pow2(kv_len))
    # KV constexpr: one build per length bucket
    _kernels()[0][(B,)](seq_len.contiguous(), top_ids.contiguous(), table, pos_write, mask, tokens, B, K, E,
                        KV=kv_len, BLOCK_E=pow2(E), BLOCK_K=pow2(K), CHUNK=chunk, num_warps=4,
                        **launch_options(seq_len))
    return pos_write, mask, tokens


def tree_verify_inputs(seq_len: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor, kv_len: int,
                       kernel: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not (seq_len.is_cuda if kernel is None else kernel):
        return tree_verify_inputs_reference(seq_len, depth, ancestors, kv_len)
    B, D = depth.shape
    dev = seq_len.device
    positions = torch.empty(B, D, dtype=torch.int64, device=dev)
    write = torch.empty(B, D, dtype=torch.int64, device=dev)
    mask = torch.empty(B, D, kv_len, dtype=torch.bool, device=dev)
    bd = pow2(D)
    # a block of BLOCK_D rows x chunk columns per iteration: at most 8K lanes (as the chain kernels' 8 x 1,024), so
    # that its int64 offsets stay in registers
    chunk = min(CHUNK, pow2(kv_len), max(16, (1 << 13) // bd))
    _kernels()[1][(B,)](seq_len.contiguous(), depth.contiguous(), ancestors.contiguous(), positions, write, mask, D,
                        KV=kv_len, BLOCK_D=bd, CHUNK=chunk, num_warps=4, **launch_options(seq_len))
    return positions, write, mask
