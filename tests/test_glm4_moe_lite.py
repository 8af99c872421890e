"""GLM-4.7-Flash (`Glm4MoeLiteForCausalLM`: DeepSeek-V3's MLA and router, its MLPs listed per layer by
`mlp_layer_types`) through models/deepseek_v3.py against transformers on a tiny random config (float32); speculation
against plain greedy."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny import assert_family_speculates, assert_matches_transformers, randomize_moe

from eaglespec.layers.moe import MoE
from eaglespec.loading import load_model

CONFIG = dict(vocab_size=101, hidden_size=48, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
              num_experts_per_tok=3, routed_scaling_factor=1.8, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
              qk_nope_head_dim=12, v_head_dim=10, max_position_embeddings=256, rms_norm_eps=1e-5,
              mlp_layer_types=["dense", "sparse", "dense"], tie_word_embeddings=False,
              rope_parameters=dict(rope_type="default", rope_theta=1e4))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hc = transformers.Glm4MoeLiteConfig(**CONFIG)
    hc.architectures = ["Glm4MoeLiteForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Glm4MoeLiteForCausalLM(hc).eval()
    randomize_moe(ref, 0)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():  # a correction bias that matters (a buffer: not randomized)
        for name, b in ref.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))
    folder = tmp_path_factory.mktemp("glm4moelite")
    ref.save_pretrained(folder)
    return ref, load_model(folder, dtype=torch.float32)


def test_a_transformers_folder_answers_as_transformers(pair):
    ref, lm = pair
    assert [isinstance(layer.mlp, MoE) for layer in lm.model.model.layers] == [False, True, False]
    assert_matches_transformers(ref, lm.model, length=30, seed=1)


def test_greedy_speculation_equals_plain(pair):
    _, lm = pair
    assert_family_speculates(lm.model, hidden=48)
