"""Session 57's model families on the GPU path: tiny random float32 targets (Mixtral, Qwen2-MoE with its gated shared
expert and a dense layer, Phi-3 with LongRoPE, Mistral Small 3's text wrapper with an explicit head_dim; session 58's
GLM-4.5 and Phi-4-mini with partial RoPE, heads of 48 dims, sliding windows, Gemma 2 / 3, GLM-4, SmolLM3, OLMo 3,
Granite, Command R7B, gpt-oss; session 59's Llama 4, MiniMax-M2, EXAONE 4, OLMoE, ERNIE 4.5 MoE; session 61's Command
R+, OLMo 2, ERNIE 4.5), each run eagerly
without graphs (the reference), then through `prepare_for_inference` and the graph path: plain decoding, a chain and a
tree with a random EAGLE-3 drafter. Prints how many of the 3 answers equal the reference's.

    python benchmarks/families_check.py [--cpu] [--only mixtral,gemma3,...]

`--cpu`: a smoke run on the CPU (no graphs; the engine's eager path against itself).
"""

from __future__ import annotations

import argparse
import math
import sys

import moe_graphs_check
import torch

from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.models import get_model_class
from eaglespec.sampling_params import SamplingParams

BASE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=1e6,
            tie_word_embeddings=False)
g = torch.Generator().manual_seed(3)
CONFIGS = {
    "mixtral": dict(BASE, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=64,
                    num_local_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(BASE, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", moe_intermediate_size=64,
                      shared_expert_intermediate_size=96, num_experts=16, num_experts_per_tok=4, mlp_only_layers=[2]),
    "phi3 longrope": dict(BASE, architectures=["Phi3ForCausalLM"], model_type="phi3",
                          original_max_position_embeddings=256,
                          rope_scaling=dict(type="longrope",
                                            short_factor=(1 + 2 * torch.rand(16, generator=g)).tolist(),
                                            long_factor=(4 + 8 * torch.rand(16, generator=g)).tolist())),
    "mistral3 (head_dim 64)": dict(architectures=["Mistral3ForConditionalGeneration"], model_type="mistral3",
                                   text_config=dict(BASE, model_type="mistral", head_dim=64)),
    # session 58: partial RoPE through the fused RoPE + KV-store kernel (the unrotated tail passed through), and
    # heads whose halves are not powers of 2 (the kernel's masked tiles)
    "glm4_moe (partial 0.5, bias)": dict(BASE, architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe",
                                         moe_intermediate_size=64, n_routed_experts=16, num_experts_per_tok=4,
                                         n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1,
                                         routed_scaling_factor=2.5, attention_bias=True, partial_rotary_factor=0.5),
    "phi3 partial 0.75 (head_dim 48)": dict(BASE, architectures=["Phi3ForCausalLM"], model_type="phi3", head_dim=48,
                                            partial_rotary_factor=0.75),
    "phi3 (head_dim 48)": dict(BASE, architectures=["Phi3ForCausalLM"], model_type="phi3", head_dim=48),
    # sliding-window attention past the window (the 60-token prompt): the windowed mask in graphs and in the kernels
    "mistral (window 16)": dict(BASE, architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=16),
    "qwen3 (layers 2-3 windowed)": dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32,
                                        use_sliding_window=True, sliding_window=16, max_window_layers=2),
    # Gemma 3: sandwich norms, offset RMSNorms, scaled embedding, local / global RoPE, GELU, the module path
    "gemma3 (window 16)": dict(BASE, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=32,
                               query_pre_attn_scalar=48, sliding_window=16, sliding_window_pattern=2,
                               rope_local_base_freq=1e4, rope_scaling=dict(rope_type="linear", factor=8.0),
                               hidden_activation="gelu_pytorch_tanh"),
    # Gemma 2: soft-capped scores (the written-out attention) and logits, the fused RoPE + KV-store kernel
    "gemma2 (window 16, soft caps)": dict(BASE, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                                          head_dim=32, query_pre_attn_scalar=48, sliding_window=16,
                                          attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    # GLM-4-0414: sandwich norms, q/k rows permuted pairs -> halves at load (here random: the layout is the engine's)
    "glm4 (partial 0.5, bias)": dict(BASE, architectures=["Glm4ForCausalLM"], model_type="glm4", head_dim=32,
                                     attention_bias=True, partial_rotary_factor=0.5),
    # SmolLM3: every fourth layer NoPE (the identity rotation through the fused RoPE + KV-store kernel)
    "smollm3 (NoPE layer 3)": dict(BASE, architectures=["SmolLM3ForCausalLM"], model_type="smollm3"),
    # OLMo 3: post-norm layers, whole-projection q / k norms (the module path), three windowed layers of four
    "olmo3 (window 16)": dict(BASE, architectures=["Olmo3ForCausalLM"], model_type="olmo3", sliding_window=16,
                              layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    # Granite 3: Llama's fused kernels with a softmax scale of its own, a scaled embedding and divided logits
    "granite (multipliers)": dict(BASE, architectures=["GraniteForCausalLM"], model_type="granite",
                                  embedding_multiplier=2.0, attention_multiplier=0.09, residual_multiplier=0.8,
                                  logits_scaling=4.0),
    # Command R7B / A: parallel blocks, LayerNorms, windowed RoPE layers and NoPE global ones, scaled logits
    "cohere2 (window 16, NoPE globals)": dict(BASE, architectures=["Cohere2ForCausalLM"], model_type="cohere2",
                                              sliding_window=16, logit_scale=0.25, layer_norm_eps=1e-5),
    # Command R+ (session 60's GGUF families): parallel blocks, LayerNorms, per-head q / k LayerNorms, scaled logits
    "cohere (q/k LayerNorms, logit scale)": dict(BASE, architectures=["CohereForCausalLM"], model_type="cohere",
                                                 use_qk_norm=True, logit_scale=0.25, layer_norm_eps=1e-5),
    # OLMo 2: post-norm layers, whole-projection q / k RMSNorms; ERNIE 4.5: biased projections, a tied head
    "olmo2": dict(BASE, architectures=["Olmo2ForCausalLM"], model_type="olmo2"),
    "ernie4_5 (biased, tied)": dict(BASE, architectures=["Ernie4_5ForCausalLM"], model_type="ernie4_5", use_bias=True,
                                    tie_word_embeddings=True),
    # gpt-oss: sinks, alternating windows, biased router, clamped-SwiGLU experts with biases (the grouped kernels'
    # bias and clamp epilogues since session 59: graphs expected)
    "gpt_oss (window 16, sinks)": dict(BASE, architectures=["GptOssForCausalLM"], model_type="gpt_oss", head_dim=32,
                                       intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                                       sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2,
                                       attention_bias=True, swiglu_limit=7.0,
                                       rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                                         original_max_position_embeddings=256, truncate=False)),
    # the same 1,536 wide: its biased o_proj and router through the GEMV kernel's bias (session 60)
    "gpt_oss 1,536 wide (biased GEMV)": dict(BASE, architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                                             hidden_size=1536, num_attention_heads=48, num_key_value_heads=4,
                                             head_dim=32, intermediate_size=64, num_local_experts=8,
                                             num_experts_per_tok=2, sliding_window=16,
                                             layer_types=["sliding_attention", "full_attention"] * 2,
                                             attention_bias=True, swiglu_limit=7.0),
    # Llama 4: chunked RoPE layers, NoPE layers with the query temperature, weightless q / k norms, a MoE every other
    # layer with its routing weights on the experts' inputs (the grouped kernels' scaled rows)
    "llama4 (chunks 16, NoPE temperature)": dict(BASE, architectures=["Llama4ForCausalLM"], model_type="llama4_text",
                                                 head_dim=32, intermediate_size=64, intermediate_size_mlp=256,
                                                 num_local_experts=8, num_experts_per_tok=1,
                                                 interleave_moe_layer_step=2, no_rope_layer_interval=2,
                                                 attention_chunk_size=16, floor_scale=8, attn_scale=0.1),
    # MiniMax-M2: whole-projection q / k norms, partial RoPE by rotary_dim, the sigmoid router with its bias
    "minimax_m2 (rotary_dim 16)": dict(BASE, architectures=["MiniMaxM2ForCausalLM"], model_type="minimax_m2",
                                       head_dim=32, rotary_dim=16, intermediate_size=64, num_local_experts=8,
                                       num_experts_per_tok=2),
    # EXAONE 4: post-norm layers, per-head q / k norms (the fused kernels), windowed rotated layers, NoPE globals
    "exaone4 (window 16, NoPE globals)": dict(BASE, architectures=["Exaone4ForCausalLM"], model_type="exaone4",
                                              head_dim=32, sliding_window=16, sliding_window_pattern="LLLG"),
    # OLMoE: whole-projection q / k norms over Qwen3-MoE's layers, the top-k weights not renormalised
    "olmoe": dict(BASE, architectures=["OlmoeForCausalLM"], model_type="olmoe", intermediate_size=64, num_experts=8,
                  num_experts_per_tok=2),
    # ERNIE 4.5 MoE: the float32 softmax router with a correction bias, a dense first layer, shared experts
    "ernie4_5_moe": dict(BASE, architectures=["Ernie4_5_MoeForCausalLM"], model_type="ernie4_5_moe",
                         moe_intermediate_size=64, moe_num_experts=8, moe_k=2, moe_num_shared_experts=1),
}
EAGER: set[str] = set()  # targets whose MoE runs per expert (host sync): no CUDA graphs


def tiny_target(d: dict, dev: torch.device) -> torch.nn.Module:
    cfg = ModelConfig.from_hf(d)
    model = get_model_class(cfg.architecture)(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, t in model.named_parameters():
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=gen) if t.dim() == 1
                    else 2.0 * torch.randn(t.shape, generator=gen) / math.sqrt(t.shape[-1]))
    return model.to(dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated substrings: the targets whose names hold one")
    args = ap.parse_args()
    only = [w for w in args.only.split(",") if w]
    dev = torch.device("cpu" if args.cpu else "cuda")
    moe_graphs_check.DEV = dev  # where its tiny_drafter puts the drafter
    prompts = [[(7 * i + j) % 500 + 3 for i in range(n)] for j, n in enumerate((5, 17, 60))]
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    print("| target | run | answers equal to the eager reference's (3) | verify steps |")
    print("| --- | --- | --- | ---: |")
    failed = 0
    for name, d in CONFIGS.items():
        if only and not any(w in name for w in only):
            continue
        target = tiny_target(d, dev)
        ref = [o.token_ids for o in Engine(target, None, EngineConfig(max_batch_size=4, cuda_graphs=False))
               .generate(prompts, params)]
        language_model = getattr(target, "language_model", target)
        drafter = moe_graphs_check.tiny_drafter(language_model)
        prepare_for_inference(target, dev, None, None)
        prepare_for_inference(drafter, dev, None, None)
        for label, spec in (("plain", None), ("chain 3,1,4", SpecConfig(3, 1, 4)), ("tree 3,2,6", SpecConfig(3, 2, 6))):
            eng = Engine(target, None, EngineConfig(max_batch_size=4), drafter=drafter if spec else None, spec=spec)
            graphs = eng.runner.graphs is not None
            got = [o.token_ids for o in eng.generate(prompts, params)]
            same = sum(a == b for a, b in zip(got, ref))
            failed += same != 3 or (dev.type == "cuda" and graphs == (name in EAGER))
            print(f"| {name} | {label} ({'graphs' if graphs else 'eager'}) | {same} | "
                  f"{eng.stats.verify_steps if spec else '-'} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
