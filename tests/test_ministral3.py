"""Ministral 3 (`Ministral3ForCausalLM`, models/llama.py) against transformers on a tiny random config (float32): YaRN
RoPE and the query scaling of its rope parameters' `llama_4_scaling_beta` past the original positions (16 of them
here, 40 tokens), as `Ministral3ForCausalLM` and through the releases' Mistral 3 wrapper; speculation against plain
greedy and the cache-free forward."""

from __future__ import annotations

import torch
import transformers
from tiny import assert_family_speculates, assert_matches_transformers, plain_logits, randomize_moe, transformers_pair

from eaglespec.loading import load_model

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


def test_the_releases_wrapper_scales_its_queries(tmp_path):
    """Ministral 3 as released: Mistral 3's multimodal wrapper over a `ministral3` text config (its vision tower
    skipped); the text logits past the original positions equal transformers'."""
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, image_size=32, patch_size=8, head_dim=16)
    hc = transformers.Mistral3Config(text_config=dict(CONFIG, model_type="ministral3"), vision_config=vision,
                                     image_token_index=100, spatial_merge_size=2, tie_word_embeddings=False)
    hc.architectures = ["Mistral3ForConditionalGeneration"]
    ref = transformers.Mistral3ForConditionalGeneration(hc).eval()
    randomize_moe(ref, 2)
    ref.save_pretrained(tmp_path)
    lm = load_model(tmp_path, dtype=torch.float32)
    assert lm.model.language_model.model.layers[0].self_attn.temperature == (16.0, 0.3, 0.0)
    ids = torch.randint(0, 100, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    torch.testing.assert_close(plain_logits(lm.model, ids), want, rtol=1e-4, atol=1e-4)
