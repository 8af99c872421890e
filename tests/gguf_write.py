"""Helpers for the GGUF files the tests write with `gguf.GGUFWriter`: a tensor quantized as a file holds it, the three
writes that finish a file, the metadata and tensors every decoder file holds, and the tensor names transformers' own
checkpoint of a model has (what a GGUF's tensors must be named as for `eaglespec convert` to write that
architecture's folder)."""

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


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to a `llama` (or `granite`) file's q / k rows (halves -> interleaved pairs)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_common(w: gguf.GGUFWriter, c, sd: dict[str, np.ndarray], head: bool = True) -> None:
    """What every decoder file holds, from a transformers config `c` and its state dict `sd` (float32 numpy): the
    sizes, heads, norm epsilon and RoPE base, the embedding, the final norm and (`head`) the untied head."""
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    if getattr(c, "rms_norm_eps", None) is not None:  # (LayerNorm models, Cohere's: their writers add theirs)
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters  # transformers 5's, or keyed by layer type (OLMo 3's, Gemma 3's): the full layers'
    w.add_rope_freq_base(rope["rope_theta"] if "rope_theta" in rope else rope["full_attention"]["rope_theta"])
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if head:
        w.add_tensor("output.weight", sd["lm_head.weight"])


def start_file(path: Path, arch: str, ref, head: bool = True,
               sd: dict[str, np.ndarray] | None = None) -> tuple[gguf.GGUFWriter, dict[str, np.ndarray]]:
    """A writer of an `arch` file at `path` holding what every decoder file of the transformers model `ref` holds
    (`add_common`; `head`: the untied head), its feed-forward length and, where its config names a head_dim, its key
    length (as llama.cpp's converter), with the state dict it read them from (`sd`, else ref's as float32 numpy) for
    the caller's layers."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()} if sd is None else sd
    w = gguf.GGUFWriter(str(path), arch)
    add_common(w, c, sd, head)
    w.add_feed_forward_length(c.intermediate_size)
    if getattr(c, "head_dim", None):
        w.add_key_length(c.head_dim)
    return w, sd


def add_llama_layers(w: gguf.GGUFWriter, c, sd: dict[str, np.ndarray]) -> None:
    """Every layer of a Llama-layout model as llama.cpp's LlamaModel writes it (q / k rows permuted,
    `llama_cpp_permute`), with the feed-forward length."""
    w.add_feed_forward_length(c.intermediate_size)
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for g, h in (("attn_norm", "input_layernorm"), ("attn_v", "self_attn.v_proj"),
                     ("attn_output", "self_attn.o_proj"), ("ffn_norm", "post_attention_layernorm"),
                     ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")):
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{h}.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", llama_cpp_permute(sd[f"{pre}self_attn.q_proj.weight"],
                                                                 c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", llama_cpp_permute(sd[f"{pre}self_attn.k_proj.weight"],
                                                                 c.num_key_value_heads))


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
