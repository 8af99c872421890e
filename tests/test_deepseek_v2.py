"""DeepSeek-V2 (-Lite): parity with transformers' DeepseekV2ForCausalLM (greedy and group_limited_greedy softmax
routing, weights not normalised, the router in float32), the checkpoint's names, and speculation on it."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import per_expert, tiny_drafter
from transformers import DeepseekV2Config
from transformers import DeepseekV2ForCausalLM as HFDeepseekV2

from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.layers.context import ForwardContext
from eaglespec.layers.moe import MoE, SoftmaxTopKRouter
from eaglespec.models import get_model_class
from eaglespec.models.deepseek_v3 import DeepseekV2ForCausalLM
from eaglespec.sampling_params import SamplingParams

COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
              v_head_dim=10, rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=640)
CASES = {
    # V2-Lite's shape: greedy top-6 of 64 (here 3 of 8), two shared experts, no q LoRA, a dense first layer
    "lite_greedy": dict(COMMON, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1,
                        q_lora_rank=None, topk_method="greedy", routed_scaling_factor=1.0,
                        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    # V2: group_limited_greedy over 4 groups (2 kept), q LoRA, a routed scaling, YaRN past the original 16 positions
    # with V2-Lite's mscale 0.707
    "grouped_yarn": dict(COMMON, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
                         first_k_dense_replace=0, q_lora_rank=24, topk_method="group_limited_greedy", n_group=4,
                         topk_group=2, routed_scaling_factor=2.5,
                         rope_parameters=dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=16,
                                              mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1,
                                              rope_theta=10000.0)),
}


def _pair(case: str, seed: int = 0) -> tuple[HFDeepseekV2, DeepseekV2ForCausalLM]:
    hf_cfg = DeepseekV2Config(**CASES[case])
    hf_cfg._attn_implementation = "eager"
    hf = HFDeepseekV2(hf_cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # O(1) logits and routing that depends on the inputs (transformers' init is too small)
        for name, t in hf.named_parameters():
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g) if t.dim() == 1
                    else torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))
    d = hf_cfg.to_dict()
    d["architectures"] = ["DeepseekV2ForCausalLM"]
    cfg = ModelConfig.from_hf(d)
    ours = get_model_class(cfg.architecture)(cfg).eval()
    ours.load_state_dict(per_expert(hf.state_dict()), strict=True)  # the checkpoint's names, every one used
    return hf, ours


@pytest.fixture(scope="module", params=list(CASES))
def pair(request):
    return _pair(request.param)


@torch.no_grad()
def test_logits_match_transformers(pair):
    hf, ours = pair
    assert type(ours) is DeepseekV2ForCausalLM
    moe = ours.config.moe
    assert (moe.scoring_func, moe.norm_topk_prob, moe.router_float32) == ("softmax", False, True)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    ref = hf(ids).logits
    for absorb in (False, True):
        for layer in ours.model.layers:
            layer.self_attn.absorb = absorb
        out = ours(ids, ForwardContext.plain(*ids.shape)).logits
        assert (out - ref).abs().max() <= 1e-4
    for layer in ours.model.layers:
        layer.self_attn.absorb = None
    assert ref.std() > 0.3  # not near-zero logits


@torch.no_grad()
def test_the_router_selects_as_transformers(pair):
    """Per MoE layer, the same experts and weights as transformers' DeepseekV2TopkRouter, group limit included."""
    hf, ours = pair
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(2))
    sparse = [i for i, layer in enumerate(ours.model.layers) if isinstance(layer.mlp, MoE)]
    assert sparse
    for i in sparse:
        _, ref_w, ref_ids = hf.model.layers[i].mlp.gate(x)
        w, ids = ours.model.layers[i].mlp.gate(x)
        ref_w, order = ref_w.sort(-1, descending=True)  # transformers' top-k is unsorted
        assert torch.equal(ids, ref_ids.gather(1, order)) and torch.allclose(w, ref_w, atol=1e-6)
        router = ours.model.layers[i].mlp.gate
        if router.n_group > 1:  # every token's experts lie in topk_group groups
            groups = ids // (router.num_experts // router.n_group)
            assert all(len(set(row.tolist())) <= router.topk_group for row in groups)


def test_the_router_stays_float32_under_a_model_dtype():
    _, ours = _pair("lite_greedy")
    ours.to(torch.bfloat16)
    gates = [m for m in ours.modules() if isinstance(m, SoftmaxTopKRouter)]
    assert gates and all(g.weight.dtype == torch.float32 for g in gates)
    assert ours.model.layers[1].mlp.experts[0].up_proj.weight.dtype == torch.bfloat16
    ids = torch.tensor([[3, 9, 27]])
    assert ours(ids, ForwardContext.plain(*ids.shape)).logits.dtype == torch.bfloat16


def test_speculation_on_deepseek_v2_equals_plain():
    """Greedy speculation (a chain and a tree) gives plain greedy's tokens, float32 on the CPU."""
    _, target = _pair("grouped_yarn", seed=3)
    drafter = tiny_drafter(target, seed=1, hidden=target.config.hidden_size)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 5], list(range(10, 40))]
    ref = [o.token_ids for o in Engine(target, None).generate(prompts, params)]
    for spec in (SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)):
        eng = Engine(target, None, EngineConfig(max_batch_size=2), drafter=drafter, spec=spec)
        assert [o.token_ids for o in eng.generate(prompts, params)] == ref
        assert eng.stats.verify_steps > 0


def test_v2_configs_default_to_v2_routing():
    """A V2 config.json without the routing fields (the original checkpoints' configs omit scoring_func) routes as
    V2 (softmax, greedy, not normalised, float32); a V3 one as V3."""
    from eaglespec.config import MoEConfig

    fields = dict(n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408, n_shared_experts=2)
    v2, v3 = MoEConfig.from_hf(fields, "deepseek_v2"), MoEConfig.from_hf(fields, "deepseek_v3")
    assert (v2.scoring_func, v2.topk_method, v2.norm_topk_prob, v2.router_float32) == ("softmax", "greedy", False,
                                                                                       True)
    assert (v3.scoring_func, v3.topk_method, v3.norm_topk_prob, v3.router_float32) == ("sigmoid", "noaux_tc", True,
                                                                                       False)
