"""GGUF tensor data to float32, with torch for the common types and `gguf.quants` for the rest.

`dequantize(data, qtype) -> torch.Tensor`: data the raw bytes of one tensor as uint8 [*outer, bytes per row]
(`gguf_header.GGUFTensor.data`), qtype a `gguf.GGMLQuantizationType`; returns float32 [*outer, elements per row], a
new tensor (never a view of the file). F32, F16, BF16, Q8_0, Q4_0 and Q4_1 are computed here with whole-tensor torch
ops, bit for bit what `gguf.quants.dequantize` computes (the same float32 products and sums, in the same order:
tested); any other type goes through `gguf.quants` (numpy). The embedded SmolLM2 is Q4_1 with one Q8_0 tensor:
numpy took 1.7 s for it on a 2-core CPU, these ops a fraction of that (docs/benchmarks.md, "Session 33").

Block layouts (ggml): Q8_0 = f16 d, 32 x int8 q: d * q; Q4_0 = f16 d, 16 bytes: d * (nibble - 8); Q4_1 = f16 d, f16
m, 16 bytes: d * nibble + m; in the nibble types the 16 low nibbles are elements 0-15 and the high ones 16-31.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_BLOCK = 32


def _blocks(data: np.ndarray, type_size: int) -> torch.Tensor:
    """uint8 [..., nb * type_size] -> [N, type_size] (a copy: the file's map is read-only)."""
    return torch.from_numpy(np.array(data, dtype=np.uint8, copy=True)).view(-1, type_size)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[N, 2] uint8 -> [N, 1] float32 (little-endian float16)."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[N, 16] uint8 -> [N, 32] float32: the low nibbles, then the high ones."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=1).float()


def dequantize(data: np.ndarray, qtype: Any) -> torch.Tensor:
    name = qtype.name
    out_shape = (*data.shape[:-1], -1)
    if name in ("F32", "F16", "BF16"):
        dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[name]
        raw = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))
        return raw.view(dt).float().reshape(out_shape)
    if name == "Q8_0":
        b = _blocks(data, 2 + _BLOCK)
        q = b[:, 2:].contiguous().view(torch.int8).float()
        return (q * _f16(b[:, :2])).reshape(out_shape)
    if name == "Q4_0":
        b = _blocks(data, 2 + _BLOCK // 2)
        return (_f16(b[:, :2]) * (_nibbles(b[:, 2:]) - 8)).reshape(out_shape)  # nibble - 8 is exact in float32
    if name == "Q4_1":
        b = _blocks(data, 4 + _BLOCK // 2)
        return (_f16(b[:, :2]) * _nibbles(b[:, 4:]) + _f16(b[:, 2:4])).reshape(out_shape)
    from gguf.quants import dequantize as numpy_dequantize

    return torch.from_numpy(np.array(numpy_dequantize(data, qtype), dtype=np.float32, copy=True))
