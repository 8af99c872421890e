"""Qwen3-MoE (models/qwen_moe.py) against transformers on tiny random configs (float32): logits and aux states with
every layer sparse and with dense and sparse layers mixed, the softmax top-k router, a checkpoint folder written by
transformers loaded through our loader, the engine's greedy speculation against plain greedy, and what is refused."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from tiny import assert_speculation_equals_plain, per_expert, randomize_moe, tiny_drafter

from eaglespec.config import EngineConfig, ModelConfig, MoEConfig, SpecConfig
from eaglespec.engine import transforms
from eaglespec.engine.engine import Engine
from eaglespec.errors import ConfigError
from eaglespec.layers.context import ForwardContext
from eaglespec.layers.mlp import GatedMLP
from eaglespec.layers.moe import MoE, SoftmaxTopKRouter, make_router
from eaglespec.loading import load_model
from eaglespec.models import get_model_class
from eaglespec.sampling_params import SamplingParams

COMMON = dict(vocab_size=101, hidden_size=48, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=5,
              max_position_embeddings=256, rms_norm_eps=1e-5, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, rope_theta=1e6)
CASES = {
    # (a) every layer sparse, the top-k weights renormalised, an untied head, biases on the attention
    "all_sparse": dict(num_experts=8, num_experts_per_tok=3, norm_topk_prob=True, tie_word_embeddings=False,
                       attention_bias=True),
    # (b) sparse layers 1 and 5 of 6 (decoder_sparse_step 2, layer 3 listed as dense), raw softmax weights, tied
    "mixed": dict(num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=2,
                  mlp_only_layers=[3], num_hidden_layers=6, tie_word_embeddings=True),
}
SPARSE = {"all_sparse": [0, 1, 2, 3, 4], "mixed": [1, 5]}


def hf_model(case: str, seed: int = 0) -> transformers.Qwen3MoeForCausalLM:
    hc = transformers.Qwen3MoeConfig(**{**COMMON, **CASES[case]})
    hc.architectures = ["Qwen3MoeForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Qwen3MoeForCausalLM(hc).eval()
    randomize_moe(ref, seed)
    return ref


def ours_of(ref: transformers.Qwen3MoeForCausalLM) -> torch.nn.Module:
    cfg = ModelConfig.from_hf(ref.config.to_dict())
    ours = get_model_class(cfg.architecture)(cfg).eval()
    ours.load_state_dict(per_expert(ref.state_dict()), strict=True)  # tied: lm_head.weight is embed_tokens.weight
    return ours


@pytest.fixture(scope="module", params=list(CASES))
def pair(request):
    ref = hf_model(request.param)
    return request.param, ref, ours_of(ref)


def test_config_and_structure(pair):
    case, ref, ours = pair
    moe = ours.config.moe
    assert (moe.scoring_func, moe.topk_method, moe.n_shared_experts) == ("softmax", "greedy", 0)
    assert moe.n_routed_experts == ref.config.num_experts and moe.norm_topk_prob == ref.config.norm_topk_prob
    kinds = [isinstance(layer.mlp, MoE) for layer in ours.model.layers]
    assert [i for i, k in enumerate(kinds) if k] == SPARSE[case]
    assert kinds == [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in ref.model.layers]
    for layer in ours.model.layers:
        if isinstance(layer.mlp, MoE):
            assert isinstance(layer.mlp.gate, SoftmaxTopKRouter) and layer.mlp.shared_experts is None
            assert layer.mlp.experts[0].down_proj.in_features == 24
        else:
            assert isinstance(layer.mlp, GatedMLP) and layer.mlp.down_proj.in_features == 80
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == (case == "mixed")
    assert (ours.model.layers[0].self_attn.o_proj.bias is not None) == ref.config.attention_bias  # o_proj too


@torch.no_grad()
def test_logits_and_aux_match_transformers(pair):
    _, ref, ours = pair
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    layers = [0, 2, 3]
    ours.set_eagle3_layers_to_capture(layers)
    r = ref(ids, output_hidden_states=True)
    o = ours(ids, ForwardContext.plain(2, 40))
    ours.set_eagle3_layers_to_capture(None)
    assert r.logits.std() > 0.3  # the comparison is not between near-zero logits
    assert (o.logits - r.logits).abs().max().item() <= 1e-4
    expected_aux = torch.cat([r.hidden_states[i + 1] for i in layers], dim=-1)
    assert (o.aux_hidden - expected_aux).abs().max().item() <= 1e-4


@torch.no_grad()
def test_routing_depends_on_the_input(pair):
    """The parity above means something only if the tokens go to different experts."""
    _, _, ours = pair
    moe = next(layer.mlp for layer in ours.model.layers if isinstance(layer.mlp, MoE))
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(4))
    _, ids = moe.gate(x)
    assert len(set(ids.flatten().tolist())) == moe.gate.num_experts
    assert len({tuple(sorted(row)) for row in ids.tolist()}) > 5


@pytest.mark.parametrize("norm", [True, False])
def test_softmax_router_equals_direct_computation(norm):
    moe = MoEConfig(n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=0, moe_intermediate_size=4,
                    norm_topk_prob=norm, scoring_func="softmax", topk_method="greedy")
    router = make_router(6, moe)
    assert isinstance(router, SoftmaxTopKRouter)
    with torch.no_grad():
        router.weight.copy_(torch.eye(6))
    # logits = x: probabilities exp(x) / sum exp(x); the top 2 are experts 3 and 0
    x = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0, 1.0]])
    w, ids = router(x)
    assert ids[0].tolist() == [3, 0] and w.dtype == torch.float32
    p = [math.exp(v) for v in x[0].tolist()]
    want = [p[3], p[0]]
    want = [v / sum(want) for v in want] if norm else [v / sum(p) for v in want]
    torch.testing.assert_close(w[0], torch.tensor(want))
    # many tokens: the same as softmax -> topk -> (renormalise) written out
    xs = torch.randn(50, 6, generator=torch.Generator().manual_seed(0))
    w, ids = router(xs)
    probs = torch.softmax(xs, -1)
    top = probs.sort(-1, descending=True)
    assert torch.equal(ids, top.indices[:, :2])
    ref = top.values[:, :2]
    torch.testing.assert_close(w, ref / ref.sum(-1, keepdim=True) if norm else ref)
    if norm:
        torch.testing.assert_close(w.sum(-1), torch.ones(50))


def test_router_follows_the_model_dtype():
    """Unlike DeepSeek's float32 router, Qwen's gate is a plain projection in the model's dtype (transformers, vLLM);
    the softmax and the weights are float32 whatever it is."""
    moe = MoEConfig(n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=0, moe_intermediate_size=4,
                    scoring_func="softmax", topk_method="greedy")
    router = make_router(8, moe).to(torch.bfloat16)
    assert router.weight.dtype == torch.bfloat16
    w, ids = router(torch.randn(3, 8, dtype=torch.bfloat16))
    assert w.dtype == torch.float32 and ids.shape == (3, 2)


def test_a_checkpoint_folder_loads_and_answers_as_transformers(tmp_path):
    """A folder saved by transformers (config.json + safetensors, one tensor per expert as the released checkpoints
    have; its config names the experts num_local_experts) through our loader: transformers' logits."""
    from safetensors import safe_open

    ref = hf_model("all_sparse", seed=3)
    ref.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in names and "model.layers.0.mlp.gate.weight" in names
    lm = load_model(tmp_path, device="cpu", dtype=torch.float32)
    assert type(lm.model).__name__ == "Qwen3MoeForCausalLM" and lm.config.moe.n_routed_experts == 8
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = ref(ids).logits
        got = lm.model(ids, ForwardContext.plain(2, 30)).logits
    assert (got - want).abs().max().item() <= 1e-4


def test_released_config_names_parse():
    """Qwen3-30B-A3B's config.json spelling (`num_experts`, `rope_theta`, `mlp_only_layers: []`)."""
    d = dict(COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=8,
             num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
             use_sliding_window=False, sliding_window=None, max_window_layers=48, router_aux_loss_coef=0.001,
             output_router_logits=False)
    cfg = ModelConfig.from_hf(d)
    assert cfg.moe == MoEConfig(n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=0,
                                moe_intermediate_size=24, norm_topk_prob=True, scoring_func="softmax",
                                topk_method="greedy")
    assert cfg.head_dim == 16 and cfg.rope.theta == 1e6
    dense = ModelConfig.from_hf(dict(d, num_experts=0))  # no experts: every layer is the dense MLP
    assert dense.moe is None
    with torch.device("meta"):
        m = get_model_class("Qwen3MoeForCausalLM")(dense)
    assert all(isinstance(layer.mlp, GatedMLP) for layer in m.model.layers)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_speculation_equals_plain(case):
    """Through the engine with a tiny EAGLE-3 drafter: speculative greedy output equals plain, for a chain and a tree,
    three prompts batched (the MoE dispatches prefill, verify and decode rows alike)."""
    ours = ours_of(hf_model(case, seed=1))
    drafter = tiny_drafter(ours, seed=2, hidden=48)
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 2], list(range(20, 45))]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = assert_speculation_equals_plain(ours, drafter, prompts, params, (SpecConfig(3, 1, 4), SpecConfig(4, 3, 8)))
    assert all(len(set(p)) > 8 for p in plain)


def test_cuda_transforms_leave_the_moe_layers_alone():
    """CUDA's layer transforms on the mixed target (run here through Triton's interpreter): fused projections reach
    the experts too; the add + norm + projection kernel and the folded norms take only the dense layers (a router
    reads the post-attention norm's output, so a MoE layer keeps its module path); plain greedy output is unchanged."""
    ours = ours_of(hf_model("mixed", seed=1))
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 2]]
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)  # (the interpreted kernels are slow: a short run)
    plain = [o.token_ids for o in Engine(ours, None, EngineConfig(max_batch_size=2)).generate(prompts, params)]
    fused = ours_of(hf_model("mixed", seed=1))
    transforms.fold_norms(transforms.use_norm_linear_kernel(transforms.fuse_projections(fused), max_rows=4))
    sparse = [isinstance(layer.mlp, MoE) for layer in fused.model.layers]
    assert [layer.folded_norms for layer in fused.model.layers] == [not s for s in sparse]
    assert all(layer.norm_linear is None for layer, s in zip(fused.model.layers, sparse) if s)
    assert all(hasattr(e, "gate_up_proj") for e in fused.model.layers[1].mlp.experts)
    got = Engine(fused, None, EngineConfig(max_batch_size=2)).generate(prompts, params)  # prefill 6 tokens: folded
    assert [o.token_ids for o in got] == plain  # decode steps of 2 rows: the fused kernel in the dense layers


def test_a_sliding_window_windows_every_layer():
    """Qwen3-MoE windows all its layers (transformers' Qwen3MoeAttention), and the window no longer caps the
    context (tests/test_sliding_window.py)."""
    cfg = transformers.Qwen3MoeConfig(**{**COMMON, **CASES["all_sparse"]}, use_sliding_window=True,
                                      sliding_window=16)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    ours = ModelConfig.from_hf(cfg.to_dict())
    assert [ours.window_of(i) for i in range(5)] == [16] * 5 and ours.context_limit == 256


def test_unknown_routing_is_refused():
    moe = MoEConfig(n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=0, moe_intermediate_size=4,
                    scoring_func="softmax", topk_method="noaux_tc")
    with pytest.raises(ConfigError, match="MoE routing softmax / noaux_tc .* is not implemented .*softmax / greedy"):
        MoE(8, moe)
    uneven = MoEConfig(n_routed_experts=5, num_experts_per_tok=2, n_shared_experts=0, moe_intermediate_size=4,
                       scoring_func="softmax", topk_method="group_limited_greedy", n_group=2, topk_group=1)
    with pytest.raises(ConfigError, match="5 experts do not split into 2 groups"):
        MoE(8, uneven)
