"""DeepSeek-V3 (and Kimi-K2.5's language model), and DeepSeek-V2 (-Lite): MLA attention, MoE, RMSNorm, YaRN RoPE.

DeepSeek-V2 is V3's layers with another router (softmax scores, greedy or group_limited_greedy top-k, weights not
normalised, in float32: `MoEConfig.from_hf` for model_type deepseek_v2) and no correction bias; its checkpoint names
are V3's, so `DeepseekV2ForCausalLM` is this class under V2's name.

Layer i is pre-norm: `h += self_attn(input_layernorm(h))`, `h += mlp(post_attention_layernorm(h))`, where `mlp` is a
dense SwiGLU (`intermediate_size`) for i < `first_k_dense_replace` and the MoE (`layers/moe.py`) after. RoPE covers
only the qk_rope_head_dim part of each head, with the config's rope (YaRN for V3 / Kimi), in DeepSeek's interleaved
pair layout unless the config says `rope_interleave: false`. The KV cache holds the MLA latent only:
`kv_cache_shapes() == [(kv_lora_rank + qk_rope_head_dim,)]`.

Parameter names are the HF checkpoint's (`model.layers.L.self_attn.kv_b_proj.weight`,
`model.layers.L.mlp.experts.E.up_proj.weight`, `model.layers.L.mlp.gate.e_score_correction_bias`, ...), so the rename
table is empty. Multimodal wrappers (Kimi-K2.5) add their own prefix renames. The checkpoint's multi-token-prediction
layers (indices >= num_hidden_layers) are ignored. The router (`mlp.gate.*`) and the RoPE frequencies stay float32
whatever the model dtype. Quantized checkpoints are dequantized by the loader (`loading/dequant.py`), not here.
"""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from ..layers.embedding import embedding
from ..layers.mla import MLAttention
from ..layers.mlp import GatedMLP
from ..layers.moe import MoE
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from .base import DecoderOnlyLM, PreNormDecoderLayer


def at_least_regex(n: int) -> str:
    """A regex matching exactly the decimal integers >= n (no leading zeros)."""
    s = str(n)
    alts = [rf"[1-9]\d{{{len(s)},}}", s]  # more digits; n itself
    for i, d in enumerate(s):
        if d != "9":
            alts.append(rf"{s[:i]}[{int(d) + 1}-9]\d{{{len(s) - i - 1}}}")
    return "(?:" + "|".join(alts) + ")"


class DeepseekV3DecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        assert cfg.mla is not None, "DeepSeek-V3 needs the MLA fields (kv_lora_rank, ...) in its config"
        text = cfg.text
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAttention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.mla,
            cfg.rope,
            bias=cfg.attention_bias,
            interleaved=bool(text.get("rope_interleave", True)),
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        moe = cfg.moe
        if moe is not None and moe.is_sparse(layer_idx):  # first_k_dense_replace, moe_layer_freq
            self.mlp: nn.Module = MoE(cfg.hidden_size, moe, act=cfg.hidden_act)
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, act=cfg.hidden_act)


class DeepseekV3Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.mla is not None
        self.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DeepseekV3DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.mla.qk_rope_head_dim, cfg.rope)


class DeepseekV3ForCausalLM(DecoderOnlyLM):
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    # Keys a checkpoint may carry that we do not use (matched with re.search; also fine with re.match).
    # The instance adds the MTP layers (index >= num_hidden_layers), which depend on the config.
    checkpoint_ignore: tuple[str, ...] = (r"^(?:.*\.)?rotary_emb\.inv_freq$",)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.model = DeepseekV3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        mtp = rf"^(?:.*\.)?layers\.{at_least_regex(config.num_hidden_layers)}\."
        self.checkpoint_ignore = type(self).checkpoint_ignore + (mtp,)


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V2 / V2-Lite (`architectures: ["DeepseekV2ForCausalLM"]`): V3's model; the router is the config's."""


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V3.2 (`architectures: ["DeepseekV32ForCausalLM"]`): V3's model plus DeepSeek Sparse Attention, whose
    lightning indexer (`self_attn.indexer.*`, ignored here) picks the `index_topk` (2,048) keys each query attends
    to. A query with at most that many keys before it attends to all of them, exactly V3's dense MLA, so the model
    runs as V3 up to `index_topk` positions: `ModelConfig.context_limit` caps the context there (the indexer's
    selection beyond it is not implemented)."""

    checkpoint_ignore = DeepseekV3ForCausalLM.checkpoint_ignore + (r"\.self_attn\.indexer\.",)
