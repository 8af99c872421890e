"""GGUF files (llama.cpp): metadata, an HF config dict, and dequantized tensors under HF names.

Contract:
- `GGUFFile(path)` reads the header once (`gguf_header.read_header`: the file memory-mapped, the metadata parsed
  with `struct`, about 0.1 s where `gguf.GGUFReader` took 4.8 s); a missing, unreadable, corrupt or truncated file
  raises `CheckpointError` naming it and the reason.
- `metadata` holds every key/value field as plain Python values (strings, numbers, lists); `tensors` the tensor
  table (`gguf_header.GGUFTensor`).
- `hf_config()` builds the `config.json` dict of the model (the `llama`, `qwen2`, `qwen3` and `qwen3moe` GGUF
  architectures, `GGUF_ARCHITECTURES`; others raise `ConfigError`), which `ModelConfig.from_hf` consumes unchanged.
  `qwen3moe` (llama.cpp's Qwen3-MoE): `expert_count` and `expert_used_count` are required, `expert_feed_forward_length`
  gives `moe_intermediate_size` (else the stacked gate tensor's rows); every layer is sparse (llama.cpp's qwen3moe
  requires a router in each: `decoder_sparse_step` 1, no `mlp_only_layers`) and `norm_topk_prob` is True, since
  llama.cpp's qwen3moe graph always renormalises the top-k weights (no GGUF key says otherwise; it reads no
  `expert_weights_norm` for this architecture), as Qwen3-MoE's released configs do.
- `hf_tensors()` yields `(hf_name, float32 tensor)` one tensor at a time: dequantized (F32, F16, BF16, Q8_0, Q4_0,
  Q4_1, Q4_K, Q6_K; any other type raises `CheckpointError` before anything is yielded), renamed through the one
  table in `gguf_names.py`, with llama.cpp's q/k permutation undone (`llama` files: Qwen's keep the HF layout), and
  stacked expert tensors split into one tensor per expert, each dequantized from its own rows of the file.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import CheckpointError, ConfigError
from .gguf_header import read_header
from .gguf_names import PERMUTED_ARCHS, expert_names, gguf_to_hf_name, unpermute_qk
from .gguf_quants import dequantize

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")

# general.file_type -> torch dtype name of the unquantized model (everything quantized dequantizes to float32).
_FILE_TYPE_DTYPE = {0: "float32", 1: "float16", 32: "bfloat16"}

GGUF_MAGIC = b"GGUF"


def is_gguf(path: str | Path) -> bool:
    """True for an existing file that starts with the GGUF magic (or is named *.gguf)."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    with p.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


# GGUF `general.architecture` -> the model class (models/__init__.py) its tensors load into
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                      "qwen3moe": "Qwen3MoeForCausalLM"}
# GGUF architecture -> HF model_type, where they differ
_MODEL_TYPES = {"qwen3moe": "qwen3_moe"}


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path} does not exist")
        try:
            self.header = read_header(self.path)
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"{self.path} is not a readable GGUF file: it is corrupt or truncated ({e})"
            ) from None
        self.tensors = self.header.tensors

    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.metadata

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointError(f"{self.path} has no general.architecture metadata")
        return arch

    @cached_property
    def tensor_names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def hf_config(self) -> dict[str, Any]:
        """The HF `config.json` dict of this model."""
        arch = self.architecture
        if arch not in GGUF_ARCHITECTURES:
            raise ConfigError(
                f"GGUF architecture {arch!r} is not supported (only {', '.join(map(repr, GGUF_ARCHITECTURES))}); load "
                f"the model's Hugging Face folder instead ({self.path})"
            )
        m = self.metadata

        def need(key: str) -> Any:
            if f"{arch}.{key}" not in m:
                raise ConfigError(f"{self.path} lacks the GGUF metadata field '{arch}.{key}'")
            return m[f"{arch}.{key}"]

        def per_layer(key: str, value: Any) -> int:
            # Some files store head counts per layer; we need them uniform.
            if isinstance(value, list):
                if len(set(value)) != 1:
                    raise ConfigError(f"{self.path}: per-layer '{arch}.{key}' values differ, which is not supported")
                value = value[0]
            return int(value)

        hidden = int(need("embedding_length"))
        heads = per_layer("attention.head_count", need("attention.head_count"))
        kv_heads = per_layer("attention.head_count_kv", m.get(f"{arch}.attention.head_count_kv", heads))
        head_dim = m.get(f"{arch}.attention.key_length") or m.get(f"{arch}.rope.dimension_count") or hidden // heads
        # The embedding's rows are what the weights need; the token list and metadata normally agree with them.
        embd = next((t for t in self.tensors if t.name == "token_embd.weight"), None)
        tokens = m.get("tokenizer.ggml.tokens")
        vocab = int(embd.dims[-1]) if embd is not None else len(tokens) if tokens else m.get(f"{arch}.vocab_size")
        if vocab is None:
            raise ConfigError(f"{self.path} has neither a token_embd tensor nor a vocabulary")
        cfg: dict[str, Any] = {
            "architectures": [GGUF_ARCHITECTURES[arch]],
            "model_type": _MODEL_TYPES.get(arch, arch),
            "hidden_size": hidden,
            "num_hidden_layers": int(need("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": int(head_dim),
            "max_position_embeddings": int(m.get(f"{arch}.context_length", 4096)),
            "rms_norm_eps": float(m.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            "rope_theta": float(m.get(f"{arch}.rope.freq_base", 10000.0)),
            "vocab_size": int(vocab),
            "hidden_act": "silu",
            "attention_bias": "blk.0.attn_q.bias" in self.tensor_names,
            "mlp_bias": False,
            "tie_word_embeddings": "output.weight" not in self.tensor_names,
            "torch_dtype": _FILE_TYPE_DTYPE.get(int(m.get("general.file_type", -1)), "float32"),
        }
        if arch == "qwen3moe":
            cfg.update(self._qwen3moe_fields(need))
        elif m.get(f"{arch}.expert_count"):  # Mixtral-style `llama` files: experts in a model class without them
            raise ConfigError(f"{self.path}: a {arch!r} GGUF with experts ({arch}.expert_count "
                              f"{m[f'{arch}.expert_count']}) is not supported (of the MoE GGUFs, only 'qwen3moe')")
        if arch != "qwen3moe" or f"{arch}.feed_forward_length" in m:  # (unused by an all-sparse Qwen3-MoE)
            cfg["intermediate_size"] = per_layer("feed_forward_length", need("feed_forward_length"))
        else:
            cfg["intermediate_size"] = cfg["moe_intermediate_size"]
        scaling = m.get(f"{arch}.rope.scaling.type")
        if scaling not in (None, "none"):
            if scaling not in ("linear", "yarn"):
                raise ConfigError(f"{self.path}: GGUF rope scaling {scaling!r} is not supported")
            cfg["rope_scaling"] = {
                "rope_type": scaling,
                "factor": float(m.get(f"{arch}.rope.scaling.factor", 1.0)),
                "original_max_position_embeddings": int(
                    m.get(f"{arch}.rope.scaling.original_context_length", cfg["max_position_embeddings"])
                ),
            }
        for hf_key, gguf_key in (
            ("bos_token_id", "tokenizer.ggml.bos_token_id"),
            ("eos_token_id", "tokenizer.ggml.eos_token_id"),
            ("pad_token_id", "tokenizer.ggml.padding_token_id"),
        ):
            if gguf_key in m:
                cfg[hf_key] = int(m[gguf_key])
        return cfg

    def _qwen3moe_fields(self, need: Any) -> dict[str, Any]:
        """The MoE fields of a `qwen3moe` file (see the module docstring)."""
        experts, used = int(need("expert_count")), int(need("expert_used_count"))
        if experts <= 0 or not 0 < used <= experts:
            raise ConfigError(f"{self.path}: qwen3moe needs 0 < expert_used_count ({used}) <= expert_count ({experts})")
        size = self.metadata.get("qwen3moe.expert_feed_forward_length")
        if size is None:
            gate = next((t for t in self.tensors if t.name == "blk.0.ffn_gate_exps.weight"), None)
            if gate is None:
                raise ConfigError(f"{self.path} has neither 'qwen3moe.expert_feed_forward_length' nor the tensor "
                                  "blk.0.ffn_gate_exps.weight to read the experts' size from")
            size = gate.dims[1]  # GGUF dims (H, I, E)
        return {"num_experts": experts, "num_experts_per_tok": used, "moe_intermediate_size": int(size),
                "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}

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
        for t in self.tensors:
            name, kind = gguf_to_hf_name(t.name)
            shape = tuple(reversed(t.dims))  # GGUF lists dims innermost first
            if kind == "experts":  # [E, rows, cols]: one tensor per expert, each dequantized from its own rows
                if len(shape) != 3:
                    raise CheckpointError(f"{self.path}: expert tensor {t.name!r} has shape {shape}, not [E, rows, "
                                          "cols]")
                for e, expert_name in enumerate(expert_names(name, shape[0])):
                    yield expert_name, self._dequantize(t, t.data[e], shape[1:])
                continue
            w = self._dequantize(t, t.data, shape)
            if kind in ("q", "k") and self.architecture in PERMUTED_ARCHS:
                w = unpermute_qk(w, n_heads[kind]).contiguous()
            yield name, w

    def _dequantize(self, t: Any, data: Any, shape: tuple[int, ...]) -> torch.Tensor:
        try:
            return dequantize(data, t.qtype).reshape(shape)  # a new float32 tensor, not a view of the file
        except (ValueError, RuntimeError) as e:
            raise CheckpointError(f"{self.path}: tensor {t.name!r} is corrupt ({e})") from None
