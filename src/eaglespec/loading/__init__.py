"""Checkpoint and tokenizer loading: HF folders (safetensors, sharded), GGUF files, the embedded default model.

Public API: `load_model(path, device, dtype) -> LoadedModel`, `load_config`, `load_tokenizer`, `BaseTokenizer`,
`Tokenizer`, `IncrementalDetokenizer`, `convert_gguf`, `default_model_path`, and the safetensors helpers
`iter_safetensors` / `save_safetensors` / `save_safetensors_sharded`.
"""

from __future__ import annotations

from .checkpoint import Checkpoint, LoadedModel, load_config, load_model, load_weights
from .convert import convert_gguf
from .default import default_model_path
from .detokenizer import IncrementalDetokenizer
from .gguf_reader import GGUFFile
from .safetensors_io import iter_safetensors, load_safetensors, save_safetensors, save_safetensors_sharded
from .tokenizer import BaseTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "BaseTokenizer",
    "Checkpoint",
    "GGUFFile",
    "IncrementalDetokenizer",
    "LoadedModel",
    "Tokenizer",
    "convert_gguf",
    "default_model_path",
    "iter_safetensors",
    "load_config",
    "load_model",
    "load_safetensors",
    "load_tokenizer",
    "load_weights",
    "save_safetensors",
    "save_safetensors_sharded",
]
