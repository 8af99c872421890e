"""Qwen2-MoE (models/qwen_moe.py's Qwen2MoeForCausalLM) against transformers on a tiny random config (float32): a
folder saved by transformers (its `shared_expert` / `shared_expert_gate` names) through our loader, with dense and
sparse layers mixed, and llama.cpp's `qwen2moe` GGUF; the sigmoid gate on the shared expert; speculation against plain
greedy."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf_write import add_common, checkpoint_names, finish
from tiny import assert_family_speculates, assert_matches_transformers, per_expert, randomize_moe

from eaglespec.layers.moe import MoE
from eaglespec.loading import GGUFFile, load_model

CONFIG = dict(vocab_size=101, hidden_size=48, intermediate_size=80, moe_intermediate_size=24,
              shared_expert_intermediate_size=40, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[2],
              max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hc = transformers.Qwen2MoeConfig(**CONFIG)
    hc.architectures = ["Qwen2MoeForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Qwen2MoeForCausalLM(hc).eval()
    randomize_moe(ref, 0)
    folder = tmp_path_factory.mktemp("qwen2moe")
    ref.save_pretrained(folder)
    return ref, load_model(folder, dtype=torch.float32)


def test_a_transformers_folder_answers_as_transformers(pair):
    ref, lm = pair
    assert type(lm.model).__name__ == "Qwen2MoeForCausalLM"
    moe = lm.config.moe
    assert (moe.n_routed_experts, moe.n_shared_experts, moe.shared_intermediate_size, moe.shared_gate,
            moe.norm_topk_prob) == (6, 1, 40, True, False)
    sparse = [isinstance(layer.mlp, MoE) for layer in lm.model.model.layers]
    assert sparse == [True, True, False, True]  # mlp_only_layers [2]
    assert lm.model.model.layers[0].mlp.shared_experts.up_proj.weight.shape == (40, 48)
    assert_matches_transformers(ref, lm.model, length=30, seed=2)


def test_the_shared_expert_gate_scales_the_shared_output(pair):
    _, lm = pair
    moe = lm.model.model.layers[0].mlp
    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = moe(x)
        routed = moe._routed(x, *moe.gate(x))
        shared = moe.shared_experts(x) * torch.sigmoid(moe.shared_expert_gate(x))
    torch.testing.assert_close(full, routed + shared, rtol=1e-5, atol=1e-5)
    assert (torch.sigmoid(moe.shared_expert_gate(x)) - 1).abs().max() > 0.05  # a gate that matters here


def test_greedy_speculation_equals_plain(pair):
    _, lm = pair
    assert_family_speculates(lm.model, hidden=48)


BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
         "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
         "ffn_down_shexp": "mlp.shared_expert.down_proj"}


def write_qwen2moe_gguf(path: Path, ref: transformers.Qwen2MoeForCausalLM) -> None:
    """`ref` (every layer sparse) as llama.cpp writes Qwen2-MoE: q/k/v biases, experts stacked per projection, the
    shared expert `ffn_*_shexp` and its gate `ffn_gate_inp_shexp`."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in per_expert(ref.state_dict()).items()}
    w = gguf.GGUFWriter(str(path), "qwen2moe")
    add_common(w, c, sd)
    w.add_expert_count(c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for g, h in BLOCK.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{h}.weight"])
        for g in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(f"blk.{i}.{g}.bias", sd[f"{pre}{BLOCK[g]}.bias"])
        for proj in ("gate", "up", "down"):
            w.add_tensor(f"blk.{i}.ffn_{proj}_exps.weight",
                         np.stack([sd[f"{pre}mlp.experts.{e}.{proj}_proj.weight"] for e in range(c.num_experts)]))
    finish(w)


def test_llama_cpp_qwen2moe_gguf_answers_as_transformers(tmp_path):
    hc = transformers.Qwen2MoeConfig(**{**CONFIG, "mlp_only_layers": []})  # llama.cpp's qwen2moe: every layer sparse
    hc._attn_implementation = "eager"
    ref = transformers.Qwen2MoeForCausalLM(hc).eval()
    randomize_moe(ref, 4)
    write_qwen2moe_gguf(tmp_path / "m.gguf", ref)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert {n for n, _ in GGUFFile(tmp_path / "m.gguf").hf_tensors()} == checkpoint_names(ref, tmp_path / "hf")
    moe = lm.config.moe
    assert lm.config.architecture == "Qwen2MoeForCausalLM" and (moe.shared_intermediate_size, moe.shared_gate,
                                                                   moe.norm_topk_prob) == (40, True, False)
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
