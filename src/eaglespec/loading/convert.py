"""GGUF -> Hugging Face folder conversion.

Contract: `convert_gguf(gguf_path, out_dir, dtype)` writes config.json, model.safetensors (or shards with an index
past `max_shard_bytes`), tokenizer.json, tokenizer_config.json (special tokens, chat_template), chat_template.jinja
and generation_config.json. The tensors are the dequantized, renamed and un-permuted ones `load_model(gguf)` uses, so
`load_model(out_dir)` gives the same logits in the same dtype; they carry the architecture's own checkpoint names
(`gguf_names.HF_RENAMES`: Mixtral's, Qwen2-MoE's, Phi-3's fused projections), so transformers loads the folder too.
Tied embeddings are written once (no lm_head.weight).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .gguf_reader import GGUFFile
from .gguf_tokenizer import tokenizer_from_gguf
from .safetensors_io import SINGLE_NAME, save_safetensors, save_safetensors_sharded


def convert_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Write the HF folder of a GGUF model; returns `out_dir`."""
    gguf = GGUFFile(gguf_path)
    config = gguf.hf_config()
    tensors = {name: t.to(dtype) for name, t in gguf.hf_tensors()}
    tokenizer = tokenizer_from_gguf(gguf)  # before writing anything: an unsupported tokenizer leaves no half folder

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    meta = {"source": Path(gguf_path).name}
    if sum(t.numel() * t.element_size() for t in tensors.values()) > max_shard_bytes:
        save_safetensors_sharded(tensors, out, max_shard_bytes, meta)
    else:
        save_safetensors(tensors, out / SINGLE_NAME, meta)
    tokenizer.save(out)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    if len(tokenizer.eos_token_ids) > 1:  # chat end tokens stop generation too
        generation["eos_token_id"] = list(tokenizer.eos_token_ids)
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out
