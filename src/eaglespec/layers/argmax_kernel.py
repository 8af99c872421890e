"""The argmax of a few rows of logits in two short Triton kernels: greedy decoding's token choice on CUDA.

PyTorch's argmax over one row reduces it in a single thread block: on the H200 it took 34.5 us per decode step for
a Llama-3.1-8B vocabulary (128,256 entries, 0.7% of the step) and 13.2 us for SmolLM2's 49,152
(`benchmarks/decode_profile.py`, 2026-11-30), while the chip has 132 SMs. Here the row is split into chunks:

1. program (r, c) reads chunk c of row r (CHUNK entries) and writes its maximum and the first index holding it;
2. program r reads row r's chunk results and keeps the largest value, and among chunks holding it the first index.

`argmax_rows(x, table=None) -> ids`: x [..., V] (any float dtype, last dim contiguous or not) -> ids [...] int64, the
index of the largest value of each row, the smallest such index when several are equal: torch.argmax's rule, so
greedy tokens are the same bit for bit (values are compared in float32, exact for bf16 / fp16 / fp32 inputs). Rows
holding NaN may differ from torch.argmax (which returns a NaN's index); a model that emits NaN has failed anyway.
With `table` ([V] int64) stage 2 writes table[index] instead: a drafter's draft-vocabulary argmax mapped to target
ids without a lookup kernel of its own; with `out` ([...] int64, any stride) it writes there (no copy after).
`merge_chunks(part_v, part_i, V, table, out)` runs stage 2 alone on chunk results another kernel wrote (the sampling
race of `sampling_kernel.sample_probs`).
`fits(V)`: V <= MAX_VOCAB (stage 2 holds one row's chunk results in one block).
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

CHUNK = 4096  # entries per stage-1 program (32 programs for a 128K-entry row, 3 for a 12K draft vocabulary)
MAX_VOCAB = 1 << 22


def fits(V: int) -> bool:
    return 1 <= V <= MAX_VOCAB


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def chunk_max_kernel(x, part_v, part_i, V, s_x, n_chunks, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        r = tl.program_id(0)
        c = tl.program_id(1)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(x + r * s_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        best = tl.max(v, 0)
        idx = tl.min(tl.where(v == best, offs, V), 0)  # the first index holding the maximum
        tl.store(part_v + r * n_chunks + c, best)
        tl.store(part_i + r * n_chunks + c, idx)

    @triton.jit
    def row_max_kernel(part_v, part_i, ids, table, V, n_chunks, s_ids, BLOCK: tl.constexpr, HAS_TABLE: tl.constexpr,
                       PDL: tl.constexpr = False):
        if PDL:  # layers/pdl.py: nothing here is a weight, so wait for the kernel before at once
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        r = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        m = offs < n_chunks
        v = tl.load(part_v + r * n_chunks + offs, mask=m, other=float("-inf"))
        i = tl.load(part_i + r * n_chunks + offs, mask=m, other=V)
        best = tl.max(v, 0)
        idx = tl.min(tl.where(v == best, i, V), 0).to(tl.int64)
        if HAS_TABLE:
            idx = tl.load(table + idx)
        tl.store(ids + r * s_ids, idx)

    return chunk_max_kernel, row_max_kernel


def argmax_rows(x: torch.Tensor, table: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    *lead, V = x.shape
    assert fits(V), f"argmax_rows: V={V}"
    assert table is None or (table.shape == (V,) and table.dtype == torch.int64 and table.is_contiguous())
    x2 = x.reshape(-1, V)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    R = x2.shape[0]
    n_chunks = (V + CHUNK - 1) // CHUNK
    part_v = torch.empty(R, n_chunks, dtype=torch.float32, device=x.device)
    part_i = torch.empty(R, n_chunks, dtype=torch.int32, device=x.device)
    chunk_max, _ = _kernels()
    chunk_max[(R, n_chunks)](x2, part_v, part_i, V, x2.stride(0), n_chunks, CHUNK=CHUNK, num_warps=4, **launch_options(x2))
    if out is not None:  # written in place (a column of a larger tensor: a chain's candidates)
        assert out.shape == tuple(lead) and out.dtype == torch.int64 and out.dim() <= 1
        merge_chunks(part_v, part_i, V, table, out)
        return out
    return merge_chunks(part_v, part_i, V, table).view(lead)


def merge_chunks(part_v: torch.Tensor, part_i: torch.Tensor, V: int, table: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Stage 2 alone: per-chunk maxima part_v [R, C] float32 and their first indices part_i [R, C] int32 (V: none)
    -> ids [R] int64, the index of the largest value, the smallest among equal ones (table[index] with a table).
    `sampling_kernel.sample_probs` writes such chunk results from its probability kernels. `out` [R] int64 (any
    stride): written instead of a new tensor."""
    R, n_chunks = part_v.shape
    ids = torch.empty(R, dtype=torch.int64, device=part_v.device) if out is None else out.view(R)
    _, row_max = _kernels()
    row_max[(R,)](part_v, part_i, ids, ids if table is None else table, V, n_chunks, ids.stride(0),
                  BLOCK=pow2(n_chunks, 16), HAS_TABLE=table is not None, num_warps=1, **launch_options(part_v))
    return ids
