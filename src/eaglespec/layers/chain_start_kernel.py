"""The start of a greedy chain's drafting (spec/draft.py `draft_chain`) in one Triton kernel.

Before its S-1 drafter forwards a chain needs each level's position and mask and its depth-1 token in target ids. In
PyTorch that is an addition, a compare over the key length and a table lookup, three kernels outside programmatic
dependent launch (layers/pdl.py), ~6 us of a one-row chain's ~57 us drafting graph on the H200 (session 63's trace).

`chain_start(seq_len, top_ids, table, levels, kv_len, tokens) -> (positions, masks)`:
  seq_len [B] int64 (the rows' committed lengths L), top_ids [B, 1] int64 draft ids, table [Vd] int64 (draft id ->
  target id), levels = S-1 >= 1, tokens [B, S] int64 (the chain's candidates, written: column 0 = table[top_ids]).
  positions [S-1, B] = L + e (level e + 2's position and write slot), masks [S-1, B, kv_len] bool = (cache position
  <= L + e): `context.causal_mask` of those positions, level-major so that each level's [B, 1] and [B, 1, kv_len]
  slices are contiguous.
On CUDA one program per row; elsewhere (`kernel=False`, the CPU) the same operations in PyTorch
(`chain_start_reference`). Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .context import cached_arange, causal_mask
from .pdl import launch_options

CHUNK = 1024  # mask columns per inner iteration


def chain_start_reference(seq_len: torch.Tensor, top_ids: torch.Tensor, table: torch.Tensor, levels: int, kv_len: int,
                          tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    positions = seq_len[None, :] + cached_arange(levels, seq_len.device)[:, None]
    tokens[:, 0] = table[top_ids[:, 0]]
    return positions, causal_mask(positions, kv_len)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def chain_start_kernel(seq_len, top_ids, table, positions, masks, tokens, B, E, s_tok, KV: tl.constexpr,
                           BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        L = tl.load(seq_len + b)
        e = tl.arange(0, BLOCK_E)
        em = e < E
        pos = L + e
        tl.store(positions + e * B + b, pos, mask=em)
        for k0 in range(0, KV, CHUNK):
            k = k0 + tl.arange(0, CHUNK)
            vis = k[None, :] <= pos[:, None]
            tl.store(masks + (e[:, None] * B + b) * KV + k[None, :], vis, mask=em[:, None] & (k < KV)[None, :])
        tl.store(tokens + b * s_tok, tl.load(table + tl.load(top_ids + b)))

    return chain_start_kernel


def chain_start(seq_len: torch.Tensor, top_ids: torch.Tensor, table: torch.Tensor, levels: int, kv_len: int,
                tokens: torch.Tensor, kernel: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if not (seq_len.is_cuda if kernel is None else kernel):
        return chain_start_reference(seq_len, top_ids, table, levels, kv_len, tokens)
    B = seq_len.shape[0]
    assert top_ids.shape == (B, 1) and tokens.shape[0] == B and tokens.stride(1) == 1 and table.is_contiguous()
    dev = seq_len.device
    positions = torch.empty(levels, B, dtype=torch.int64, device=dev)
    masks = torch.empty(levels, B, kv_len, dtype=torch.bool, device=dev)
    # KV constexpr: one build per length bucket (the mask's columns in CHUNK blocks)
    _kernel()[(B,)](seq_len.contiguous(), top_ids.contiguous(), table, positions, masks, tokens, B, levels,
                    tokens.stride(0), KV=kv_len, BLOCK_E=pow2(levels), CHUNK=min(CHUNK, pow2(kv_len)), num_warps=4,
                    **launch_options(seq_len))
    return positions, masks
