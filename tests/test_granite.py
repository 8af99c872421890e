"""Granite 3 (models/granite.py) against transformers' GraniteForCausalLM on a tiny random config (float32): its
embedding, attention, residual and logits multipliers (the residual one folded into o_proj / down_proj at load), the
head tied; speculation against plain greedy and the cache-free forward; llama.cpp's granite GGUFs."""

from __future__ import annotations


import gguf
import pytest
import torch
from gguf_write import add_common, add_llama_layers, finish
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.loading import load_model

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
              pad_token_id=0, embedding_multiplier=2.0, attention_multiplier=0.09, residual_multiplier=0.8,
              logits_scaling=4.0, rope_parameters=dict(rope_type="default", rope_theta=1e4))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return transformers_pair("Granite", tmp_path_factory.mktemp("granite"), **CONFIG)


def test_a_transformers_folder_answers_as_transformers(pair):
    ref, lm = pair
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    assert (lm.model.logits_divisor, lm.model.model.layers[0].self_attn.scale) == (4.0, 0.09)
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_llama_cpp_granite_gguf_answers_as_transformers(pair, tmp_path):
    """llama.cpp's GraniteModel: a Llama file (q / k rows permuted), the four multipliers as granite.* fields, the
    head tied (no output tensor)."""
    ref, _ = pair
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "granite")
    add_common(w, c, sd, head=False)  # tied
    w.add_embedding_scale(c.embedding_multiplier)
    w.add_residual_scale(c.residual_multiplier)
    w.add_attention_scale(c.attention_multiplier)
    w.add_logit_scale(c.logits_scaling)
    add_llama_layers(w, c, sd)
    finish(w)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert lm.config.architecture == "GraniteForCausalLM" and lm.model.logits_divisor == 4.0
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
