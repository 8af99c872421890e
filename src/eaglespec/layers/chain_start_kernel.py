"""A chain step's positions and causal masks in one Triton kernel: the start of a greedy chain's drafting
(spec/draft.py `draft_chain`) and of its verify (engine/spec_step.py).

Both need, per row of committed length L, T consecutive positions L + t and the causal mask over the cache of each
(`context.causal_mask`); the drafting also its depth-1 token in target ids. In PyTorch that is an addition, a compare
over the key length (and a table lookup), kernels outside programmatic dependent launch (layers/pdl.py): ~6 us of a
one-row chain's ~57 us drafting graph on the H200, ~5 us at its verify's start on an H100 (session 63's traces).

`chain_start(seq_len, top_ids, table, levels, kv_len, tokens) -> (positions, masks)`:
  seq_len [B] int64 (the rows' committed lengths L), top_ids [B, 1] int64 draft ids, table [Vd] int64 (draft id ->
  target id), levels = S-1 >= 1, tokens [B, S] int64 (the chain's candidates, written: column 0 = table[top_ids]).
  positions [S-1, B] = L + e (level e + 2's position and write slot), masks [S-1, B, kv_len] bool = (cache position
  <= L + e), level-major so that each level's [B, 1] and [B, 1, kv_len] slices are contiguous.
`causal_rows(seq_len, T, kv_len, level_major=False) -> (positions, mask)`: positions [B, T] = L + t, mask
  [B, T, kv_len] = (cache position <= L + t): a chain's verify of T tokens (positions = write slots), a catch-up over
  T committed pairs, and (level_major: [T, B] and [T, B, kv_len]) the levels of a chain drafted without the kernel's
  depth-1 lookup (sampled or guided).
On CUDA one program per row; elsewhere (`kernel=False`, the CPU) the same operations in PyTorch (`*_reference`).
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
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
    tokens[:, 0] = table[top_ids[:, 0]]
    return causal_rows_reference(seq_len, levels, kv_len, level_major=True)


def causal_rows_reference(seq_len: torch.Tensor, T: int, kv_len: int,
                          level_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    t = cached_arange(T, seq_len.device)
    positions = seq_len[None, :] + t[:, None] if level_major else seq_len[:, None] + t[None, :]
    return positions, causal_mask(positions, kv_len)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def chain_positions_kernel(seq_len, top_ids, table, positions, masks, tokens, E, s_pe, s_pb, s_me, s_mb, s_tok,
                               KV: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, TOKEN: tl.constexpr,
                               PDL: tl.constexpr = False):
        """Program b: positions[e, b] (at e * s_pe + b * s_pb) = L + e for e < E, their masks' rows (at e * s_me +
        b * s_mb), and with TOKEN tokens[b, 0] = table[top_ids[b]]."""
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        b = tl.program_id(0)
        L = tl.load(seq_len + b)
        e = tl.arange(0, BLOCK_E)
        em = e < E
        pos = L + e
        tl.store(positions + e * s_pe + b * s_pb, pos, mask=em)
        for k0 in range(0, KV, CHUNK):
            k = k0 + tl.arange(0, CHUNK)
            vis = k[None, :] <= pos[:, None]
            tl.store(masks + e[:, None] * s_me + b * s_mb + k[None, :], vis, mask=em[:, None] & (k < KV)[None, :])
        if TOKEN:
            tl.store(tokens + b * s_tok, tl.load(table + tl.load(top_ids + b)))

    return chain_positions_kernel


def _launch(seq_len: torch.Tensor, E: int, kv_len: int, level_major: bool, token: tuple | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions and masks of E consecutive positions per row, [E, B] / [E, B, kv_len] (level_major) or [B, E] /
    [B, E, kv_len]; token = (top_ids, table, tokens) also writes the depth-1 token."""
    B, dev = seq_len.shape[0], seq_len.device
    shape = (E, B) if level_major else (B, E)
    positions = torch.empty(shape, dtype=torch.int64, device=dev)
    masks = torch.empty(*shape, kv_len, dtype=torch.bool, device=dev)
    s_pe, s_pb = (B, 1) if level_major else (1, E)
    s_me, s_mb = (B * kv_len, kv_len) if level_major else (kv_len, E * kv_len)
    top_ids, table, tokens = token if token is not None else (seq_len, seq_len, seq_len)
    # KV constexpr: one build per length bucket (the mask's columns in CHUNK blocks)
    _kernel()[(B,)](seq_len.contiguous(), top_ids.contiguous(), table, positions, masks, tokens, E, s_pe, s_pb, s_me,
                    s_mb, tokens.stride(0), KV=kv_len, BLOCK_E=pow2(E), CHUNK=min(CHUNK, pow2(kv_len)),
                    TOKEN=token is not None, num_warps=4, **launch_options(seq_len))
    return positions, masks


def chain_start(seq_len: torch.Tensor, top_ids: torch.Tensor, table: torch.Tensor, levels: int, kv_len: int,
                tokens: torch.Tensor, kernel: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if not (seq_len.is_cuda if kernel is None else kernel):
        return chain_start_reference(seq_len, top_ids, table, levels, kv_len, tokens)
    B = seq_len.shape[0]
    assert top_ids.shape == (B, 1) and tokens.shape[0] == B and tokens.stride(1) == 1 and table.is_contiguous()
    return _launch(seq_len, levels, kv_len, True, (top_ids, table, tokens))


def causal_rows(seq_len: torch.Tensor, T: int, kv_len: int, level_major: bool = False,
                kernel: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if not (seq_len.is_cuda if kernel is None else kernel):
        return causal_rows_reference(seq_len, T, kv_len, level_major)
    return _launch(seq_len, T, kv_len, level_major)
