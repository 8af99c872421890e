"""`MoEConfig`: a model's mixture of experts, read from its config.json in DeepSeek's field names (`MoEConfig.from_hf`
for DeepSeek-V2 / V3, Kimi, GLM-4.5, Qwen2 / Qwen3-MoE, Mixtral, OLMoE, gpt-oss, Llama 4, MiniMax-M2, ERNIE 4.5);
`layers/moe.py` builds the experts and the router from it; `ModelConfig` (config.py, which re-exports it) holds one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError


@dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts: DeepSeek-V3's (sigmoid scores, noaux_tc router, shared experts), DeepSeek-V2's (softmax
    scores, greedy or group_limited_greedy top-k, shared experts), Qwen3-MoE's or Mixtral's (softmax scores, plain
    top-k: scoring_func "softmax", topk_method "greedy", no shared experts), in DeepSeek's field names.

    Which layers are sparse: layer i is when `i >= first_k_dense_replace and i % moe_layer_freq == 0` (DeepSeek's
    fields) and `(i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers` (Qwen's); the others are dense.
    """

    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    moe_intermediate_size: int
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_float32: bool = False  # the router's weight and logits in float32 whatever the model dtype (DeepSeek's)
    # the shared experts' width (0: moe_intermediate_size x n_shared_experts, DeepSeek's), and whether a sigmoid of
    # `shared_expert_gate(x)` scales their output (Qwen2-MoE's one shared expert)
    shared_intermediate_size: int = 0
    shared_gate: bool = False
    # gpt-oss: a bias on the router's logits and on every expert projection, and its clamped SwiGLU
    # (layers/mlp.ClampedSwiGLUMLP: gate clamped above, up both ways at swiglu_limit, gate * sigmoid(alpha gate) *
    # (up + 1)); swiglu_limit None: the plain SwiGLU
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0
    # Llama 4: each routed expert's input is the token times its routing weight (rounded to the model's dtype), and
    # its output is summed unweighted; False: the output is weighted (everyone else)
    weight_inputs: bool = False
    # ERNIE 4.5: a correction bias `e_score_correction_bias` [E] added to the softmax router's probabilities for
    # choosing only (the weights stay the unbiased probabilities), and the floor of their sum when normalised
    choice_bias: bool = False
    norm_min: float = 0.0

    def is_sparse(self, layer_idx: int) -> bool:
        """Whether the 0-based layer `layer_idx` has the experts (else a dense MLP of `intermediate_size`)."""
        return (layer_idx >= self.first_k_dense_replace and layer_idx % self.moe_layer_freq == 0
                and (layer_idx + 1) % self.decoder_sparse_step == 0 and layer_idx not in self.mlp_only_layers)

    @staticmethod
    def from_hf(text: Mapping[str, Any], model_type: str) -> "MoEConfig | None":
        """The MoE group of a (text) config dict; None for a dense model. DeepSeek-V2 / V3 / Kimi name their routed
        experts `n_routed_experts` (V2's defaults: softmax scores, greedy top-k, weights not normalised, the router in
        float32, as transformers' DeepseekV2TopkRouter; GLM-4.5's (`model_type` glm4_moe) are V3's router); Qwen3-MoE
        (`model_type` qwen3_moe) `num_experts`, which transformers 5 writes back as `num_local_experts` (its
        attribute_map), and 0 experts there means every layer is dense; Qwen2-MoE (`model_type` qwen2_moe) the same plus
        one sigmoid-gated shared expert of `shared_expert_intermediate_size`; Mixtral (`model_type` mixtral)
        `num_local_experts` of `intermediate_size` in every layer, the top-k renormalised; gpt-oss (`model_type`
        gpt_oss) the same with biases and its clamped SwiGLU (the softmax of the top-k logits equals the renormalised
        top-k of the softmax); Llama 4 (`model_type` llama4 / llama4_text) `num_local_experts` of `intermediate_size`,
        the sigmoid of the top-k logits weighting the experts' inputs, one shared expert, sparse layers `moe_layers`
        or every `interleave_moe_layer_step`-th; MiniMax-M2 (`model_type` minimax_m2) `num_local_experts` of
        `intermediate_size` in every layer under DeepSeek-V3's sigmoid router (its correction bias, no groups, the
        top-k weights normalised); OLMoE (`model_type` olmoe) Mixtral's with `norm_topk_prob` as its config says;
        ERNIE 4.5 MoE (`model_type` ernie4_5_moe) `moe_num_experts` of `moe_intermediate_size`, `moe_k` a token,
        chosen by the float32 softmax plus a correction bias, `moe_num_shared_experts` shared ones."""
        if text.get("n_routed_experts"):
            v2 = model_type == "deepseek_v2"  # softmax routing (greedy or group-limited), weights not normalised
            glm = model_type == "glm4_moe"  # transformers' Glm4MoeConfig defaults: one shared expert, one dense layer
            # GLM-4.7-Flash (glm4_moe_lite) lists each layer's MLP instead (default: the first dense)
            kinds = text.get("mlp_layer_types") or (["dense"] + ["sparse"] * (int(text["num_hidden_layers"]) - 1)
                                                    if model_type == "glm4_moe_lite" else None)
            return MoEConfig(
                n_routed_experts=int(text["n_routed_experts"]),
                num_experts_per_tok=int(text["num_experts_per_tok"]),
                n_shared_experts=int(text.get("n_shared_experts", 1 if glm else 0) or 0),
                moe_intermediate_size=int(text["moe_intermediate_size"]),
                first_k_dense_replace=int(text.get("first_k_dense_replace", 1 if glm else 0)),
                moe_layer_freq=int(text.get("moe_layer_freq", 1)),
                n_group=int(text.get("n_group") or 1),
                topk_group=int(text.get("topk_group") or 1),
                routed_scaling_factor=float(text.get("routed_scaling_factor", 1.0)),
                norm_topk_prob=bool(text.get("norm_topk_prob", not v2)),
                scoring_func=str(text.get("scoring_func", "softmax" if v2 else "sigmoid")),
                topk_method=str(text.get("topk_method", "greedy" if v2 else "noaux_tc")),
                router_float32=v2,
                mlp_only_layers=tuple(i for i, k in enumerate(kinds or ()) if k == "dense"),
            )
        experts = text.get("num_experts", text.get("num_local_experts"))
        if model_type == "minimax_m2" and experts:  # every layer sparse: V3's sigmoid router with its bias, no groups
            return MoEConfig(
                n_routed_experts=int(experts),
                num_experts_per_tok=int(text["num_experts_per_tok"]),
                n_shared_experts=0,
                moe_intermediate_size=int(text["intermediate_size"]),
                norm_topk_prob=True,
                scoring_func="sigmoid",
                topk_method="noaux_tc",
            )
        if model_type in ("mixtral", "gpt_oss", "olmoe") and experts:  # every layer sparse, of intermediate_size
            oss = model_type == "gpt_oss"  # biases, the clamped SwiGLU (its top-k logits' softmax: renormalised)
            return MoEConfig(
                n_routed_experts=int(experts),
                num_experts_per_tok=int(text["num_experts_per_tok"]),
                n_shared_experts=0,
                moe_intermediate_size=int(text["intermediate_size"]),
                # OLMoE's configs say (False by default); Mixtral and gpt-oss renormalise
                norm_topk_prob=bool(text.get("norm_topk_prob", False)) if model_type == "olmoe" else True,
                scoring_func="softmax",
                topk_method="greedy",
                router_bias=oss,
                expert_bias=oss,
                swiglu_limit=float(text.get("swiglu_limit", 7.0)) if oss else None,
                swiglu_alpha=float(text.get("swiglu_alpha", 1.702)) if oss else 1.0,
            )
        if model_type in ("llama4", "llama4_text") and experts:
            # Llama 4: sigmoid of the top-k logits (not normalised) scaling the experts' inputs, one shared expert of
            # intermediate_size; the sparse layers `moe_layers`, else every `interleave_moe_layer_step`-th
            n_layers = int(text["num_hidden_layers"])
            step = int(text.get("interleave_moe_layer_step") or 1)
            listed = text.get("moe_layers")
            sparse = set(int(i) for i in listed) if listed is not None else set(range(step - 1, n_layers, step))
            return MoEConfig(
                n_routed_experts=int(experts),
                num_experts_per_tok=int(text.get("num_experts_per_tok", 1)),
                n_shared_experts=1,
                moe_intermediate_size=int(text["intermediate_size"]),
                norm_topk_prob=False,
                scoring_func="sigmoid",
                topk_method="greedy",
                mlp_only_layers=tuple(i for i in range(n_layers) if i not in sparse),
                shared_intermediate_size=int(text["intermediate_size"]),
                weight_inputs=True,
            )
        if model_type == "ernie4_5_moe" and text.get("moe_num_experts", experts):
            # ERNIE 4.5 MoE: the softmax router in float32 choosing by probability + its correction bias, shared
            # experts of moe_intermediate_size each; sparse layers from moe_layer_start_index to moe_layer_end_index
            # (-1: the last), every moe_layer_interval-th
            n_layers = int(text["num_hidden_layers"])
            start, end = int(text.get("moe_layer_start_index", 1)), int(text.get("moe_layer_end_index", -1))
            end = n_layers - 1 if end == -1 else end
            every = int(text.get("moe_layer_interval") or 1)
            sparse = [start <= i <= end and (i + 1) % every == 0 for i in range(n_layers)]
            return MoEConfig(
                n_routed_experts=int(text.get("moe_num_experts", experts)),
                num_experts_per_tok=int(text.get("moe_k", text.get("num_experts_per_tok", 6))),
                n_shared_experts=int(text.get("moe_num_shared_experts", 2) or 0),
                moe_intermediate_size=int(text["moe_intermediate_size"]),
                norm_topk_prob=True,
                scoring_func="softmax",
                topk_method="greedy",
                router_float32=True,
                mlp_only_layers=tuple(i for i in range(n_layers) if not sparse[i]),
                choice_bias=True,
                norm_min=float(text.get("moe_norm_min", 1e-12)),
            )
        if model_type in ("qwen3_moe", "qwen2_moe") and experts:
            step = int(text.get("decoder_sparse_step") or 1)
            if step < 1:
                raise ConfigError(f"decoder_sparse_step must be >= 1 (got {step})")
            shared = int(text.get("shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0
            return MoEConfig(
                n_routed_experts=int(experts),
                num_experts_per_tok=int(text["num_experts_per_tok"]),
                n_shared_experts=1 if shared else 0,
                moe_intermediate_size=int(text["moe_intermediate_size"]),
                norm_topk_prob=bool(text.get("norm_topk_prob", False)),  # transformers' Qwen2/3 MoE configs' default
                scoring_func="softmax",
                topk_method="greedy",
                decoder_sparse_step=step,
                mlp_only_layers=tuple(int(i) for i in text.get("mlp_only_layers") or ()),
                shared_intermediate_size=shared,
                shared_gate=bool(shared),
            )
        return None
