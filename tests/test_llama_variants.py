"""Llama-layout families served by models/llama.py against transformers on tiny random configs (float32): Seed-OSS
(`SeedOssForCausalLM`: q/k/v biases, o_proj's as `attention_out_bias` says) and ERNIE 4.5 dense
(`Ernie4_5ForCausalLM`: `use_bias`, RoPE on adjacent pairs permuted to halves at load, the head tied); speculation
against plain greedy and the cache-free forward; llama.cpp's ernie4_5 GGUFs."""

from __future__ import annotations


import pytest
import torch
from gguf_write import finish, start_file
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.loading import load_model


COMMON = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, pad_token_id=0,
              rope_parameters=dict(rope_type="default", rope_theta=1e4))
CASES = {
    "seed_oss": ("SeedOss", dict(attention_bias=True, attention_out_bias=False, tie_word_embeddings=False)),
    "seed_oss o-bias": ("SeedOss", dict(attention_bias=True, attention_out_bias=True, tie_word_embeddings=False)),
    "ernie4_5": ("Ernie4_5", dict(use_bias=True)),  # tied, as released
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    prefix, kw = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param.replace(" ", "_"))
    return (request.param, *transformers_pair(prefix, folder, **COMMON, **kw))


def test_a_transformers_folder_answers_as_transformers(pair):
    case, ref, lm = pair
    attn = lm.model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and (attn.o_proj.bias is not None) == (case != "seed_oss")
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_llama_cpp_ernie4_5_gguf_answers_as_transformers(tmp_path):
    """llama.cpp's Ernie4_5Model: Llama's tensor names with the biases, q / k rows as the checkpoint's (RoPE on pairs,
    turned to halves at load as from a folder), the head tied (no output tensor), key_length as head_dim."""
    ref, _ = transformers_pair("Ernie4_5", tmp_path / "hf", **COMMON, use_bias=True)
    c = ref.config
    w, sd = start_file(tmp_path / "m.gguf", "ernie4_5", ref, head=False)  # tied
    w.add_value_length(c.head_dim)
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[f"{pre}input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[f"{pre}post_attention_layernorm.weight"])
        for g, h in (("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
                     ("attn_output", "self_attn.o_proj"), ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"),
                     ("ffn_down", "mlp.down_proj")):
            for kind in ("weight", "bias"):  # use_bias: the attention's and the MLP's
                w.add_tensor(f"blk.{i}.{g}.{kind}", sd[f"{pre}{h}.{kind}"])
    finish(w)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert lm.config.architecture == "Ernie4_5ForCausalLM" and lm.config.attention_bias and lm.config.mlp_bias
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
