"""GLM-4-0414 (models/glm4.py) against transformers' Glm4ForCausalLM on a tiny random config (float32): a folder saved
by transformers (fused gate_up_proj, q/k/v biases, partial RoPE on adjacent pairs) through our loader, whose q / k rows
are permuted to the halves layout at load; sandwich norms; speculation against plain greedy; llama.cpp's glm4 GGUFs."""

from __future__ import annotations


import pytest
import torch
from gguf_write import finish, start_file
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.layers.rotary import pairs_to_halves
from eaglespec.loading import load_model

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


# llama.cpp's glm4 tensors (Glm4Model: q / k not permuted, gate and up as one ffn_up) -> the HF names they hold
GLM4_BLOCK = {"attn_norm": "input_layernorm", "attn_output": "self_attn.o_proj",
              "post_attention_norm": "post_self_attn_layernorm", "ffn_norm": "post_attention_layernorm",
              "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_mlp_layernorm"}


def test_llama_cpp_glm4_gguf_answers_as_transformers(pair, tmp_path):
    """llama.cpp's Glm4Model: q / k rows (and biases) as the checkpoint's, permuted to halves at load as from a folder;
    rope.dimension_count of key_length dims rotated; the sandwich norms by their llama.cpp names; gate/up fused."""
    ref, _ = pair
    c = ref.config
    w, sd = start_file(tmp_path / "m.gguf", "glm4", ref)
    w.add_rope_dimension_count(c.head_dim // 2)
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for g, h in GLM4_BLOCK.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{h}.weight"])
        for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj")):
            for kind in ("weight", "bias"):
                w.add_tensor(f"blk.{i}.{g}.{kind}", sd[f"{pre}self_attn.{h}.{kind}"])
    finish(w)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert lm.config.architecture == "Glm4ForCausalLM" and lm.config.rotary_dim == 8 and lm.config.head_dim == 16
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
