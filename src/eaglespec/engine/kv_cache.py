"""Preallocated KV caches: one tensor per cache kind holding every layer, [L, rows, S_max, *per_token_shape].

A model declares its per-token cache shapes (`kv_cache_shapes()`: Llama -> k and v as (H_kv, head_dim); MLA ->
one latent (kv_lora_rank + rope_dim,)). Each cache row belongs to one sequence; position p of a row holds token p.
`compact` moves accepted tree entries into contiguous positions for every layer at once (one gather and one scatter
per cache kind; on CUDA one Triton kernel per cache kind), which is how the target keeps only the accepted path after
verification.
The tensors start as zeros, so every entry is always finite: the short-query attention kernel of one-row steps
reads blocks no query sees and relies on 0 x entry = 0 (layers/short_attention_kernel.py).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..layers import kv_compact_kernel


class KVCache:
    def __init__(
        self,
        num_layers: int,
        shapes: Sequence[tuple[int, ...]],
        rows: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_layers, self.rows, self.max_len = num_layers, rows, max_len
        self.tensors = [torch.zeros(num_layers, rows, max_len, *s, dtype=dtype, device=device) for s in shapes]
        self._layers = [[t[i] for t in self.tensors] for i in range(num_layers)]

    def layers(self) -> list[list[torch.Tensor]]:
        """Per layer, the views [rows, S_max, ...] of each cache kind."""
        return self._layers

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @staticmethod
    def bytes_for(num_layers: int, shapes: Sequence[tuple[int, ...]], rows: int, max_len: int,
                  dtype: torch.dtype) -> int:
        """What a cache of these dimensions takes (`nbytes` before allocating it)."""
        per_token = sum(math.prod(s) for s in shapes)
        return num_layers * rows * max_len * per_token * dtype.itemsize

    def compact(self, rows: torch.Tensor, start: torch.Tensor, path: torch.Tensor) -> None:
        """For each b: positions start[b] + path[b, i] -> start[b] + i (all layers). rows, start [B]; path [B, N] with
        path[b, i] >= i (a tree's accepted path: node ids by depth), so no source is overwritten before it is read.
        On CUDA one Triton kernel per cache tensor (layers/kv_compact_kernel.py) instead of ~4 operators."""
        r = rows[:, None]
        src = dst = None
        for t in self.tensors:
            if t.is_cuda and kv_compact_kernel.fits(t[0, 0, 0].numel(), path.shape[1]):
                kv_compact_kernel.compact(t, rows, start, path)
                continue
            if src is None:
                src = start[:, None] + path
                dst = start[:, None] + torch.arange(path.shape[1], device=path.device)[None, :]
            t[:, r, dst] = t[:, r, src]  # the whole source is gathered before anything is written
