"""Dequantizers for the quantized checkpoint formats of DeepSeek-V3 / Kimi-K2.5, and their quant-config detection.

Pure functions over tensors (REFERENCE.md §6). Each turns the tensors of one quantized linear into a plain weight
`[out, in]` (default bfloat16); the `pack_*` functions produce the official layouts from a float weight (tests and
tiny test checkpoints use them).

- INT4, compressed-tensors `pack-quantized` (symmetric, group 32; Kimi-K2.5's routed experts):
  `weight_packed` int32 `[out, ceil(in/8)]`: element j of a row is the nibble at bits `4*(j%8)` of word `j//8` (low
  nibble first), stored with an offset of 8: value = nibble - 8 in [-8, 7];
  `weight_scale` (bf16) `[out, ceil(in/group)]`; `weight_shape` int `[2]` = (out, in) (the packing pads `in` to 8).
  w[o, j] = value[o, j] * weight_scale[o, j // group].
- NVFP4, NVIDIA ModelOpt (group 16): `weight` uint8 `[out, in/2]`: element 2i in the low nibble of byte i, 2i+1 in
  the high nibble; each nibble an E2M1 code: bit 3 = sign, bits 0-2 index the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6;
  `weight_scale` float8_e4m3fn `[out, in/16]`; `weight_scale_2` fp32 scalar; `input_scale` fp32 scalar (activation
  scale, unused when dequantizing). w[o, j] = e2m1[o, j] * weight_scale[o, j // 16] * weight_scale_2.
- FP8 block (DeepSeek-V3's own release): `weight` float8_e4m3fn `[out, in]`, `weight_scale_inv` fp32
  `[ceil(out/128), ceil(in/128)]`; w = weight * weight_scale_inv of its 128x128 block.

Detection: `quant_spec_from_config(config_dict, folder)` reads compressed-tensors from config.json's
`quantization_config` (or that of its `text_config`), ModelOpt from `hf_quant_config.json` or from a
`quantization_config` with `quant_method: modelopt`, and DeepSeek FP8 from `quant_method: fp8`. `QuantSpec.is_ignored`
applies the ignore / exclude patterns: `re:`-prefixed regexes (re.match, as compressed-tensors), `*` wildcards
(fnmatch, as ModelOpt), otherwise the exact module name or a dotted suffix of it.

Loader use: `StreamDequantizer` is a `transform_checkpoint(name, tensor)` hook for a streaming loader: it holds the
pieces of a quantized linear until the group is complete, then yields `prefix.weight`. For random access,
`quantized_prefixes(names)` groups the checkpoint names of each quantized linear and `dequantize_group(prefix, tensors)`
turns one group into its weight.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from ..errors import CheckpointError, ConfigError

E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP8_E4M3_MAX = 448.0
# Checkpoint suffixes that only exist on quantized linears (a plain `weight` may belong to a group too).
QUANT_SUFFIXES: tuple[str, ...] = (
    "weight_packed", "weight_scale", "weight_shape", "weight_scale_2", "input_scale", "weight_scale_inv",
)


def _e2m1_table(device: torch.device | str) -> torch.Tensor:
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])  # [16] indexed by the 4-bit code (bit 3 = sign)


def _expand_cols(scale: torch.Tensor, group: int, cols: int) -> torch.Tensor:
    """[out, G] per-group scales -> [out, cols], group j // group for column j."""
    return scale.float().repeat_interleave(group, dim=1)[:, :cols]


# --- INT4 (compressed-tensors pack-quantized) --------------------------------------------------------------------


def dequant_int4_pack(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_shape: torch.Tensor | Sequence[int],
    group_size: int = 32,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """int32 [out, ceil(in/8)] + scales [out, ceil(in/group)] -> [out, in] in `dtype` (layout: module docstring)."""
    out_f, in_f = (int(x) for x in (weight_shape.tolist() if isinstance(weight_shape, torch.Tensor) else weight_shape))
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=weight_packed.device)  # nibble j%8 at bits 4*(j%8)
    nibbles = (weight_packed.to(torch.int32)[:, :, None] >> shifts) & 0xF  # [out, in/8, 8]; & undoes sign extension
    values = nibbles.reshape(weight_packed.shape[0], -1)[:out_f, :in_f].float() - 8.0
    return (values * _expand_cols(weight_scale, group_size, in_f)).to(dtype)


def pack_int4(
    weight: torch.Tensor, group_size: int = 32, scale_dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """Quantize [out, in] symmetrically (scale = group absmax / 7, values in [-7, 7]) into the pack-quantized layout.

    Returns {weight_packed, weight_scale, weight_shape}; dequantizing them reproduces `weight` within half a scale.
    """
    out_f, in_f = weight.shape
    w = weight.float()
    n_groups = -(-in_f // group_size)
    padded = torch.nn.functional.pad(w, (0, n_groups * group_size - in_f)).view(out_f, n_groups, group_size)
    scale = (padded.abs().amax(-1) / 7.0).clamp_min(1e-12).to(scale_dtype)  # [out, G], rounded to the stored dtype
    q = torch.round(w / _expand_cols(scale, group_size, in_f)).clamp(-8, 7).to(torch.int32) + 8  # [out, in] in 0..15
    q = torch.nn.functional.pad(q, (0, -in_f % 8)).view(out_f, -1, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    packed = (q << shifts).sum(-1, dtype=torch.int64)  # unsigned 32-bit words
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # reinterpreted as int32
    return {"weight_packed": packed, "weight_scale": scale, "weight_shape": torch.tensor([out_f, in_f])}


# --- NVFP4 (ModelOpt) ----------------------------------------------------------------------------------------------


def dequant_nvfp4(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor | float,
    group_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """uint8 [out, in/2] + fp8 scales [out, in/16] + fp32 global scale -> [out, in] in `dtype`."""
    out_f = weight.shape[0]
    b = weight.to(torch.uint8).to(torch.int64)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(out_f, -1)  # [out, in]: low nibble first
    values = _e2m1_table(weight.device)[codes]
    scale2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=weight.device)
    return (values * _expand_cols(weight_scale, group_size, values.shape[1]) * scale2).to(dtype)


def pack_nvfp4(weight: torch.Tensor, group_size: int = 16) -> dict[str, torch.Tensor]:
    """Quantize [out, in] (in divisible by 2 * 8) into the ModelOpt NVFP4 layout, as ModelOpt scales it.

    weight_scale_2 = amax / (6 * 448); block scale = fp8(block amax / 6 / weight_scale_2); each element rounds to the
    nearest E2M1 value of w / (block scale * weight_scale_2). Returns {weight, weight_scale, weight_scale_2,
    input_scale (1.0)}.
    """
    out_f, in_f = weight.shape
    assert in_f % group_size == 0 and group_size % 2 == 0
    w = weight.float()
    scale2 = (w.abs().amax() / (6.0 * FP8_E4M3_MAX)).clamp_min(1e-12)
    blocks = w.view(out_f, in_f // group_size, group_size)
    scale = (blocks.abs().amax(-1) / 6.0 / scale2).clamp(max=FP8_E4M3_MAX).to(torch.float8_e4m3fn)  # [out, in/16]
    eff = scale.float() * scale2
    x = w / _expand_cols(eff, group_size, in_f).clamp_min(1e-30)  # [out, in] in units of the E2M1 grid
    mags = torch.tensor(E2M1_VALUES, device=weight.device)
    mag_code = (x.abs()[..., None] - mags).abs().argmin(-1)  # nearest magnitude, 0..7
    codes = (mag_code | ((x < 0) & (mag_code > 0)).long() << 3).to(torch.uint8).view(out_f, -1, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)  # even element in the low nibble
    return {
        "weight": packed.to(torch.uint8),
        "weight_scale": scale,
        "weight_scale_2": scale2.reshape(()),
        "input_scale": torch.tensor(1.0),
    }


# --- FP8 block (DeepSeek-V3) ---------------------------------------------------------------------------------------


def dequant_fp8_block(
    weight: torch.Tensor, weight_scale_inv: torch.Tensor, block: int = 128, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """float8_e4m3fn [out, in] * fp32 [ceil(out/block), ceil(in/block)] per block -> [out, in] in `dtype`."""
    out_f, in_f = weight.shape
    s = weight_scale_inv.float().repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return (weight.float() * s).to(dtype)


# --- quantization config --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantSpec:
    """Which quantized format a checkpoint uses, and which modules it leaves unquantized."""

    format: str  # "int4_pack" (compressed-tensors), "nvfp4" (ModelOpt), "fp8_block" (DeepSeek)
    group_size: int
    ignore: tuple[str, ...] = ()

    def is_ignored(self, module: str) -> bool:
        """True when `module` (a linear's name, without `.weight`) is listed as not quantized."""
        return any(_name_matches(module, p) for p in self.ignore)


def _name_matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern or name.endswith("." + pattern)


def _modelopt_spec(q: Mapping[str, Any]) -> QuantSpec:
    algo = str(q.get("quant_algo", "")).upper()
    if algo != "NVFP4":
        raise ConfigError(f"ModelOpt quant_algo {algo or '(none)'!r} is not supported (supported: NVFP4)")
    ignore = tuple(q.get("exclude_modules") or ()) + tuple(q.get("ignore") or ())
    return QuantSpec("nvfp4", int(q.get("group_size") or 16), ignore)


def quant_spec_from_config(config: Mapping[str, Any], folder: str | Path | None = None) -> QuantSpec | None:
    """The checkpoint's QuantSpec, or None when it is not quantized. Raises ConfigError on an unsupported scheme."""
    qc = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if qc:
        method = str(qc.get("quant_method", "")).lower()
        if method == "compressed-tensors":
            fmt = qc.get("format")
            groups = list((qc.get("config_groups") or {}).values())
            weights = [g.get("weights") or {} for g in groups]
            if fmt != "pack-quantized" or not weights or any(
                w.get("num_bits") != 4 or w.get("type", "int") != "int" or not w.get("symmetric", True)
                for w in weights
            ):
                raise ConfigError(
                    f"compressed-tensors format {fmt!r} is not supported (supported: symmetric int4 pack-quantized)"
                )
            sizes = {int(w.get("group_size") or 32) for w in weights}
            if len(sizes) != 1:
                raise ConfigError(f"compressed-tensors config groups use different group sizes {sorted(sizes)}")
            return QuantSpec("int4_pack", sizes.pop(), tuple(qc.get("ignore") or ()))
        if method == "modelopt":
            return _modelopt_spec(qc.get("quantization") or qc)
        if method == "fp8":
            block = qc.get("weight_block_size") or [128, 128]
            if block[0] != block[1]:
                raise ConfigError(f"FP8 weight_block_size {block} is not supported (square blocks only)")
            return QuantSpec("fp8_block", int(block[0]), tuple(qc.get("modules_to_not_convert") or ()))
        if method == "mxfp4" and config.get("model_type") == "gpt_oss":
            return None  # gpt-oss's MXFP4 experts: dequantized by its model class (models/gpt_oss.py)
        raise ConfigError(f"quant_method {method!r} is not supported (supported: compressed-tensors, modelopt, fp8; "
                          "mxfp4 for gpt-oss)")
    if folder is not None:
        path = Path(folder) / "hf_quant_config.json"
        if path.exists():
            try:
                d = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None
            return _modelopt_spec(d.get("quantization") or d)
    return None


# --- tensor groups ------------------------------------------------------------------------------------------------


def quantized_prefixes(names: Iterable[str]) -> dict[str, list[str]]:
    """{linear prefix: its checkpoint names} for every linear that carries a quantization suffix.

    A group holds the prefix's QUANT_SUFFIXES and its plain `weight` (NVFP4 / FP8 keep the codes there).
    """
    names = list(names)
    prefixes = {n.rsplit(".", 1)[0] for n in names if "." in n and n.rsplit(".", 1)[1] in QUANT_SUFFIXES}
    groups: dict[str, list[str]] = {p: [] for p in prefixes}
    for n in names:
        if "." in n:
            p, s = n.rsplit(".", 1)
            if p in groups and (s in QUANT_SUFFIXES or s == "weight"):
                groups[p].append(n)
    return groups


def dequantize_group(
    prefix: str,
    tensors: Mapping[str, torch.Tensor],
    spec: QuantSpec | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Turn the tensors of one quantized linear into its plain weight [out, in].

    `tensors` is keyed by full names (`prefix.weight_packed`) or by bare suffixes (`weight_packed`). The format follows
    from the keys present: weight_packed -> INT4; weight + weight_scale_2 -> NVFP4; weight + weight_scale_inv -> FP8;
    a lone weight is returned as is (cast to `dtype`). The group size comes from `spec`, else from the shapes.
    """

    def get(suffix: str) -> torch.Tensor | None:
        t = tensors.get(f"{prefix}.{suffix}")
        return t if t is not None else tensors.get(suffix)

    packed, scale, weight = get("weight_packed"), get("weight_scale"), get("weight")
    if packed is not None:
        shape = get("weight_shape")
        if scale is None or shape is None:
            raise CheckpointError(f"{prefix} has weight_packed but lacks weight_scale or weight_shape")
        in_f = int(shape.reshape(-1)[1])
        group = spec.group_size if spec is not None else -(-in_f // scale.shape[1])
        return dequant_int4_pack(packed, scale, shape, group, dtype)
    if weight is None:
        raise CheckpointError(f"{prefix} has neither weight nor weight_packed")
    scale2 = get("weight_scale_2")
    if scale2 is not None:
        if scale is None:
            raise CheckpointError(f"{prefix} has weight_scale_2 but lacks weight_scale")
        group = spec.group_size if spec is not None else (2 * weight.shape[1]) // scale.shape[1]
        return dequant_nvfp4(weight, scale, scale2, group, dtype)
    scale_inv = get("weight_scale_inv")
    if scale_inv is not None:
        block = spec.group_size if spec is not None else -(-weight.shape[1] // scale_inv.shape[1])
        return dequant_fp8_block(weight, scale_inv, block, dtype)
    return weight.to(dtype)


class StreamDequantizer:
    """A `transform_checkpoint(name, tensor)` hook: dequantizes quantized linears from a stream of single tensors.

    Pieces of a quantized linear (QUANT_SUFFIXES, and a `weight` stored as uint8 NVFP4 codes or float8 FP8 codes) are
    held per prefix until the group is complete, then `prefix.weight` is yielded, dequantized to `dtype`; `input_scale`
    is dropped; every other tensor passes through unchanged. Formats follow from the tensors themselves, so a checkpoint
    works without its QuantSpec (`spec` only fixes the group size). `pending()` names what an incomplete group left.
    """

    def __init__(self, spec: QuantSpec | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.spec, self.dtype = spec, dtype
        self._held: dict[str, dict[str, torch.Tensor]] = {}

    def __call__(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        prefix, _, suffix = name.rpartition(".")
        if suffix == "input_scale":
            return []
        coded = suffix == "weight" and tensor.dtype in (torch.uint8, torch.float8_e4m3fn)
        if not (coded or suffix in QUANT_SUFFIXES):
            return [(name, tensor)]
        group = self._held.setdefault(prefix, {})
        group[suffix] = tensor
        if not _complete(group):
            return []
        del self._held[prefix]
        return [(f"{prefix}.weight", dequantize_group(prefix, group, self.spec, self.dtype))]

    def pending(self) -> list[str]:
        return [f"{p}.{s}" for p, g in self._held.items() for s in g]


def _complete(group: Mapping[str, torch.Tensor]) -> bool:
    if "weight_packed" in group:
        return "weight_scale" in group and "weight_shape" in group
    if "weight" not in group:
        return False
    if group["weight"].dtype == torch.uint8:
        return "weight_scale" in group and "weight_scale_2" in group
    return "weight_scale_inv" in group
