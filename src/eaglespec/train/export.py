"""Writing a trained drafter in the published EAGLE-3 checkpoint format (REFERENCE.md §3).

Contract of `export_drafter(drafter, out, dtype, max_shard_mb)`:
- `out/config.json`: the drafter's HF config (drafter.py: architectures ["LlamaForCausalLMEagle3"],
  draft_vocab_size, target_hidden_size, eagle_config, tie_word_embeddings false, num_hidden_layers) with
  `torch_dtype` set to the export dtype;
- the weights with their unprefixed names (fc.weight, midlayer.*, a multi-layer drafter's layers.1.* ..., norm.weight,
  lm_head.weight, d2t, t2d; never embed_tokens), floats cast to `dtype` (bf16 by default), d2t int64, t2d bool: `model.safetensors`, or with
  `max_shard_mb` the shards `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`. A tensor cannot be
  split across safetensors files, so a limit below the largest tensor is refused up front (`check_shard_limit`,
  called before training) with the largest draft vocabulary that fits;
- earlier weight files in `out` are removed first, so a folder never mixes two exports.
The result loads with `eaglespec.api.load_drafter` and, being the published layout, with SGLang and vLLM (a
multi-layer drafter with vLLM only: SGLang's EAGLE-3 models refuse num_hidden_layers != 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import ConfigError
from ..loading.safetensors_io import INDEX_NAME, SINGLE_NAME, save_safetensors, save_safetensors_sharded

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ConfigError(f"--export-dtype must be one of {', '.join(_DTYPES)} (got {name!r})")
    return _DTYPES[name]


def largest_tensor(hf: Mapping[str, Any]) -> tuple[str, tuple[int, int]]:
    """Name and shape of the drafter's largest weight, from its HF config."""
    H, I = hf["hidden_size"], hf["intermediate_size"]
    Ht = hf.get("target_hidden_size") or H
    qd = hf["num_attention_heads"] * hf.get("head_dim", H // hf["num_attention_heads"])
    shapes = {
        "lm_head.weight": (hf.get("draft_vocab_size") or hf["vocab_size"], H),
        "fc.weight": (H, 3 * Ht),
        "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.self_attn.q_proj.weight": (qd, 2 * H),
    }
    name = max(shapes, key=lambda n: shapes[n][0] * shapes[n][1])
    return name, shapes[name]


def check_shard_limit(hf: Mapping[str, Any], dtype: torch.dtype, max_shard_mb: float | None) -> None:
    """Raise ConfigError when some weight alone exceeds the shard limit."""
    if not max_shard_mb:
        return
    limit = int(max_shard_mb * (1 << 20)) - (1 << 16)  # leave room for the file's header
    size = torch.tensor([], dtype=dtype).element_size()
    name, (rows, cols) = largest_tensor(hf)
    if rows * cols * size > limit:
        hint = ""
        if name == "lm_head.weight":
            hint = f": use --draft-vocab {limit // (cols * size)} or less"
        raise ConfigError(
            f"{name} ({rows} x {cols} in {str(dtype).removeprefix('torch.')}, "
            f"{rows * cols * size / (1 << 20):.2f} MiB) cannot fit in one file of --max-shard-mb {max_shard_mb} "
            f"(a tensor cannot be split across safetensors files){hint}"
        )


def drafter_tensors(drafter: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in drafter.state_dict().items():
        if name.startswith("embed_tokens."):
            continue
        t = t.detach().cpu()
        out[name] = t.to(dtype) if t.is_floating_point() else t
    return out


def export_drafter(drafter: torch.nn.Module, out: str | Path, dtype: torch.dtype = torch.bfloat16,
                   max_shard_mb: float | None = None) -> list[Path]:
    """Write config.json and the weights (see the module docstring); returns the weight files."""
    hf = dict(drafter.config.raw)
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    check_shard_limit(hf, dtype, max_shard_mb)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    for old in [*d.glob("*.safetensors"), d / INDEX_NAME]:
        if old.is_file():
            old.unlink()
    tensors = drafter_tensors(drafter, dtype)
    (d / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if max_shard_mb:
        limit = int(max_shard_mb * (1 << 20)) - (1 << 16)
        return save_safetensors_sharded(tensors, d, max_shard_bytes=limit)
    return [save_safetensors(tensors, d / SINGLE_NAME)]
