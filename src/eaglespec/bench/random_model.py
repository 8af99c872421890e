"""Models of a given shape with random weights: measure kernels and step costs without a checkpoint.

Contract:
- `random_model(shape, device, dtype, seed)` -> `LoadedModel` (no tokenizer). `shape` is a preset name (`PRESETS`:
  llama-3.1-8b, smollm2-135m, qwen3-30b-a3b, kimi-k2.5-slice, gpt-oss-20b, qwen2.5-7b) or the path of a Hugging Face
  `config.json`.
  The model is built on the meta device under the target dtype (DESIGN.md principle 7), then materialised on the device
  (`to_empty`, shared parameters re-tied) and filled there: matrices ~ N(0, std), RMSNorm weights 1 (Cohere's
  LayerNorm's too; Gemma's offsets 0), other vectors and persistent buffers 0, then `reset_buffers()` recomputes the
  derived ones (RoPE).
  Nothing goes through host memory, so an 8B shape takes seconds on a GPU.
- `random_drafter(target_config, device, dtype, seed)` -> an EAGLE-3 drafter of the target's shape (one layer of the
  target's width and heads, a random draft vocabulary of up to 32000 tokens), filled the same way. Its proposals are
  almost never accepted, so a benchmark with it is a lower bound: the engine's full speculative cost for ~1 token per
  step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..layers.norm import BiasFreeLayerNorm, RMSNorm
from ..loading.checkpoint import LoadedModel, build_on_meta, check_device_room

LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
}

SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}

# Qwen/Qwen3-30B-A3B's config.json (the fields our model reads): 128 experts, 8 routed per token, every layer sparse;
# 30.5B parameters, ~61 GB in bf16 (an H100's 80 GB holds it with a small cache): a MoE target's step costs
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu", "use_sliding_window": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}

# Kimi-K2.5's language model (REFERENCE.md §6: DeepSeek-V3's architecture at Kimi's width, MLA, 384 experts top-8 + 1
# shared) cut to three layers: the dense first layer and two MoE layers (benchmarks/kimi_slice.py's slice), 36.97B
# parameters, 74 GB in bf16: for an H200 (the grouped experts stack each layer through host memory where the device
# lacks room for a second copy of its 34 GB of experts)
KIMI_K25_SLICE: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "num_hidden_layers": 3, "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827, "intermediate_size": 18432, "vocab_size": 163840,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 262144, "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
}

# openai/gpt-oss-20b's config.json (the fields our model reads): 32 clamped-SwiGLU experts with biases, 4 a token,
# sinks, every other layer a 128-token window; 20.9B parameters, ~42 GB in bf16 (the release's MXFP4 experts widened)
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12, "attention_bias": True,
    "swiglu_limit": 7.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096}, "rope_theta": 150000.0,
    "eos_token_id": 200002, "pad_token_id": 199999, "torch_dtype": "bfloat16",
}

# Qwen/Qwen2.5-7B-Instruct's config.json (the fields our model reads): a dense target whose q/k/v carry biases (the
# GEMV kernel's bias epilogue), 28 heads over 4 KV heads of 128; 7.62B parameters, ~15 GB in bf16
QWEN2_5_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

PRESETS: dict[str, dict[str, Any]] = {"llama-3.1-8b": LLAMA_3_1_8B, "smollm2-135m": SMOLLM2_135M,
                                      "qwen3-30b-a3b": QWEN3_30B_A3B, "kimi-k2.5-slice": KIMI_K25_SLICE,
                                      "gpt-oss-20b": GPT_OSS_20B, "qwen2.5-7b": QWEN2_5_7B}

INIT_STD = 0.02
DRAFT_VOCAB = 32000


def shape_config(shape: str) -> dict[str, Any]:
    """The config dict of a preset name or a config.json path."""
    if shape in PRESETS:
        return dict(PRESETS[shape])
    p = Path(shape)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(
            f"--random-weights {shape!r} is neither a preset ({', '.join(PRESETS)}) nor an existing config.json"
        )
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p} is not a JSON object")
    return d


@torch.no_grad()
def materialize_random(model: nn.Module, device: torch.device, seed: int = 0, std: float = INIT_STD) -> nn.Module:
    """Allocate a meta-built model on `device` and fill it in place (see the module docstring)."""
    shared: dict[int, list[tuple[nn.Module, str]]] = {}  # to_empty off the meta device unties shared parameters
    for mod in model.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                shared.setdefault(id(p), []).append((mod, name))
    model.to_empty(device=device)
    for owners in shared.values():
        first = owners[0][0]._parameters[owners[0][1]]
        for mod, name in owners[1:]:
            mod._parameters[name] = first
    g = torch.Generator(device=device).manual_seed(seed)
    # weights that multiply a normalised row: 1 (Gemma's OffsetRMSNorm stores an offset from 1: it stays 0)
    norms = {id(m.weight) for m in model.modules() if isinstance(m, (RMSNorm, BiasFreeLayerNorm))}
    for p in model.parameters():
        if id(p) in norms:
            p.fill_(1.0)
        elif p.dim() >= 2:
            p.normal_(0.0, std, generator=g)
        else:
            p.zero_()
    for mod in model.modules():
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                b.zero_()
    if hasattr(model, "reset_buffers"):
        model.reset_buffers()
    model.requires_grad_(False)
    return model.eval()


def random_model(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    from ..models import get_model_class

    d = shape_config(shape)
    config = ModelConfig.from_hf(d)
    meta = build_on_meta(get_model_class(config.architecture), config, dtype)
    check_device_room(meta, device, f"--random-weights {shape}")
    model = materialize_random(meta, device, seed)
    return LoadedModel(model=model, config=config, tokenizer=None, path=Path(shape))


def drafter_config(target: ModelConfig, draft_vocab: int = DRAFT_VOCAB) -> ModelConfig:
    """A one-layer EAGLE-3 drafter config of the target's width (Llama attention even for an MLA target)."""
    head_dim = target.head_dim if target.mla is None else 128
    heads = target.num_attention_heads if target.mla is None else max(1, target.hidden_size // head_dim)
    kv_heads = target.num_key_value_heads if target.mla is None else heads
    d: dict[str, Any] = dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=target.vocab_size,
        hidden_size=target.hidden_size, intermediate_size=target.intermediate_size, num_hidden_layers=1,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=target.max_position_embeddings, rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope.theta, target_hidden_size=target.hidden_size, tie_word_embeddings=False,
    )
    if target.rope.to_hf() is not None:
        d["rope_scaling"] = target.rope.to_hf()
    if draft_vocab < target.vocab_size:
        d["draft_vocab_size"] = draft_vocab
    return ModelConfig.from_hf(d)


@torch.no_grad()
def random_drafter(target: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0,
                   draft_vocab: int = DRAFT_VOCAB) -> nn.Module:
    from ..models.eagle3 import LlamaForCausalLMEagle3

    cfg = drafter_config(target, draft_vocab)
    d = materialize_random(build_on_meta(LlamaForCausalLMEagle3, cfg, dtype), device, seed + 1)
    if d.has_own_head:  # a random draft vocabulary: draft id i -> target id keep[i]
        g = torch.Generator(device=device).manual_seed(seed + 2)
        V, Vd = target.vocab_size, d.draft_vocab_size
        keep = torch.randperm(V, generator=g, device=device)[:Vd].sort().values
        d.d2t.copy_(keep - torch.arange(Vd, device=device))
        d.t2d.zero_()
        d.t2d[keep] = True
    return d
