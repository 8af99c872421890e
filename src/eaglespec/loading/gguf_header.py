"""The header of a GGUF file (format versions 2 and 3, little-endian): its key/value metadata and its tensor table.

Why not `gguf.GGUFReader`: it parses every metadata value into numpy views of a memory map, one small array per
string, and the tokenizer's lists are ~100K strings (SmolLM2-135M: 49,152 tokens and 48,900 merges): 4.8 s of a
13 s CPU load, and the views it hands out are `np.memmap` slices whose per-slice overhead made the dequantisation
after it 2 s slower too (cProfile, 2026-12-03). Here the header is read with `struct` from an `mmap` (about 0.1 s),
and each tensor's bytes are a plain read-only numpy view of the same map; the `gguf` package still dequantises them
(`gguf.quants`) and supplies the type table (`GGML_QUANT_SIZES`).

`read_header(path) -> GGUFHeader`: `metadata` maps every key to a Python value (int, float, bool, str, or a list of
them, nested for arrays of arrays), `tensors` lists `GGUFTensor(name, dims, qtype, data)` in file order: dims as GGUF
stores them (innermost first), qtype a `gguf.GGMLQuantizationType`, data the raw bytes as uint8
[*outer dims, bytes per row] (the layout `gguf.quants.dequantize` takes). A file that is not GGUF, of another version
or byte order, cut short (metadata or tensor data past the end) or otherwise malformed raises `ValueError` with the
reason; the caller names the file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_STRING, _ARRAY = 8, 9
# GGUF value type -> struct format of one little-endian scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # innermost first, as GGUF stores them
    qtype: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # uint8 [*reversed(dims[1:]), bytes per row], read-only, backed by the file's map


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("Q")
        end = self.pos + n
        if end > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        s = self.buf[self.pos:end].decode("utf-8")
        self.pos = end
        return s

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.take("I"), self.take("Q")
            if etype == _STRING:
                return [self.string() for _ in range(n)]
            if etype == _ARRAY:
                return [self.value(_ARRAY) for _ in range(n)]
            if etype not in _NUMPY:
                raise ValueError(f"unknown array element type {etype}")
            dt = np.dtype(_NUMPY[etype])
            if self.pos + n * dt.itemsize > len(self.buf):
                raise ValueError("an array runs past the end of the file")
            arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
            self.pos += n * dt.itemsize
            return arr.tolist()
        if vtype not in _SCALARS:
            raise ValueError(f"unknown value type {vtype}")
        return self.take(_SCALARS[vtype])


def read_header(path: str | Path) -> GGUFHeader:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        c = _Cursor(buf)
        if buf[:4] != MAGIC:
            raise ValueError("no GGUF magic at the start")
        c.pos = 4
        version = c.take("I")
        if version & 0xFFFF == 0:
            raise ValueError("a big-endian GGUF file, which is not supported")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_kv = c.take("Q"), c.take("Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            metadata[key] = c.value(c.take("I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = tuple(c.take("Q") for _ in range(c.take("I")))
            infos.append((name, dims, c.take("I"), c.take("Q")))
        align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = (c.pos + align - 1) // align * align
        tensors = []
        for name, dims, raw_type, offset in infos:
            try:
                qtype = GGMLQuantizationType(raw_type)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ValueError(f"tensor {name!r} has an unknown GGUF type {raw_type}") from None
            if not dims or dims[0] % block:
                raise ValueError(f"tensor {name!r} has dims {dims}, not whole blocks of {block}")
            row_bytes = dims[0] // block * type_size
            rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
            begin = start + offset
            if begin + rows * row_bytes > len(buf):
                raise ValueError(f"tensor {name!r}'s data runs past the end of the file (truncated?)")
            data = np.frombuffer(buf, dtype=np.uint8, count=rows * row_bytes, offset=begin)
            tensors.append(GGUFTensor(name, dims, qtype, data.reshape(*reversed(dims[1:]), row_bytes)))
        return GGUFHeader(version, metadata, tensors)
    except struct.error:
        raise ValueError("the header runs past the end of the file (truncated?)") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"a string is not UTF-8 ({e})") from None
