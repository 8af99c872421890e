"""GLM-4-0414 (models/glm4.py) against transformers' Glm4ForCausalLM on a tiny random config (float32): a folder saved
by transformers (fused gate_up_proj, q/k/v biases, partial RoPE on adjacent pairs) through our loader, whose q / k rows
are permuted to the halves layout at load; sandwich norms; speculation against plain greedy."""

from __future__ import annotations


import pytest
import torch
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.layers.rotary import pairs_to_halves

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
              attention_bias=True, tie_word_embeddings=False, pad_token_id=0,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return transformers_pair("Glm4", tmp_path_factory.mktemp("glm4"), **CONFIG)


def test_a_transformers_folder_answers_as_transformers(pair):
    ref, lm = pair
    assert lm.config.rotary_dim == 8
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain(pair):
    _, lm = pair
    assert_family_speculates(lm.model, hidden=64)


def test_pairs_to_halves():
    """Within each head's rotated rows: evens, then odds; the unrotated rows stay."""
    w = torch.arange(2 * 8).float()  # 2 heads of 8 rows, 4 rotated
    assert pairs_to_halves(w, 2, 4).tolist() == [0, 2, 1, 3, 4, 5, 6, 7, 8, 10, 9, 11, 12, 13, 14, 15]
