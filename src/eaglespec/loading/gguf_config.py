"""A GGUF file's metadata -> the Hugging Face `config.json` dict of its model, which `ModelConfig.from_hf` consumes.

Contract: `hf_config(path, metadata, tensors)` supports the `GGUF_ARCHITECTURES`; any other `general.architecture`
raises `ConfigError` (suggesting the HF folder), as does a missing required field (named with its GGUF key).

The per-architecture fields (what each GGUF architecture's metadata and tensors say, and what llama.cpp's converters
and graphs imply where the file says nothing) are read by loading/gguf_fields.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError
from .gguf_fields import (deepseek2_fields, expert_counts, gemma_fields, glm4moe_fields, gpt_oss_fields, llama3_scaling,
                          llama4_fields, olmo_fields, phi3_fields, qwen_moe_fields, window_fields)

# GGUF `general.architecture` -> the model class (models/__init__.py) its tensors load into (deepseek2: by its router)
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                      "qwen3moe": "Qwen3MoeForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM",
                      "deepseek2": "DeepseekV3ForCausalLM", "phi3": "Phi3ForCausalLM",
                      "glm4moe": "Glm4MoeForCausalLM", "gpt-oss": "GptOssForCausalLM", "gemma2": "Gemma2ForCausalLM",
                      "gemma3": "Gemma3ForCausalLM", "granite": "GraniteForCausalLM",
                      "smollm3": "SmolLM3ForCausalLM", "llama4": "Llama4ForCausalLM", "olmo2": "Olmo2ForCausalLM",
                      "olmoe": "OlmoeForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
                      "exaone4": "Exaone4ForCausalLM", "glm4": "Glm4ForCausalLM", "command-r": "CohereForCausalLM",
                      "cohere2": "Cohere2ForCausalLM"}
# GGUF architecture -> HF model_type, where they differ
_MODEL_TYPES = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "deepseek2": "deepseek_v3", "glm4moe": "glm4_moe",
               "gpt-oss": "gpt_oss", "gemma3": "gemma3_text", "command-r": "cohere",
               "llama4": "llama4_text"}
# general.file_type -> torch dtype name of the unquantized model (everything quantized dequantizes to float32).
_FILE_TYPE_DTYPE = {0: "float32", 1: "float16", 32: "bfloat16"}


def hf_config(path: Path, m: dict[str, Any], tensors: Sequence[Any]) -> dict[str, Any]:
    """The HF `config.json` dict of the GGUF at `path` (`m` its metadata, `tensors` its tensor table)."""
    arch = m.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ConfigError(
            f"GGUF architecture {arch!r} is not supported (only {', '.join(map(repr, GGUF_ARCHITECTURES))}); load "
            f"the model's Hugging Face folder instead ({path})"
        )
    dims = {t.name: t.dims for t in tensors}

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in m:
            raise ConfigError(f"{path} lacks the GGUF metadata field '{arch}.{key}'")
        return m[f"{arch}.{key}"]

    def per_layer(key: str, value: Any) -> int:
        # Some files store head counts per layer; we need them uniform.
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise ConfigError(f"{path}: per-layer '{arch}.{key}' values differ, which is not supported")
            value = value[0]
        return int(value)

    hidden = int(need("embedding_length"))
    heads = per_layer("attention.head_count", need("attention.head_count"))
    kv_heads = per_layer("attention.head_count_kv", m.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = m.get(f"{arch}.attention.key_length") or m.get(f"{arch}.rope.dimension_count") or hidden // heads
    # The embedding's rows are what the weights need; the token list and metadata normally agree with them.
    tokens = m.get("tokenizer.ggml.tokens")
    embd = dims.get("token_embd.weight")
    vocab = int(embd[-1]) if embd is not None else len(tokens) if tokens else m.get(f"{arch}.vocab_size")
    if vocab is None:
        raise ConfigError(f"{path} has neither a token_embd tensor nor a vocabulary")
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
        "attention_bias": "blk.0.attn_q.bias" in dims,
        "mlp_bias": "blk.0.ffn_down.bias" in dims,  # (ERNIE 4.5's use_bias: the MLP's too)
        "tie_word_embeddings": "output.weight" not in dims,
        "torch_dtype": _FILE_TYPE_DTYPE.get(int(m.get("general.file_type", -1)), "float32"),
    }
    if arch in ("qwen3moe", "qwen2moe"):
        cfg.update(qwen_moe_fields(path, arch, m, dims, need))
    elif arch == "phi3":
        cfg.update(phi3_fields(path, m, tensors, hidden // heads))
    elif arch == "deepseek2":
        cfg.update(deepseek2_fields(path, m, dims, need, heads))
    elif arch == "glm4moe":
        cfg.update(glm4moe_fields(path, m, dims, need, hidden // heads))
    elif arch == "gpt-oss":
        cfg.update(gpt_oss_fields(path, m, need, int(cfg["head_dim"])))
    elif arch == "llama4":
        cfg.update(llama4_fields(path, m, need))
    elif arch in ("olmo2", "olmoe"):
        cfg.update(olmo_fields(path, arch, m, need))
    elif arch == "exaone4":
        cfg.update(window_fields(path, arch, m, need))
    elif arch in ("command-r", "cohere2"):  # LayerNorms, scaled logits; R+'s q/k norms; R7B's windows
        cfg.update(layer_norm_eps=float(m.get(f"{arch}.attention.layer_norm_epsilon", 1e-5)),
                   logit_scale=float(need("logit_scale")), use_qk_norm="blk.0.attn_q_norm.weight" in dims,
                   **window_fields(path, arch, m, need))
    elif arch == "glm4":  # heads of key_length dims, rope.dimension_count of them rotated
        head = int(m.get("glm4.attention.key_length") or hidden // heads)
        cfg.update(head_dim=head, partial_rotary_factor=int(m.get("glm4.rope.dimension_count") or head // 2) / head)
    elif arch in ("gemma2", "gemma3"):
        cfg.update(gemma_fields(arch, m, need, hidden // heads, int(cfg["head_dim"])))
    elif arch == "granite":  # its four multipliers (models/granite.py), absent: 1 (and the default softmax scale)
        for hf_key, key in (("embedding_multiplier", "embedding_scale"), ("residual_multiplier", "residual_scale"),
                            ("attention_multiplier", "attention.scale"), ("logits_scaling", "logit_scale")):
            if f"granite.{key}" in m:
                cfg[hf_key] = float(m[f"granite.{key}"])
    elif m.get(f"{arch}.expert_count"):
        if arch != "llama":  # experts in a model class without them
            raise ConfigError(f"{path}: a {arch!r} GGUF with experts ({arch}.expert_count "
                              f"{m[f'{arch}.expert_count']}) is not supported (of the MoE GGUFs: 'llama' (Mixtral), "
                              "'qwen3moe', 'qwen2moe', 'deepseek2' and 'glm4moe')")
        experts, used = expert_counts(path, arch, need)  # Mixtral: experts of feed_forward_length in every layer
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=experts,
                   num_experts_per_tok=used)
    if "intermediate_size" in cfg:  # set by the architecture's fields (gpt-oss: its experts')
        pass
    elif arch not in ("qwen3moe", "qwen2moe") or f"{arch}.feed_forward_length" in m:  # (unused when all-sparse)
        cfg["intermediate_size"] = per_layer("feed_forward_length", need("feed_forward_length"))
    else:
        cfg["intermediate_size"] = cfg["moe_intermediate_size"]
    scaling = m.get(f"{arch}.rope.scaling.type")
    freqs = next((t for t in tensors if t.name == "rope_freqs.weight"), None)
    if "rope_scaling" in cfg:  # set by the architecture's fields (phi3's LongRoPE)
        pass
    elif freqs is not None:
        cfg["rope_scaling"] = llama3_scaling(path, freqs, cfg["head_dim"], cfg["rope_theta"],
                                              int(m.get(f"{arch}.rope.scaling.original_context_length", 8192)))
    elif scaling not in (None, "none"):
        if scaling not in ("linear", "yarn"):
            raise ConfigError(f"{path}: GGUF rope scaling {scaling!r} is not supported")
        cfg["rope_scaling"] = {
            "rope_type": scaling,
            "factor": float(m.get(f"{arch}.rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(
                m.get(f"{arch}.rope.scaling.original_context_length", cfg["max_position_embeddings"])
            ),
        }
        for key in ("beta_fast", "beta_slow"):
            if f"{arch}.rope.scaling.yarn_{key}" in m:
                cfg["rope_scaling"][key] = float(m[f"{arch}.rope.scaling.yarn_{key}"])
        if arch == "gpt-oss" and scaling == "yarn":  # the model's YaRN keeps its correction range unrounded
            cfg["rope_scaling"]["truncate"] = False
        if arch == "deepseek2" and scaling == "yarn":
            mscale = float(m.get(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
            cfg["rope_scaling"].update(mscale=mscale, mscale_all_dim=mscale, attention_factor=1.0)
    for hf_key, gguf_key in (
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ):
        if gguf_key in m:
            cfg[hf_key] = int(m[gguf_key])
    return cfg


