"""Safetensors checkpoints: find the files of a folder, validate them, stream their tensors, write them.

Contract:
- `safetensors_files(path)` lists the files of a checkpoint: a single `.safetensors` file, a folder's
  `model.safetensors`, the shards named by `model.safetensors.index.json`, or else every `*.safetensors` of the folder.
- Every file is validated (`check_safetensors_header`) before the `safetensors` library touches it: a missing,
  truncated or corrupt file raises `CheckpointError` naming the file, never a raw error from safetensors or json.
- `iter_safetensors(path)` yields `(name, tensor)` one tensor at a time (`safe_open`), so a checkpoint larger than
  memory is never read whole.
- `save_safetensors` / `save_safetensors_sharded` write files (tied or non-contiguous tensors are handled) that
  `iter_safetensors` and transformers read back.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from ..errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"

# Bytes per element of the safetensors dtypes we can size-check (sub-byte formats are left to the library).
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}


def check_safetensors_header(path: Path) -> dict[str, Any]:
    """Validate one file's header against its size; return the header (tensor entries and `__metadata__`).

    Layout: 8 bytes little-endian header length n, n bytes of JSON, then the data section that every
    tensor's `data_offsets` [begin, end) must lie in.
    """
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    size = path.stat().st_size
    if size < 8:
        raise CheckpointError(f"{path} is truncated: {size} bytes, shorter than the 8-byte safetensors header length")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise CheckpointError(
                f"{path} is corrupt or truncated: its header claims {n} bytes but the file has only {size}"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path} is corrupt: its safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is corrupt: its safetensors header is not a JSON object")
    data_size = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in entry["data_offsets"])
            shape = [int(d) for d in entry["shape"]]
            dtype = str(entry["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path} is corrupt: the header entry of tensor {name!r} is malformed") from None
        if not 0 <= begin <= end <= data_size:
            raise CheckpointError(
                f"{path} is corrupt or truncated: tensor {name!r} lies at bytes {begin}..{end} "
                f"but the data section has only {data_size} bytes"
            )
        itemsize = _DTYPE_BYTES.get(dtype)
        if itemsize is not None and end - begin != math.prod(shape) * itemsize:
            raise CheckpointError(
                f"{path} is corrupt: tensor {name!r} ({dtype}, shape {shape}) should take "
                f"{math.prod(shape) * itemsize} bytes but its offsets span {end - begin}"
            )
    return header


def _read_index(index: Path) -> dict[str, str]:
    """weight name -> shard file name, from a `*.safetensors.index.json`."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise CheckpointError(f"{index} is not a valid safetensors index (JSON with a 'weight_map' object)") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index} is not a valid safetensors index: 'weight_map' must map names to files")
    return weight_map


def safetensors_files(path: str | Path) -> list[Path]:
    """The validated files of a checkpoint (a `.safetensors` file or a folder), in a stable order."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p} does not exist")
    if p.is_file():
        files = [p]
    elif (p / INDEX_NAME).is_file():
        weight_map = _read_index(p / INDEX_NAME)
        files = [p / f for f in sorted(set(weight_map.values()))]
    elif (p / SINGLE_NAME).is_file():
        files = [p / SINGLE_NAME]
    else:
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{p} has no model.safetensors, {INDEX_NAME} or other *.safetensors file")
    for f in files:
        check_safetensors_header(f)
    return files


def iter_safetensors(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the checkpoint, one file open at a time, on the CPU."""
    from safetensors import safe_open
    from safetensors import SafetensorError

    p = Path(path)
    files = safetensors_files(p)
    listed: dict[str, str] | None = None
    if p.is_dir() and (p / INDEX_NAME).is_file():
        listed = _read_index(p / INDEX_NAME)
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                names = list(st.keys())
                if listed is not None:
                    absent = [n for n, shard in listed.items() if shard == f.name and n not in names]
                    if absent:
                        raise CheckpointError(
                            f"{p / INDEX_NAME} lists {absent[0]!r} in {f.name}, but {f} does not contain it"
                        )
                for name in names:
                    yield name, st.get_tensor(name)
        except SafetensorError as e:
            raise CheckpointError(f"{f} cannot be read as safetensors ({e})") from None


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The whole checkpoint in memory (small checkpoints and tests)."""
    return dict(iter_safetensors(path))


def _prepare(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors that share no storage (safetensors refuses aliases, e.g. tied embeddings)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else -1
        if ptr in seen:
            t = t.clone()
        elif ptr != -1:
            seen.add(ptr)
        out[name] = t
    return out


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str | Path, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write one `.safetensors` file; metadata values must be strings ({"format": "pt"} is always set)."""
    from safetensors.torch import save_file

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    save_file(_prepare(tensors), str(p), metadata=meta)
    return p


def save_safetensors_sharded(
    tensors: Mapping[str, torch.Tensor],
    folder: str | Path,
    max_shard_bytes: int = 4 << 30,
    metadata: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write `model-0000i-of-0000n.safetensors` shards of at most `max_shard_bytes` (one tensor may exceed it)
    plus `model.safetensors.index.json`, the layout transformers writes."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    prepared = _prepare(tensors)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in prepared.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    n = len(shards)
    weight_map: dict[str, str] = {}
    paths = []
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        paths.append(save_safetensors(shard, out / fname, metadata))
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in prepared.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return paths
