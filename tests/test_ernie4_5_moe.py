"""ERNIE 4.5 MoE (models/qwen_moe.py's Ernie4_5_MoeForCausalLM) against transformers on a tiny random config (float32):
RoPE on pairs permuted at load, a dense first layer, the float32 softmax router choosing by probability plus a
correction bias (random here, so that it changes choices) and weighting by probability, a shared expert; speculation
against plain greedy and the cache-free forward; use_bias refused."""

from __future__ import annotations

import pytest
import torch
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.config import ModelConfig
from eaglespec.errors import ConfigError
from eaglespec.layers.moe import MoE
from eaglespec.loading import load_model
from eaglespec.models import get_model_class

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, moe_num_experts=8, moe_k=2, moe_num_shared_experts=1,
              max_position_embeddings=256, rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              rope_parameters=dict(rope_type="default", rope_theta=5e5))


def test_a_transformers_folder_answers_as_transformers_and_speculates(tmp_path):
    ref, _ = transformers_pair("Ernie4_5_Moe", tmp_path, **CONFIG)
    with torch.no_grad():  # a correction bias that changes choices (transformers' init leaves it 0), saved again
        for layer in ref.model.layers[1:]:
            layer.mlp.gate.moe_statics.e_score_correction_bias.copy_(
                0.2 * torch.randn(1, 8, generator=torch.Generator().manual_seed(5)))
    ref.save_pretrained(tmp_path)
    lm = load_model(tmp_path, dtype=torch.float32)
    layers = lm.model.model.layers
    assert [isinstance(layer.mlp, MoE) for layer in layers] == [False, True, True]
    gate = layers[1].mlp.gate
    assert gate.e_score_correction_bias.shape == (8,) and gate.e_score_correction_bias.abs().max() > 0.05
    assert not gate.fused and lm.model.lm_head.weight is lm.model.model.embed_tokens.weight  # tied by default
    assert_matches_transformers(ref, lm.model)
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_use_bias_is_refused():
    cfg = ModelConfig.from_hf(dict(CONFIG, architectures=["Ernie4_5_MoeForCausalLM"], model_type="ernie4_5_moe",
                                   use_bias=True))
    with pytest.raises(ConfigError, match=r"Ernie4_5_MoeForCausalLM with use_bias \(biased experts\) is not"):
        get_model_class(cfg.architecture)(cfg)
