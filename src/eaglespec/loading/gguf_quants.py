"""GGUF tensor data to float32, with torch for the common types and `gguf.quants` for the rest.

`dequantize(data, qtype) -> torch.Tensor`: data the raw bytes of one tensor as uint8 [*outer, bytes per row]
(`gguf_header.GGUFTensor.data`), qtype a `gguf.GGMLQuantizationType`; returns float32 [*outer, elements per row], a
new tensor (never a view of the file). F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants of llama.cpp's
Q4_K_M / Q5_K_M / Q6_K mixes (Q4_K, Q5_K, Q6_K) are computed here with torch ops over chunks of blocks, bit for bit
what `gguf.quants.dequantize` computes (the same float32 products and sums, in the same order: tested); any other type
goes through `gguf.quants` (numpy). A tensor is dequantized a chunk of blocks at a time (`_CHUNK_ELEMENTS`), so that
each chunk's intermediates stay in the cache: on a 2-core CPU a 16M-element tensor dequantizes 1.2-1.7x faster than
numpy, where whole-tensor ops were 0.5-0.8x its speed (docs/benchmarks.md, "Session 57"); the embedded SmolLM2 (Q4_1,
one Q8_0 tensor) in 0.16 s against numpy's 0.47 s.

Block layouts (ggml): Q8_0 = f16 d, 32 x int8 q: d * q; Q4_0 = f16 d, 16 bytes: d * (nibble - 8); Q4_1 = f16 d, f16
m, 16 bytes: d * nibble + m; in the nibble types the 16 low nibbles are elements 0-15 and the high ones 16-31. The
5-bit and K-quant layouts are given beside their functions below.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_BLOCK = 32
_QK_K = 256
_CHUNK_ELEMENTS = 1 << 18  # elements a chunk: its intermediates stay in the cache (benchmarks.md, session 57)


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
    if name in _TORCH_TYPES:
        fn, type_size, elements = _TORCH_TYPES[name]
        b = _blocks(data, type_size)
        out = torch.empty(b.shape[0], elements)
        step = max(1, _CHUNK_ELEMENTS // elements)
        for i in range(0, b.shape[0], step):  # in the cache: 2-3x whole-tensor ops on a 16M-element tensor
            out[i : i + step] = fn(b[i : i + step])
        return out.reshape(out_shape)
    from gguf.quants import dequantize as numpy_dequantize

    return torch.from_numpy(np.array(numpy_dequantize(data, qtype), dtype=np.float32, copy=True))


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]) - 8)  # nibble - 8 is exact in float32


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]) + _f16(b[:, 2:4])


# --- the 5-bit legacy types and the K-quants of llama.cpp's Q4_K_M / Q5_K_M / Q6_K mixes ------------------------------


def _bits(b: torch.Tensor, width: int, shifts: tuple[int, ...]) -> torch.Tensor:
    """uint8 [N, ..., n] -> [N, ..., len(shifts), n]: the `width`-bit fields at each shift of every byte."""
    s = torch.tensor(shifts, dtype=torch.uint8, device=b.device).view(len(shifts), 1)
    return (b.unsqueeze(-2) >> s) & ((1 << width) - 1)


def _q5_legacy(b: torch.Tensor, with_min: bool) -> torch.Tensor:
    """Q5_0 = f16 d, 4 bytes qh (bit i: element i's fifth bit), 16 bytes of nibbles: d * (q - 16); Q5_1 = f16 d,
    f16 m, qh, nibbles: d * q + m."""
    head = 4 if with_min else 2
    qh = _bits(b[:, head : head + 4], 1, tuple(range(8))).transpose(1, 2).reshape(-1, _BLOCK)  # byte-major bits
    ql = _bits(b[:, head + 4 :], 4, (0, 4)).reshape(-1, _BLOCK)
    q = ql | (qh << 4)
    if with_min:
        return _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])
    return _f16(b[:, :2]) * (q.to(torch.int8) - 16).float()


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 scale bytes [N, 12] -> 8 six-bit scales and 8 six-bit mins, [N, 8] float32 each."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc.float(), mn.float()


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    """Q4_K (144 bytes / 256): f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles (per 64: 32 low, 32 high)."""
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc).unsqueeze(-1)  # [N, 8, 1]
    dm = (_f16(b[:, 2:4]) * mn).unsqueeze(-1)
    q = _bits(b[:, 16:].reshape(-1, 4, 32), 4, (0, 4)).reshape(-1, 8, 32).float()
    return (d * q - dm).reshape(-1, _QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    """Q5_K (176 bytes / 256): Q4_K's d, dmin and scales, 32 bytes of fifth bits (bit j of byte i: element 32j + i),
    128 bytes of nibbles."""
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc).unsqueeze(-1)
    dm = (_f16(b[:, 2:4]) * mn).unsqueeze(-1)
    ql = _bits(b[:, 48:].reshape(-1, 4, 32), 4, (0, 4)).reshape(-1, 8, 32)
    qh = _bits(b[:, 16:48], 1, tuple(range(8)))  # [N, 8, 32]
    return (d * (ql | (qh << 4)).float() - dm).reshape(-1, _QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    """Q6_K (210 bytes / 256): 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales (one per 16), f16 d."""
    d = (_f16(b[:, 208:]) * b[:, 192:208].contiguous().view(torch.int8).float()).unsqueeze(-1)  # [N, 16, 1]
    ql = _bits(b[:, :128].reshape(-1, 2, 64), 4, (0, 4)).reshape(-1, 8, 32)
    qh = _bits(b[:, 128:192].reshape(-1, 2, 32), 2, (0, 2, 4, 6)).reshape(-1, 8, 32)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(-1, 16, 16).float()
    return (d * q).reshape(-1, _QK_K)


# name -> (blocks [N, type size] -> float32 [N, elements], type size in bytes, elements a block)
_TORCH_TYPES = {
    "Q8_0": (_q8_0, 2 + _BLOCK, _BLOCK), "Q4_0": (_q4_0, 2 + _BLOCK // 2, _BLOCK),
    "Q4_1": (_q4_1, 4 + _BLOCK // 2, _BLOCK), "Q5_0": (lambda b: _q5_legacy(b, False), 6 + _BLOCK // 2, _BLOCK),
    "Q5_1": (lambda b: _q5_legacy(b, True), 8 + _BLOCK // 2, _BLOCK), "Q4_K": (_q4_k, 144, _QK_K),
    "Q5_K": (_q5_k, 176, _QK_K), "Q6_K": (_q6_k, 210, _QK_K),
}
