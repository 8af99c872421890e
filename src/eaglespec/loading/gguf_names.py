"""llama.cpp tensor names -> Hugging Face names: the one GGUF name table, the q/k un-permutation, the expert split.

`GGUF_TO_HF` maps every tensor name of a `llama`, `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, `phi3`, `deepseek2`,
`glm4moe`, `gpt-oss`, `gemma2`, `gemma3`, `llama4`, `olmo2`, `olmoe`, `ernie4_5`, `exaone4`, `glm4`, `command-r` or
`cohere2` GGUF (`ARCH_GGUF_TO_HF` first, where an architecture means other tensors by some names) to the HF name that
`models/llama.py`, `models/qwen.py`, `models/qwen_moe.py`, `models/mixtral.py`, `models/phi3.py`,
`models/deepseek_v3.py`, `models/glm4_moe.py`, `models/gpt_oss.py`, `models/gemma.py` and `models/olmo2.py` keep
(Qwen3's per-head q/k norms: `attn_q_norm`, `attn_k_norm`; the MoE router `ffn_gate_inp` -> `mlp.gate`; old Mixtral
files' per-expert `ffn_gate.E`; deepseek2's MLA projections, shared experts `ffn_*_shexp` and router correction bias
`exp_probs_b.bias`). Its third column says what else the reader does to the tensor: `q` / `k`, the weights llama.cpp
permutes for its RoPE layout in a `llama` GGUF (by attention heads, by KV heads), which `unpermute_qk` undoes so they
match the HF rotate-halves layout (Qwen's GGUFs keep the HF layout: llama.cpp runs their RoPE on halves, NEOX style, and
llama4's keep HF's pairs; the reader unpermutes `PERMUTED_ARCHS`' files only); `experts`, llama.cpp's stacked expert
tensors (`ffn_{gate,up,down}_exps`, numpy [E, rows, cols] = GGUF dims reversed), split into one HF tensor per expert,
`{e}` in the HF name standing for the expert's index (`expert_names`; 2-D [E, rows] for gpt-oss's expert biases);
`experts_gate_up`, gpt-oss's gate and up stacked in one tensor [E, 2 rows, ...] (gate first), split per expert into both
(`{gate_up}` standing for gate_proj or up_proj); `k_b` / `v_b`, the two halves llama.cpp's converter (since its MLA
rework) cuts DeepSeek's `kv_b_proj` into, joined back into it by `join_kv_b` (older deepseek2 files hold `attn_kv_b`
whole).
"""

from __future__ import annotations

import re
from typing import TypeVar

import numpy as np
import torch

from ..errors import CheckpointError

T = TypeVar("T", np.ndarray, torch.Tensor)

# (GGUF name regex, HF name template, transform: None | "q" | "k" | "experts" | "k_b" | "v_b")
GGUF_TO_HF: tuple[tuple[str, str, str | None], ...] = (
    (r"token_embd\.weight", "model.embed_tokens.weight", None),
    (r"output_norm\.weight", "model.norm.weight", None),
    (r"output\.weight", "lm_head.weight", None),
    (r"blk\.(\d+)\.attn_q\.(weight|bias)", r"model.layers.\1.self_attn.q_proj.\2", "q"),
    (r"blk\.(\d+)\.attn_k\.(weight|bias)", r"model.layers.\1.self_attn.k_proj.\2", "k"),
    (r"blk\.(\d+)\.attn_v\.(weight|bias)", r"model.layers.\1.self_attn.v_proj.\2", None),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2", None),
    (r"blk\.(\d+)\.attn_qkv\.weight", r"model.layers.\1.self_attn.qkv_proj.weight", None),  # phi3: fused
    (r"blk\.(\d+)\.ffn_gate\.(weight|bias)", r"model.layers.\1.mlp.gate_proj.\2", None),
    (r"blk\.(\d+)\.ffn_up\.(weight|bias)", r"model.layers.\1.mlp.up_proj.\2", None),
    (r"blk\.(\d+)\.ffn_down\.(weight|bias)", r"model.layers.\1.mlp.down_proj.\2", None),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight", None),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight", None),
    (r"blk\.(\d+)\.attn_q_norm\.weight", r"model.layers.\1.self_attn.q_norm.weight", None),
    (r"blk\.(\d+)\.attn_k_norm\.weight", r"model.layers.\1.self_attn.k_norm.weight", None),
    # qwen3moe: the router [E, H], and the experts stacked per projection ([E, I, H] gate/up, [E, H, I] down)
    # (gpt-oss: the router's bias, the experts' biases [E, rows], and its gate and up stacked in one tensor)
    (r"blk\.(\d+)\.ffn_gate_inp\.(weight|bias)", r"model.layers.\1.mlp.gate.\2", None),
    (r"blk\.(\d+)\.ffn_gate_exps\.(weight|bias)", r"model.layers.\1.mlp.experts.{e}.gate_proj.\2", "experts"),
    (r"blk\.(\d+)\.ffn_up_exps\.(weight|bias)", r"model.layers.\1.mlp.experts.{e}.up_proj.\2", "experts"),
    (r"blk\.(\d+)\.ffn_down_exps\.(weight|bias)", r"model.layers.\1.mlp.experts.{e}.down_proj.\2", "experts"),
    (r"blk\.(\d+)\.ffn_gate_up_exps\.(weight|bias)", r"model.layers.\1.mlp.experts.{e}.{gate_up}_proj.\2",
     "experts_gate_up"),
    (r"blk\.(\d+)\.attn_sinks\.weight", r"model.layers.\1.self_attn.sinks", None),
    # Mixtral files of llama.cpp before the stacked experts (2024-04): one tensor per expert, `ffn_gate.E`
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight", r"model.layers.\1.mlp.experts.\3.\2_proj.weight", None),
    # deepseek2 (DeepSeek-V2 / V3, Kimi-K2): MLA's projections, shared experts, the router's correction bias
    (r"blk\.(\d+)\.attn_q_a\.weight", r"model.layers.\1.self_attn.q_a_proj.weight", None),
    (r"blk\.(\d+)\.attn_q_a_norm\.weight", r"model.layers.\1.self_attn.q_a_layernorm.weight", None),
    (r"blk\.(\d+)\.attn_q_b\.weight", r"model.layers.\1.self_attn.q_b_proj.weight", None),
    (r"blk\.(\d+)\.attn_kv_a_mqa\.weight", r"model.layers.\1.self_attn.kv_a_proj_with_mqa.weight", None),
    (r"blk\.(\d+)\.attn_kv_a_norm\.weight", r"model.layers.\1.self_attn.kv_a_layernorm.weight", None),
    (r"blk\.(\d+)\.attn_kv_b\.weight", r"model.layers.\1.self_attn.kv_b_proj.weight", None),
    (r"blk\.(\d+)\.attn_k_b\.weight", r"model.layers.\1.self_attn.kv_b_proj.weight", "k_b"),
    (r"blk\.(\d+)\.attn_v_b\.weight", r"model.layers.\1.self_attn.kv_b_proj.weight", "v_b"),
    (r"blk\.(\d+)\.ffn_gate_shexp\.weight", r"model.layers.\1.mlp.shared_experts.gate_proj.weight", None),
    (r"blk\.(\d+)\.ffn_up_shexp\.weight", r"model.layers.\1.mlp.shared_experts.up_proj.weight", None),
    (r"blk\.(\d+)\.ffn_down_shexp\.weight", r"model.layers.\1.mlp.shared_experts.down_proj.weight", None),
    (r"blk\.(\d+)\.exp_probs_b\.bias", r"model.layers.\1.mlp.gate.e_score_correction_bias", None),
    # qwen2moe: the shared expert's sigmoid gate [1, H]
    (r"blk\.(\d+)\.ffn_gate_inp_shexp\.weight", r"model.layers.\1.mlp.shared_expert_gate.weight", None),
    # HF's post_attention_layernorm (Gemma's, OLMo 2's and EXAONE 4's post-attention norm; glm4moe's pre-FFN norm, by
    # llama.cpp's name there), and glm4moe's MTP layer's own tensors (block num_hidden_layers, which the model ignores,
    # as it ignores that block's attention and experts)
    (r"blk\.(\d+)\.post_attention_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight", None),
    (r"blk\.(\d+)\.nextn\.(eh_proj|enorm|hnorm|embed_tokens)\.weight", r"model.layers.\1.\2.weight", None),
    (r"blk\.(\d+)\.nextn\.shared_head_(head|norm)\.weight", r"model.layers.\1.shared_head.\2.weight", None),
    # gemma2 / gemma3 / olmo2 / exaone4: the post-FFN norm
    (r"blk\.(\d+)\.post_ffw_norm\.weight", r"model.layers.\1.post_feedforward_layernorm.weight", None),
)
# per HF architecture (the config's), (regex, replacement) on the table's names where that architecture's
# checkpoints spell them otherwise, so that a converted folder (loading/convert.py) is that architecture's own: phi3's
# ffn_up is the fused gate_up_proj (gate rows, then up rows, which models/phi3.py splits); Mixtral's checkpoints say
# block_sparse_moe and w1 / w3 / w2; Qwen2-MoE's shared_expert (singular). The model classes rename them back.
HF_RENAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "Phi3ForCausalLM": ((r"\.mlp\.up_proj\.weight$", ".mlp.gate_up_proj.weight"),),
    "MixtralForCausalLM": ((r"\.mlp\.gate\.weight$", ".block_sparse_moe.gate.weight"),
                           (r"\.mlp\.experts\.(\d+)\.gate_proj\.", r".block_sparse_moe.experts.\1.w1."),
                           (r"\.mlp\.experts\.(\d+)\.up_proj\.", r".block_sparse_moe.experts.\1.w3."),
                           (r"\.mlp\.experts\.(\d+)\.down_proj\.", r".block_sparse_moe.experts.\1.w2.")),
    "Qwen2MoeForCausalLM": ((r"\.mlp\.shared_experts\.", ".mlp.shared_expert."),),
    "GptOssForCausalLM": ((r"\.mlp\.gate\.", ".mlp.router."),),  # (its experts stay per expert: transformers
    #                                                              loads only the fused form, our loader both)
}
# GGUF architectures whose q/k weights llama.cpp permuted (interleaved RoPE pairs); llama4's converter keeps the HF
# rows (Llama 4's RoPE is on pairs already)
PERMUTED_ARCHS = frozenset({"llama", "granite", "smollm3"})
# per GGUF architecture, names that mean another HF tensor there than in the table (consulted first): Gemma's
# ffn_norm is its pre-FFN norm (its post_attention_norm and post_ffw_norm are the table's); GLM-4's post-norms have
# their own names
ARCH_GGUF_TO_HF: dict[str, tuple[tuple[str, str, str | None], ...]] = {**{arch: (
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.pre_feedforward_layernorm.weight", None),
) for arch in ("gemma2", "gemma3")}, "glm4": (  # GLM-4-0414's sandwich norms, and its gate and up as one ffn_up
    (r"blk\.(\d+)\.post_attention_norm\.weight", r"model.layers.\1.post_self_attn_layernorm.weight", None),
    (r"blk\.(\d+)\.post_ffw_norm\.weight", r"model.layers.\1.post_mlp_layernorm.weight", None),
    (r"blk\.(\d+)\.ffn_up\.weight", r"model.layers.\1.mlp.gate_up_proj.weight", None),
)}
# GGUF architectures whose norm weights llama.cpp's converter stored as 1 + w (Gemma's are offsets from 1, which
# layers/norm.OffsetRMSNorm adds back): the reader subtracts the 1 again
NORM_SHIFTED_ARCHS = frozenset({"gemma2", "gemma3"})

_COMPILED = tuple((re.compile(p), repl, perm) for p, repl, perm in GGUF_TO_HF)
_ARCH_COMPILED = {arch: tuple((re.compile(p), repl, perm) for p, repl, perm in rows)
                  for arch, rows in ARCH_GGUF_TO_HF.items()}


def gguf_to_hf_name(name: str, arch: str | None = None) -> tuple[str, str | None]:
    """(HF name, transform) of a GGUF tensor name in a file of architecture `arch` ("config": a tensor the config
    holds, no weight); CheckpointError for a name we do not know."""
    for pattern, repl, perm in _ARCH_COMPILED.get(arch or "", ()) + _COMPILED:
        m = pattern.fullmatch(name)
        if m:
            return m.expand(repl), perm
    if name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
        return "", "config"  # RoPE scaling (Llama 3's, Phi-3's LongRoPE), read into the config (gguf_config.py)
    raise CheckpointError(f"GGUF tensor {name!r} has no Hugging Face equivalent in our Llama / Qwen / DeepSeek layouts")


def expert_names(template: str, n_experts: int) -> list[str]:
    """The per-expert HF names of a stacked expert tensor (`template` from the table, with `{e}`), expert 0 first."""
    return [template.replace("{e}", str(e)) for e in range(n_experts)]


def join_kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """DeepSeek's kv_b_proj [H * (nope + v), r] from llama.cpp's two halves of it: attn_k_b [H, r, nope] (transposed
    per head, for the absorbed product) and attn_v_b [H, v, r]; each head's nope rows come before its v rows."""
    if k_b.dim() != 3 or v_b.dim() != 3 or k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
        raise CheckpointError(f"attn_k_b {tuple(k_b.shape)} and attn_v_b {tuple(v_b.shape)} are not the halves of one "
                              "kv_b_proj ([heads, kv_lora_rank, nope] and [heads, v, kv_lora_rank])")
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])


def unpermute_qk(w: T, n_heads: int) -> T:
    """Undo llama.cpp's q/k row permutation (interleaved pairs -> halves) for `n_heads` heads.

    w: [rows, cols] weight or [rows] bias, rows = n_heads * head_dim; a numpy array or a torch tensor.
    """
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)
