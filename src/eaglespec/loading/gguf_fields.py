"""Per-architecture fields of a GGUF file's HF `config.json` dict, for `gguf_config.hf_config`: each reader takes the
file's metadata (and tensors where they say more) and returns the fields its architecture adds to the common ones.

- `llama`, `qwen2`, `qwen3`: the common fields (sizes, heads, RoPE and its linear / yarn scaling, norms, special ids;
  the vocabulary size from the embedding's rows). Llama 3.1 - 3.3 files carry their RoPE scaling as a `rope_freqs`
  tensor of per-frequency factors: read back into the `llama3` rope_scaling it came from (`llama3_scaling`). A
  `llama` file with experts (`expert_count`, `expert_used_count`) is Mixtral (`MixtralForCausalLM`: every layer's
  experts of `feed_forward_length`); a `qwen2` / `qwen3` one is refused.
- `qwen3moe` (llama.cpp's Qwen3-MoE): `expert_count` and `expert_used_count` are required,
  `expert_feed_forward_length` gives `moe_intermediate_size` (else the stacked gate tensor's rows); every layer is
  sparse (llama.cpp's qwen3moe requires a router in each: `decoder_sparse_step` 1, no `mlp_only_layers`) and
  `norm_topk_prob` is True, since llama.cpp's qwen3moe graph always renormalises the top-k weights (no GGUF key says
  otherwise), as Qwen3-MoE's released configs do. `qwen2moe` (Qwen2-MoE): the same with the weights not
  renormalised (llama.cpp's qwen2moe graph, Qwen2-MoE's configs) and the shared expert of
  `expert_shared_feed_forward_length` (`ffn_*_shexp`, gated by `ffn_gate_inp_shexp`).
- `phi3` (Phi-3, Phi-4): `phi3_fields` (sliding window, LongRoPE from its factor tensors); the fused `attn_qkv` and
  `ffn_up` (gate and up) load into models/phi3.py, which splits them.
- `glm4moe` (GLM-4.5 / 4.6 / 4.7; facts from llama.cpp's converter `Glm4MoeModel`): `block_count` counts the MTP
  layers too (`nextn_predict_layers`, after the others: ignored, as models/glm4_moe.py ignores them in HF folders),
  heads of `attention.key_length` dims of which `rope.dimension_count` are rotated (partial RoPE), q/k head norms
  when the file has them, and DeepSeek-V3's router over `expert_count` experts with `expert_shared_count` shared ones
  after `leading_dense_block_count` dense layers, `expert_weights_scale` / `expert_weights_norm` as for deepseek2;
  the gating must be sigmoid with the correction bias `exp_probs_b`. llama.cpp routes glm4moe without expert groups,
  so the dict says one.
- `olmo2` (OLMo 2 and 3; llama.cpp's Olmo2Model: q / k not permuted, post-norm layers whose norms are
  `post_attention_norm` / `post_ffw_norm`, RMSNorms over the whole q and k projections): with
  `attention.sliding_window` it is OLMo 3 (`Olmo3ForCausalLM`), its windowed layers by `sliding_window_pattern` (the
  converter's default, every fourth layer full, where absent); OLMo 3's RoPE scaling (YaRN on its full-attention
  layers only) is refused. `olmoe` (OLMoE; llama.cpp's OlmoeModel): Qwen3-MoE's stacked experts of
  `feed_forward_length` with the whole-projection q / k norms, the top-k weights not renormalised (llama.cpp's graph,
  OLMoE's configs). `attention.clamp_kqv` (clip_qkv) is refused in both.
- `exaone4` (EXAONE 4; llama.cpp's Exaone4Model): OLMo 2's post-norm tensors with per-head q / k norms, not
  permuted; its windowed layers by `attention.sliding_window` and its pattern as for OLMo 3 (only those rotated,
  models/olmo2.py); without a window every layer global and rotated; Llama 3's RoPE scaling from `rope_freqs`.
- `glm4` (GLM-4-0414, GLM-Z1; llama.cpp's Glm4Model): q / k rows as the checkpoint's (RoPE on pairs, turned to halves
  at load by models/glm4.py), `rope.dimension_count` of each head's `attention.key_length` dims rotated, the sandwich
  norms (`post_attention_norm`, `post_ffw_norm`) and the fused gate/up as `ffn_up` (gguf_names.ARCH_GGUF_TO_HF).
- `command-r` / `cohere2` (Command R / R+, R7B / A; llama.cpp's CommandR2Model / Cohere2Model): q / k rows as the
  checkpoint's (RoPE on pairs, turned to halves at load by models/cohere.py), LayerNorms by
  `attention.layer_norm_epsilon`, `logit_scale`, R+'s per-head q / k norms where the file has them; cohere2's window
  on three layers of four (llama.cpp's fixed pattern; no pattern key is written).
- `ernie4_5` (ERNIE 4.5 dense; llama.cpp's Ernie4_5Model): Llama's tensors, q / k rows as the checkpoint's (RoPE on
  pairs: models/llama.py's Ernie4_5ForCausalLM turns them to halves at load, from a folder or a GGUF alike), biases
  where the file has them; its sentencepiece vocabulary through transformers' converter.
- `gpt-oss` (gpt-oss-20b / 120b; llama.cpp's GptOssModel): every layer's experts (`expert_count`,
  `expert_used_count`, `expert_feed_forward_length`; MXFP4 as released), the sliding window on the even layers
  (llama.cpp's pattern of 2, transformers' layer_types), q/k/v/o biases, the sink logits `attn_sinks`; the clamped
  SwiGLU's limit 7 and alpha 1.702 are llama.cpp's constants; YaRN without rounding its correction range (transformers'
  `truncate: false` for gpt-oss).
- `llama4` (Llama 4 Scout / Maverick; llama.cpp's Llama4Model): q / k NOT permuted (the HF rows, RoPE on pairs, as
  models/llama4.py permutes them at load), `expert_count` experts of `expert_feed_forward_length`, every
  `interleave_moe_layer_step`-th layer sparse with a shared expert (`ffn_*_shexp`), the dense layers'
  `feed_forward_length` (HF's intermediate_size_mlp); llama.cpp's constants: chunks of 8,192 on three layers of four,
  the fourth NoPE with the query temperature (floor 8,192, scale 0.1), q / k norms unless 128 experts (Maverick);
  `attention.sliding_window` 0 (no chunks, every layer rotated) as llama.cpp reads it. Scout's llama3 scaling (low
  and high frequency factors 1) is read back from `rope_freqs` as Llama 3's is.
- `smollm3` (llama.cpp's SmolLM3Model: a Llama file, q / k permuted; every fourth layer NoPE, llama.cpp's constant
  and transformers' default `no_rope_layer_interval`).
- `granite` (Granite 3; llama.cpp's GraniteModel, a Llama file, q / k permuted alike): `embedding_scale`,
  `residual_scale`, `attention.scale` and `logit_scale` as transformers' four multipliers.
- `gemma2` / `gemma3` (llama.cpp's Gemma2Model / Gemma3Model): the sliding window on Gemma 2's even layers and on
  all but Gemma 3's every sixth (llama.cpp's patterns), Gemma 3's local layers at base 10,000 (llama.cpp's constant;
  `rope.freq_base` and a linear `rope.scaling` are the global layers'), Gemma 2's `attn_logit_softcapping` /
  `final_logit_softcapping`, the softmax scale of `query_pre_attn_scalar` = head_dim, or hidden / heads in the 27B
  models (llama.cpp tells them by their 46 / 62 layers). The converter stored every norm weight as 1 + w (Gemma's
  RMSNorm adds the 1): the reader subtracts it again (gguf_names.NORM_SHIFTED_ARCHS); `ffn_norm` / `post_ffw_norm`
  are Gemma's pre- / post-FFN norms (gguf_names.ARCH_GGUF_TO_HF).
- `deepseek2` (llama.cpp's DeepSeek-V2 / V2-Lite / V3 / R1 and Kimi-K2 files; facts from its converter
  `DeepseekV2Model`): MLA sizes from `attention.kv_lora_rank`, `attention.q_lora_rank` (absent: no q LoRA),
  `rope.dimension_count` (qk_rope), and the per-head q / v sizes from `attention.key_length_mla` / `value_length_mla`,
  which newer files write (their `key_length` / `value_length` are then the latent cache's widths, kv_lora + rope and
  kv_lora), else `key_length` / `value_length` (older files). The converter writes `head_count_kv` 1 (MLA as one
  shared latent); the HF configs, and this dict, say every head. The router: `expert_gating_func` 2 (sigmoid) is V3's
  (noaux_tc over scores plus `exp_probs_b`, the correction bias, which such a file must hold) ->
  `DeepseekV3ForCausalLM`; 1 (softmax), or absent as in files written before the key existed (llama.cpp reads those as
  softmax), is V2's -> `DeepseekV2ForCausalLM` (group_limited_greedy when the file has more than one expert group,
  else greedy). `expert_weights_norm` (absent: False), `expert_weights_scale` (absent: 1), `expert_shared_count`,
  `leading_dense_block_count` (dense layers first), `expert_group_count` / `expert_group_used_count` (absent: 1, no
  group limit) as DeepSeek's config names them. A file without experts (all-dense MLA) loads as
  `DeepseekV3ForCausalLM` with no MoE. The RoPE dims stay in DeepSeek's interleaved pairs (llama.cpp runs deepseek2's
  RoPE on pairs), as the HF checkpoints hold them: nothing is permuted. YaRN: the converter writes
  `rope.scaling.yarn_log_multiplier` = 0.1 * `mscale_all_dim`; llama.cpp scales the softmax by `(1 +
  yarn_log_multiplier * ln(factor))^2` and leaves cos / sin unscaled, so the dict says `mscale = mscale_all_dim =
  yarn_log_multiplier / 0.1` and `attention_factor` 1.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError
from .gguf_quants import dequantize

# llama.cpp's expert_gating_func values
GATING_SOFTMAX, GATING_SIGMOID = 1, 2
LLAMA4_CHUNK = 8192  # llama.cpp's attention chunk for llama4 files (Scout's and Maverick's; not in the metadata)


def expert_counts(path: Path, arch: str, need: Callable[[str], Any]) -> tuple[int, int]:
    experts, used = int(need("expert_count")), int(need("expert_used_count"))
    if experts <= 0 or not 0 < used <= experts:
        raise ConfigError(f"{path}: {arch} needs 0 < expert_used_count ({used}) <= expert_count ({experts})")
    return experts, used


def olmo_fields(path: Path, arch: str, m: dict[str, Any], need: Callable[[str], Any]) -> dict[str, Any]:
    """The fields of an `olmo2` (OLMo 2; OLMo 3 where it has windows) or `olmoe` file (see the module docstring)."""
    if f"{arch}.attention.clamp_kqv" in m:
        raise ConfigError(f"{path}: {arch}.attention.clamp_kqv (the checkpoint's clip_qkv) is not supported")
    if arch == "olmoe":  # llama.cpp's olmoe graph never renormalises the top-k weights, as OLMoE's configs say
        experts, used = expert_counts(path, arch, need)
        return {"num_experts": experts, "num_experts_per_tok": used, "norm_topk_prob": False}
    windows = window_fields(path, arch, m, need)
    if not windows:
        return {}
    if m.get("olmo2.rope.scaling.type") not in (None, "none"):  # OLMo 3 scales its full-attention layers' only
        raise ConfigError(f"{path}: an olmo2 GGUF with windows and RoPE scaling (OLMo 3's YaRN, which transformers "
                          "applies to its full-attention layers only) is not supported; load the Hugging Face folder")
    return {"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", **windows}


def window_fields(path: Path, arch: str, m: dict[str, Any], need: Callable[[str], Any]) -> dict[str, Any]:
    """`sliding_window` and `layer_types` from `attention.sliding_window` and its `sliding_window_pattern` (True:
    windowed; absent: the converters' default, every fourth layer full); {} without a window."""
    window = m.get(f"{arch}.attention.sliding_window")
    if not window:
        return {}
    n = int(need("block_count"))
    pattern = m.get(f"{arch}.attention.sliding_window_pattern") or [(i + 1) % 4 != 0 for i in range(n)]
    if len(pattern) != n:
        raise ConfigError(f"{path}: {arch}.attention.sliding_window_pattern has {len(pattern)} entries for {n} "
                          "layers")
    return {"sliding_window": int(window),
            "layer_types": ["sliding_attention" if s else "full_attention" for s in pattern]}


def qwen_moe_fields(path: Path, arch: str, m: dict[str, Any], dims: dict[str, Any],
                     need: Callable[[str], Any]) -> dict[str, Any]:
    """The MoE fields of a `qwen3moe` / `qwen2moe` file (see the module docstring)."""
    experts, used = expert_counts(path, arch, need)
    size = m.get(f"{arch}.expert_feed_forward_length")
    if size is None:
        gate = dims.get("blk.0.ffn_gate_exps.weight")
        if gate is None:
            raise ConfigError(f"{path} has neither '{arch}.expert_feed_forward_length' nor the tensor "
                              "blk.0.ffn_gate_exps.weight to read the experts' size from")
        size = gate[1]  # GGUF dims (H, I, E)
    out = {"num_experts": experts, "num_experts_per_tok": used, "moe_intermediate_size": int(size),
           "norm_topk_prob": arch == "qwen3moe", "decoder_sparse_step": 1, "mlp_only_layers": []}
    if arch == "qwen2moe":  # the shared expert: its width from the key, else from its gate tensor's rows
        shared = m.get("qwen2moe.expert_shared_feed_forward_length")
        if shared is None and "blk.0.ffn_gate_shexp.weight" in dims:
            shared = dims["blk.0.ffn_gate_shexp.weight"][1]  # GGUF dims (H, I)
        out["shared_expert_intermediate_size"] = int(shared or 0)
    return out


def phi3_fields(path: Path, m: dict[str, Any], tensors: Sequence[Any], head_dim: int) -> dict[str, Any]:
    """A `phi3` file's fields (Phi-3, Phi-4; llama.cpp's Phi3MiniModel): heads of hidden / heads dims (its
    `rope.dimension_count` is the rotated part: less means partial RoPE, Phi-4-mini's), the sliding
    window (0: none, Phi-4), and LongRoPE from the `rope_factors_short` / `rope_factors_long` tensors over
    `rope.scaling.original_context_length` positions, with the file's `rope.scaling.attn_factor`."""
    out: dict[str, Any] = {"head_dim": head_dim}
    rotated = int(m.get("phi3.rope.dimension_count") or head_dim)
    if rotated != head_dim:
        out["partial_rotary_factor"] = rotated / head_dim
    window = int(m.get("phi3.attention.sliding_window") or 0)
    out["sliding_window"] = window or None
    factors = {t.name: dequantize(t.data, t.qtype).reshape(-1).tolist() for t in tensors
               if t.name in ("rope_factors_short.weight", "rope_factors_long.weight")}
    if factors:
        if len(factors) != 2:
            raise ConfigError(f"{path} has one of rope_factors_short / rope_factors_long without the other")
        out["rope_scaling"] = {
            "rope_type": "longrope", "short_factor": factors["rope_factors_short.weight"],
            "long_factor": factors["rope_factors_long.weight"],
            "original_max_position_embeddings": int(m.get("phi3.rope.scaling.original_context_length",
                                                          m.get("phi3.context_length", 4096))),
        }
        if m.get("phi3.rope.scaling.attn_factor") is not None:
            out["rope_scaling"]["attention_factor"] = float(m["phi3.rope.scaling.attn_factor"])
    return out


def glm4moe_fields(path: Path, m: dict[str, Any], dims: dict[str, Any], need: Callable[[str], Any],
                    default_head: int) -> dict[str, Any]:
    """A `glm4moe` file's fields (GLM-4.5 / 4.6 / 4.7; llama.cpp's Glm4MoeModel), see the module docstring."""
    head_dim = int(m.get("glm4moe.attention.key_length") or default_head)
    mtp = int(m.get("glm4moe.nextn_predict_layers") or 0)
    experts, used = expert_counts(path, "glm4moe", need)
    dense = int(m.get("glm4moe.leading_dense_block_count", 0))
    gating = int(m.get("glm4moe.expert_gating_func", GATING_SIGMOID))
    if gating != GATING_SIGMOID or f"blk.{dense}.exp_probs_b.bias" not in dims:
        raise ConfigError(f"{path}: a glm4moe file needs sigmoid expert gating (glm4moe.expert_gating_func 2, got "
                          f"{gating}) and the router's correction bias (blk.{dense}.exp_probs_b.bias)")
    return {
        "head_dim": head_dim, "num_hidden_layers": int(need("block_count")) - mtp, "num_nextn_predict_layers": mtp,
        "partial_rotary_factor": int(m.get("glm4moe.rope.dimension_count") or head_dim) / head_dim,
        "use_qk_norm": "blk.0.attn_q_norm.weight" in dims,
        # llama.cpp's glm4moe routes without groups (the released models have one)
        **routed_fields("glm4moe", m, need, experts, used, dense, n_group=1, topk_group=1),
        "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    }


def routed_fields(arch: str, m: dict[str, Any], need: Callable[[str], Any], experts: int, used: int, dense: int,
                   n_group: int, topk_group: int) -> dict[str, Any]:
    """DeepSeek's MoE fields of a `deepseek2` / `glm4moe` file (the router's kind is the caller's): the experts, the
    shared ones (`expert_shared_count`), their width, the dense layers first, the groups, and the weights' scale and
    renormalisation (`expert_weights_scale`, absent: 1; `expert_weights_norm`, absent: False)."""
    return {
        "n_routed_experts": experts, "num_experts_per_tok": used,
        "n_shared_experts": int(m.get(f"{arch}.expert_shared_count", 0)),
        "moe_intermediate_size": int(need("expert_feed_forward_length")),
        "first_k_dense_replace": dense, "n_group": n_group, "topk_group": topk_group,
        "routed_scaling_factor": float(m.get(f"{arch}.expert_weights_scale") or 1.0),
        "norm_topk_prob": bool(m.get(f"{arch}.expert_weights_norm", False)),
    }


def gpt_oss_fields(path: Path, m: dict[str, Any], need: Callable[[str], Any], head_dim: int) -> dict[str, Any]:
    """A `gpt-oss` file's fields (llama.cpp's GptOssModel), see the module docstring."""
    experts, used = expert_counts(path, "gpt-oss", need)
    n = int(need("block_count"))
    return {
        "num_local_experts": experts, "num_experts_per_tok": used,
        "intermediate_size": int(need("expert_feed_forward_length")), "head_dim": head_dim,
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
        "attention_bias": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702,  # llama.cpp's constants for gpt-oss
    }


# llama.cpp's Gemma 27B models (by their layer count), whose softmax scale is 1 / sqrt(hidden / heads) (their
# query_pre_attn_scalar) where the others' is 1 / sqrt(head_dim)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def llama4_fields(path: Path, m: dict[str, Any], need: Callable[[str], Any]) -> dict[str, Any]:
    """A `llama4` file's fields (llama.cpp's Llama4Model), see the module docstring."""
    experts, used = expert_counts(path, "llama4", need)
    # sliding_window 0: every layer full and rotated (llama.cpp's reading); else its constants for Scout / Maverick
    chunked = int(m.get("llama4.attention.sliding_window", LLAMA4_CHUNK)) != 0
    fields: dict[str, Any] = {
        "num_local_experts": experts, "num_experts_per_tok": used,
        "intermediate_size": int(need("expert_feed_forward_length")),
        "intermediate_size_mlp": int(need("feed_forward_length")),
        "interleave_moe_layer_step": int(need("interleave_moe_layer_step")),
        "use_qk_norm": experts != 128,  # llama.cpp: Maverick's 128 experts, no q / k norm
        "attention_chunk_size": LLAMA4_CHUNK if chunked else None,
        "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
    }
    if not chunked:
        fields["no_rope_layers"] = [1] * int(need("block_count"))
    return fields


def gemma_fields(arch: str, m: dict[str, Any], need: Callable[[str], Any], per_head: int,
                  head_dim: int) -> dict[str, Any]:
    """A `gemma2` / `gemma3` file's fields (llama.cpp's Gemma2Model / Gemma3Model), see the module docstring."""
    big = int(need("block_count")) == _GEMMA_27B_LAYERS[arch]
    out: dict[str, Any] = {
        "query_pre_attn_scalar": per_head if big else head_dim, "sliding_window": int(need("attention.sliding_window")),
        "hidden_activation": "gelu_pytorch_tanh",
    }
    if arch == "gemma3":  # llama.cpp's: the local layers' base 10,000, every sixth layer global
        out.update(rope_local_base_freq=10000.0, sliding_window_pattern=6)
    else:  # Gemma 2: every other layer global, its soft caps
        out.update(sliding_window_pattern=2, attn_logit_softcapping=m.get("gemma2.attn_logit_softcapping"),
                   final_logit_softcapping=m.get("gemma2.final_logit_softcapping"))
    return out


def deepseek2_fields(path: Path, m: dict[str, Any], dims: dict[str, Any], need: Callable[[str], Any],
                      heads: int) -> dict:
    """The MLA and MoE fields of a `deepseek2` file, and its model class (see the module docstring)."""
    rope = int(need("rope.dimension_count"))
    q_head = int(m.get("deepseek2.attention.key_length_mla") or need("attention.key_length"))
    v_head = int(m.get("deepseek2.attention.value_length_mla") or need("attention.value_length"))
    if q_head <= rope:
        raise ConfigError(f"{path}: a query head of {q_head} (deepseek2.attention.key_length_mla, else key_length) "
                          f"leaves no room beside the {rope} RoPE dims (deepseek2.rope.dimension_count)")
    out: dict[str, Any] = {
        "kv_lora_rank": int(need("attention.kv_lora_rank")), "q_lora_rank": m.get("deepseek2.attention.q_lora_rank")
        or None, "qk_rope_head_dim": rope, "qk_nope_head_dim": q_head - rope, "v_head_dim": v_head,
        "head_dim": q_head, "num_key_value_heads": heads,
    }
    if not m.get("deepseek2.expert_count"):
        return out  # MLA with dense layers only
    experts, used = expert_counts(path, "deepseek2", need)
    gating = int(m.get("deepseek2.expert_gating_func", GATING_SOFTMAX))
    if gating not in (GATING_SOFTMAX, GATING_SIGMOID):
        raise ConfigError(f"{path}: deepseek2.expert_gating_func {gating} is not supported (1 softmax, 2 sigmoid)")
    dense = int(m.get("deepseek2.leading_dense_block_count", 0))
    groups = int(m.get("deepseek2.expert_group_count") or 1)
    sigmoid = gating == GATING_SIGMOID
    if sigmoid and f"blk.{dense}.exp_probs_b.bias" not in dims:
        raise ConfigError(f"{path}: sigmoid expert gating (deepseek2.expert_gating_func 2) without the router's "
                          f"correction bias (blk.{dense}.exp_probs_b.bias) is not supported")
    out.update({
        **routed_fields("deepseek2", m, need, experts, used, dense, n_group=groups,
                         topk_group=int(m.get("deepseek2.expert_group_used_count") or groups)),
        "scoring_func": "sigmoid" if sigmoid else "softmax",
        "topk_method": "noaux_tc" if sigmoid else "group_limited_greedy" if groups > 1 else "greedy",
    })
    if not sigmoid:
        out.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2")
    return out


# (low_freq_factor, high_freq_factor) of the llama3 RoPE scalings a rope_freqs tensor is read back as: Llama 3.1 -
# 3.3's, Llama 4 Scout's
LLAMA3_FREQ_FACTORS = ((1.0, 4.0), (1.0, 1.0))


def llama3_scaling(path: Path, freqs: Any, head_dim: int, theta: float, original: int) -> dict[str, Any]:
    """Llama 3.1 - 3.3's RoPE scaling from the `rope_freqs` tensor llama.cpp's converter writes for it (one factor per
    frequency, dividing it: 1 for the high frequencies, `factor` for the low ones, a smooth ramp between), as the HF
    config's `llama3` parameters: `factor` the largest, Llama 3's `low_freq_factor` 1 and `high_freq_factor` 4 (or
    Llama 4 Scout's 1 and 1) over `original` positions (the file's `rope.scaling.original_context_length`, else
    Llama 3's 8192), checked against every factor the file holds; other factors raise `ConfigError`."""
    got = dequantize(freqs.data, freqs.qtype).reshape(-1).double().numpy()
    if got.shape != (head_dim // 2,) or not np.isfinite(got).all() or got.min() <= 0:
        raise ConfigError(f"{path}: rope_freqs holds {got.size} factors where RoPE over {head_dim} dims needs "
                          f"{head_dim // 2} positive ones")
    factor = float(got.max())
    for low, high in LLAMA3_FREQ_FACTORS:
        want = []
        for i in range(head_dim // 2):  # the converter's formula (convert_hf_to_gguf.py, LlamaModel)
            wavelen = 2 * math.pi * theta ** (2 * i / head_dim)
            if wavelen < original / high:
                want.append(1.0)
            elif wavelen > original / low:
                want.append(factor)
            else:  # (never with low == high)
                smooth = (original / wavelen - low) / (high - low)
                want.append(1 / ((1 - smooth) / factor + smooth))
        if np.allclose(got, want, rtol=1e-4, atol=0):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise ConfigError(f"{path}: its rope_freqs factors are not Llama 3's or Llama 4's RoPE scaling (factor {factor:g}, "
                      f"low / high_freq_factor 1 / 4 or 1 / 1, {original} original positions), the ones supported; "
                      "load the model's Hugging Face folder instead")
