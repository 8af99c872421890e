"""Helpers for the GGUF files the tests write with `gguf.GGUFWriter`: a tensor quantized as a file holds it, the three
writes that finish a file, and the tensor names transformers' own checkpoint of a model has (what a GGUF's tensors
must be named as for `eaglespec convert` to write that architecture's folder)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def add_quantized(w: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: gguf.GGMLQuantizationType,
                  data: np.ndarray | None = None) -> np.ndarray:
    """Add `arr` as `qtype` (or the raw blocks `data` of that type) under `name`; returns what the file holds,
    dequantized: float32 of `arr`'s shape."""
    data = gguf.quants.quantize(arr, qtype) if data is None else data
    w.add_tensor(name, data, raw_dtype=qtype)
    return gguf.quants.dequantize(data, qtype).reshape(arr.shape).astype(np.float32)


def finish(w: gguf.GGUFWriter) -> None:
    """Write the header, the metadata and the tensors, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def checkpoint_names(model, folder: Path) -> set[str]:
    """The tensor names of `model` (a transformers model) as its `save_pretrained` writes them."""
    from safetensors import safe_open

    model.save_pretrained(folder)
    names: set[str] = set()
    for part in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(part), "pt") as f:
            names |= set(f.keys())
    return names
