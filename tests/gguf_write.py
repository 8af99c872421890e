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


# where each K-quant block holds its float16 super-block scales (d, and dmin where it has one), by type
_K_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_k_quant(shape: tuple[int, ...], qtype: gguf.GGMLQuantizationType, seed: int,
                   scale: float = 1e-4) -> np.ndarray:
    """Random blocks of a K-quant type (gguf cannot quantize to them), their float16 super-block scales set to
    `scale` so that the weights stay small: uint8 [*shape[:-1], bytes per row]."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = np.random.default_rng(seed).integers(0, 256, (*shape[:-1], shape[-1] // block, size), dtype=np.uint8)
    d = _f16_bytes(np.array(scale))
    for at in _K_SCALES[qtype.name]:
        blocks[..., at : at + 2] = d
    return blocks.reshape(*shape[:-1], -1)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    """float [...] -> uint8 [..., 2]: little-endian float16."""
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(*x.shape, 2)


def _k_scale_bytes(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K / Q5_K's 8 six-bit scales and 8 six-bit mins [..., 8] -> their 12 bytes (llama.cpp's packing)."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    out = np.zeros((*sc.shape[:-1], 12), np.uint8)
    out[..., 0:4] = (sc[..., :4] & 0x3F) | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = (m[..., :4] & 0x3F) | ((m[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 0x0F) | ((m[..., 4:] & 0x0F) << 4)
    return out


def quantize_k(arr: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """float32 [..., n] (n a multiple of 256) -> the blocks of Q4_K, Q5_K or Q6_K that llama.cpp's layouts hold, by a
    plain quantizer (each sub-block's range to 15 / 31 levels above its minimum, or its largest magnitude to -32 for
    Q6_K; scales and mins rounded to 6 / 8 bits of the super-block's; not llama.cpp's search, the same format):
    uint8 [..., bytes per row]."""
    x = arr.astype(np.float32).reshape(-1, 256)
    nb = x.shape[0]
    if qtype.name == "Q6_K":
        sub = x.reshape(nb, 16, 16)
        at = np.abs(sub).argmax(-1)
        big = np.take_along_axis(sub, at[..., None], -1)[..., 0]  # the signed value of largest magnitude
        scale = big / -32
        d = np.abs(scale).max(-1, keepdims=True) / 127
        sc = np.where(d > 0, np.round(scale / np.where(d > 0, d, 1)), 0).clip(-128, 127)
        step = (d * sc)[..., None].astype(np.float32)
        u = (np.where(step != 0, np.round(sub / np.where(step != 0, step, 1)), 0).clip(-32, 31) + 32).astype(np.uint8)
        u = u.reshape(nb, 2, 128)
        ql = (u[..., :64] & 15) | ((u[..., 64:] & 15) << 4)
        qh = (u[..., :32] >> 4) | ((u[..., 32:64] >> 4) << 2) | ((u[..., 64:96] >> 4) << 4) | ((u[..., 96:] >> 4) << 6)
        out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.astype(np.int8).view(np.uint8),
                              _f16_bytes(d[:, 0])], -1)
    else:
        top = 15 if qtype.name == "Q4_K" else 31
        sub = x.reshape(nb, 8, 32)
        lo = np.minimum(sub.min(-1), 0)
        scale, mins = (sub.max(-1) - lo) / top, -lo
        d, dmin = scale.max(-1, keepdims=True) / 63, mins.max(-1, keepdims=True) / 63
        sc = np.where(d > 0, np.round(scale / np.where(d > 0, d, 1)), 0).clip(0, 63)
        m = np.where(dmin > 0, np.round(mins / np.where(dmin > 0, dmin, 1)), 0).clip(0, 63)
        d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
        step, low = (d16 * sc)[..., None], (dmin16 * m)[..., None]
        q = np.where(step > 0, np.round((sub + low) / np.where(step > 0, step, 1)), 0).clip(0, top).astype(np.uint8)
        pairs = q.reshape(nb, 4, 2, 32)
        qs = ((pairs[:, :, 0] & 15) | ((pairs[:, :, 1] & 15) << 4)).reshape(nb, 128)
        head = [_f16_bytes(d[:, 0]), _f16_bytes(dmin[:, 0]), _k_scale_bytes(sc, m)]
        if top == 31:  # Q5_K: bit j of byte i is element 32 j + i's fifth bit
            bits = (q.reshape(nb, 8, 32) >> 4) & 1
            head.append((bits << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1).astype(np.uint8))
        out = np.concatenate([*head, qs], -1)
    return out.reshape(*arr.shape[:-1], -1)


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
