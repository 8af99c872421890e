"""Cohere's Command models (models/cohere.py) against transformers on tiny random configs (float32): Command R
(CohereForCausalLM: parallel attention and MLP off one LayerNorm, RoPE on adjacent pairs, permuted to halves at load,
scaled logits, the head tied) and Command R7B / A (Cohere2ForCausalLM: three windowed layers of four, RoPE on those
only) and Command R+ (its per-head q / k LayerNorms); speculation against plain greedy and the cache-free forward."""

from __future__ import annotations


import pytest
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, layer_norm_eps=1e-5, logit_scale=0.5,
              pad_token_id=0, bos_token_id=1, eos_token_id=2,
              rope_parameters=dict(rope_type="default", rope_theta=1e4))


@pytest.fixture(scope="module", params=["cohere", "cohere2"])
def pair(request, tmp_path_factory):
    prefix = {"cohere": "Cohere", "cohere2": "Cohere2"}[request.param]
    extra = dict(sliding_window=8) if request.param == "cohere2" else {}
    return (request.param, *transformers_pair(prefix, tmp_path_factory.mktemp(request.param), **CONFIG, **extra))


def test_a_transformers_folder_answers_as_transformers(pair):
    case, ref, lm = pair
    cfg = lm.model.config
    if case == "cohere2":
        assert [cfg.window_of(i) for i in range(4)] == [8, 8, 8, None]
        assert [cfg.uses_rope(i) for i in range(4)] == [True, True, True, False]
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight and lm.model.logits_divisor == 2.0
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_command_r_plus_qk_norms_answer_as_transformers(tmp_path):
    """Command R+'s per-head q / k LayerNorms (weights [heads, head_dim], random so that their permutation to halves
    matters): logits and speculation."""
    from eaglespec.models.cohere import CohereQKNormAttention

    ref, lm = transformers_pair("Cohere", tmp_path, **CONFIG, use_qk_norm=True)
    attn = lm.model.model.layers[0].self_attn
    assert isinstance(attn, CohereQKNormAttention) and attn.q_norm.weight.shape == (4, 16)
    assert attn.k_norm.weight.shape == (2, 16) and attn.k_norm.weight.std() > 0.05
    assert_matches_transformers(ref, lm.model)
    assert_family_speculates(lm.model, hidden=64, recompute=True)
