"""GGUF files (llama.cpp): metadata, an HF config dict, and dequantized tensors under HF names.

Contract:
- `GGUFFile(path)` reads the header once (`gguf_header.read_header`: the file memory-mapped, the metadata parsed
  with `struct`, about 0.1 s where `gguf.GGUFReader` took 4.8 s); a missing, unreadable, corrupt or truncated file
  raises `CheckpointError` naming it and the reason. A split GGUF (llama.cpp's `split.count` > 1: the large
  DeepSeek / Kimi / Qwen files) is read whole from any of its shards (`shards`, named PREFIX-0000i-of-0000N.gguf,
  side by side): the metadata from the first, the tensors of all in order; a shard missing, misnumbered, or a tensor
  count other than `split.tensors.count`, is a `CheckpointError` naming what is wrong.
- `metadata` holds every key/value field as plain Python values (strings, numbers, lists); `tensors` the tensor
  table (`gguf_header.GGUFTensor`, every shard's).
- `hf_config()` builds the `config.json` dict of the model (`gguf_config.py`, for its `GGUF_ARCHITECTURES`; others
  raise `ConfigError`), which `ModelConfig.from_hf` consumes unchanged.
- `hf_tensors()` yields `(hf_name, float32 tensor)` one tensor at a time: dequantized (`SUPPORTED_TYPES`: the float
  types, the legacy, K- and i-quants, ternary and MXFP4; any other type, such as Q8_1 or the integer types, raises
  `CheckpointError` before anything is yielded), renamed through the one table in `gguf_names.py` (and its
  per-architecture `HF_RENAMES`: the names the model's own checkpoints use; RoPE-scaling tensors are the config's,
  skipped), with llama.cpp's q/k permutation undone (`llama` files: Qwen's keep the HF layout), stacked expert tensors
  split into one tensor per expert, each dequantized from its own rows of the file, and a deepseek2 layer's `attn_k_b`
  / `attn_v_b` joined back into its `kv_b_proj` (yielded when the second of the two is read; one of them without the
  other raises `CheckpointError` once the file is read through).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import CheckpointError
from .gguf_config import hf_config
from .gguf_header import GGUFHeader, read_header
from .gguf_names import (HF_RENAMES, NORM_SHIFTED_ARCHS, PERMUTED_ARCHS, expert_names, gguf_to_hf_name, join_kv_b,
                          unpermute_qk)
from .gguf_quants import dequantize

# torch-computed (gguf_quants.py), then what gguf.quants (>= 0.19) dequantizes: the K-quants of llama.cpp's Q2_K ..
# Q6_K mixes, the i-quants (IQ1_S .. IQ4_XS: the low-bit DeepSeek / Kimi files), ternary and FP4 types
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                   "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0",
                   "TQ2_0", "MXFP4")

GGUF_MAGIC = b"GGUF"
# llama.cpp's shard names (gguf-split, convert_hf_to_gguf --split-max-*): PREFIX-00001-of-00003.gguf
_SHARD_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


def is_gguf(path: str | Path) -> bool:
    """True for an existing file that starts with the GGUF magic (or is named *.gguf)."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    with p.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def shard_paths(path: Path, count: int) -> list[Path]:
    """The `count` shard files of the split GGUF `path` belongs to, first to last (named as llama.cpp names them)."""
    m = _SHARD_NAME.fullmatch(path.name)
    if m is None or int(m["count"]) != count:
        raise CheckpointError(f"{path} is one of {count} shards of a split GGUF (split.count {count}), but its name "
                              f"does not say where the others are (llama.cpp names them PREFIX-00001-of-"
                              f"{count:05d}.gguf, ...)")
    return [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path} does not exist")
        header = self._read(self.path)
        count = int(header.metadata.get("split.count", 1))
        self.shards = [self.path]
        headers = [header]
        if count > 1:  # llama.cpp's split files: the model's metadata in the first, tensors spread over all
            self.shards = shard_paths(self.path, count)
            missing = [p.name for p in self.shards if not p.is_file()]
            if missing:
                raise CheckpointError(f"{self.path} is one of {count} shards of a split GGUF, and "
                                      f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not beside it")
            headers = [header if p == self.path else self._read(p) for p in self.shards]
            for i, (p, h) in enumerate(zip(self.shards, headers)):
                if h.metadata.get("split.no") != i or h.metadata.get("split.count") != count:
                    raise CheckpointError(f"{p} is not shard {i + 1} of {count} (its split.no "
                                          f"{h.metadata.get('split.no')}, split.count {h.metadata.get('split.count')})")
        self._metadata = headers[0].metadata
        self.tensors = [t for h in headers for t in h.tensors]
        expected = self._metadata.get("split.tensors.count")
        if count > 1 and expected is not None and int(expected) != len(self.tensors):
            raise CheckpointError(f"{self.path}: the {count} shards hold {len(self.tensors)} tensors where "
                                  f"split.tensors.count says {expected}")

    @staticmethod
    def _read(path: Path) -> GGUFHeader:
        try:
            return read_header(path)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path} is not a readable GGUF file: it is corrupt or truncated ({e})") from None

    @property
    def metadata(self) -> dict[str, Any]:
        return self._metadata

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(f"{self.path} has no general.architecture metadata")
        return arch

    def hf_config(self) -> dict[str, Any]:
        """The HF `config.json` dict of this model (`gguf_config.hf_config`)."""
        self.architecture  # noqa: B018 (a file without one is a CheckpointError, not an unsupported architecture)
        return hf_config(self.path, self.metadata, self.tensors)

    def check_tensor_types(self) -> None:
        for t in self.tensors:
            if t.qtype.name not in SUPPORTED_TYPES:
                raise CheckpointError(
                    f"{self.path}: tensor {t.name!r} has GGUF type {t.qtype.name}, which is not supported "
                    f"(supported: {', '.join(SUPPORTED_TYPES)})"
                )

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor in the HF layout), one tensor at a time."""
        self.check_tensor_types()
        cfg = self.hf_config()
        n_heads = {"q": cfg["num_attention_heads"], "k": cfg["num_key_value_heads"]}
        renames = [(re.compile(p), r) for p, r in HF_RENAMES.get(cfg["architectures"][0], ())]

        def hf(name: str) -> str:  # the model's own checkpoint spelling
            for pattern, repl in renames:
                name = pattern.sub(repl, name)
            return name

        halves: dict[str, dict[str, torch.Tensor]] = {}  # kv_b_proj name -> the halves read so far ("k_b", "v_b")
        for t in self.tensors:
            name, kind = gguf_to_hf_name(t.name, self.architecture)
            if kind == "config":  # read by hf_config (RoPE scaling tensors)
                continue
            shape = tuple(reversed(t.dims))  # GGUF lists dims innermost first
            if kind in ("experts", "experts_gate_up"):  # [E, rows, cols] (biases [E, rows]): one tensor per expert
                if len(shape) != (2 if name.endswith(".bias") else 3):
                    raise CheckpointError(f"{self.path}: expert tensor {t.name!r} has shape {shape}, not [E, rows, "
                                          "cols] (a bias: [E, rows])")
                for e, expert_name in enumerate(expert_names(name, shape[0])):
                    w = self._dequantize(t, t.data[e], shape[1:])  # each dequantized from its own rows
                    if kind == "experts":
                        yield hf(expert_name), w
                    else:  # gpt-oss's gate rows, then its up rows
                        gate, up = w.chunk(2)
                        yield hf(expert_name.replace("{gate_up}", "gate")), gate
                        yield hf(expert_name.replace("{gate_up}", "up")), up
                continue
            w = self._dequantize(t, t.data, shape)
            if self.architecture in NORM_SHIFTED_ARCHS and name.endswith("norm.weight"):
                w = w - 1.0  # stored as 1 + the checkpoint's offset
            if kind in ("q", "k") and self.architecture in PERMUTED_ARCHS:
                w = unpermute_qk(w, n_heads[kind]).contiguous()
            elif kind in ("k_b", "v_b"):
                pair = halves.setdefault(name, {})
                pair[kind] = w
                if len(pair) < 2:
                    continue
                try:
                    w = join_kv_b(pair["k_b"], pair["v_b"])
                except CheckpointError as e:
                    raise CheckpointError(f"{self.path}: {e}") from None
                del halves[name]
            yield hf(name), w
        if halves:
            name, pair = next(iter(halves.items()))
            have, missing = ("attn_k_b", "attn_v_b") if "k_b" in pair else ("attn_v_b", "attn_k_b")
            raise CheckpointError(f"{self.path}: {have} without {missing}: {name} needs both of its halves")

    def _dequantize(self, t: Any, data: Any, shape: tuple[int, ...]) -> torch.Tensor:
        try:
            return dequantize(data, t.qtype).reshape(shape)  # a new float32 tensor, not a view of the file
        except (ValueError, RuntimeError) as e:
            raise CheckpointError(f"{self.path}: tensor {t.name!r} is corrupt ({e})") from None
