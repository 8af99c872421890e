"""Ministral 3 (`Ministral3ForCausalLM`, models/llama.py) against transformers on a tiny random config (float32): YaRN
RoPE and the query scaling of its rope parameters' `llama_4_scaling_beta` past the original positions (16 of them
here, 40 tokens); speculation against plain greedy and the cache-free forward."""

from __future__ import annotations

from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
              tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=16.0, original_max_position_embeddings=16,
                                   beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                   llama_4_scaling_beta=0.3))


def test_a_transformers_folder_answers_as_transformers_and_speculates(tmp_path):
    ref, lm = transformers_pair("Ministral3", tmp_path, **CONFIG)
    assert all(layer.self_attn.temperature == (16.0, 0.3, 0.0) for layer in lm.model.model.layers)
    assert lm.config.rope.type == "yarn"
    assert_matches_transformers(ref, lm.model)
    assert_family_speculates(lm.model, hidden=64, recompute=True)
