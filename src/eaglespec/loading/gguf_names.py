"""llama.cpp tensor names -> Hugging Face names: the one GGUF name table, and the q/k un-permutation.

`GGUF_TO_HF` maps every tensor name of a `llama`, `qwen2` or `qwen3` GGUF to the HF name that `models/llama.py` and
`models/qwen.py` keep (Qwen3's per-head q/k norms: `attn_q_norm`, `attn_k_norm`). Its third column says which weights
llama.cpp permutes for its RoPE layout in a `llama` GGUF (`q`: by attention heads, `k`: by KV heads); `unpermute_qk`
undoes that so the weights match the HF rotate-halves layout. Qwen's GGUFs keep the HF layout (llama.cpp runs their
RoPE on halves, NEOX style): the reader unpermutes `llama` files only (`PERMUTED_ARCHS`).
"""

from __future__ import annotations

import re
from typing import TypeVar

import numpy as np
import torch

from ..errors import CheckpointError

T = TypeVar("T", np.ndarray, torch.Tensor)

# (GGUF name regex, HF name template, permutation: None | "q" | "k")
GGUF_TO_HF: tuple[tuple[str, str, str | None], ...] = (
    (r"token_embd\.weight", "model.embed_tokens.weight", None),
    (r"output_norm\.weight", "model.norm.weight", None),
    (r"output\.weight", "lm_head.weight", None),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", r"model.layers.\1.self_attn.q_proj.\2", "q"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", r"model.layers.\1.self_attn.k_proj.\2", "k"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", r"model.layers.\1.self_attn.v_proj.\2", None),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2", None),
    (r"blk\.(\d+)\.ffn_gate\.(weight|bias)", r"model.layers.\1.mlp.gate_proj.\2", None),
    (r"blk\.(\d+)\.ffn_up\.(weight|bias)", r"model.layers.\1.mlp.up_proj.\2", None),
    (r"blk\.(\d+)\.ffn_down\.(weight|bias)", r"model.layers.\1.mlp.down_proj.\2", None),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight", None),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight", None),
    (r"blk\.(\d+)\.attn_q_norm\.weight", r"model.layers.\1.self_attn.q_norm.weight", None),
    (r"blk\.(\d+)\.attn_k_norm\.weight", r"model.layers.\1.self_attn.k_norm.weight", None),
)
# GGUF architectures whose q/k weights llama.cpp permuted (interleaved RoPE pairs)
PERMUTED_ARCHS = frozenset({"llama"})

_COMPILED = tuple((re.compile(p), repl, perm) for p, repl, perm in GGUF_TO_HF)


def gguf_to_hf_name(name: str) -> tuple[str, str | None]:
    """(HF name, permutation kind) of a GGUF tensor name; CheckpointError for a name we do not know."""
    for pattern, repl, perm in _COMPILED:
        m = pattern.fullmatch(name)
        if m:
            return m.expand(repl), perm
    if name == "rope_freqs.weight":
        raise CheckpointError(
            "this GGUF stores Llama-3.1 RoPE scaling as a 'rope_freqs' tensor, which is not supported: "
            "load the model's Hugging Face folder instead"
        )
    raise CheckpointError(f"GGUF tensor {name!r} has no Hugging Face equivalent in our Llama / Qwen layouts")


def unpermute_qk(w: T, n_heads: int) -> T:
    """Undo llama.cpp's q/k row permutation (interleaved pairs -> halves) for `n_heads` heads.

    w: [rows, cols] weight or [rows] bias, rows = n_heads * head_dim; a numpy array or a torch tensor.
    """
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)
