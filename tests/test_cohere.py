"""Cohere's Command models (models/cohere.py) against transformers on tiny random configs (float32): Command R
(CohereForCausalLM: parallel attention and MLP off one LayerNorm, RoPE on adjacent pairs, permuted to halves at load,
scaled logits, the head tied) and Command R7B / A (Cohere2ForCausalLM: three windowed layers of four, RoPE on those
only) and Command R+ (its per-head q / k LayerNorms); speculation against plain greedy and the cache-free forward;
llama.cpp's command-r and cohere2 GGUFs."""

from __future__ import annotations


import pytest
import torch
from gguf_write import finish, start_file
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.loading import load_model

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
    gguf_lm = load_model(write_cohere_gguf(tmp_path / "m.gguf", "command-r", ref), dtype=torch.float32)
    assert gguf_lm.config.text["use_qk_norm"]
    assert_matches_transformers(ref, gguf_lm.model, length=30, seed=2)


def write_cohere_gguf(path, arch: str, ref):
    """A command-r / cohere2 GGUF as llama.cpp's converters write one: q / k rows as the checkpoint's, the head tied,
    LayerNorm epsilon and logit scale; cohere2's window (its pattern is llama.cpp's constant: no key); R+'s q / k
    norms [heads, head_dim] where the model has them."""
    c = ref.config
    w, sd = start_file(path, arch, ref, head=False)
    w.add_layer_norm_eps(c.layer_norm_eps)
    w.add_logit_scale(c.logit_scale)
    if arch == "cohere2":
        w.add_sliding_window(c.sliding_window)
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(c.num_hidden_layers):
        for g, h in names.items():
            if f"model.layers.{i}.{h}.weight" in sd:
                w.add_tensor(f"blk.{i}.{g}.weight", sd[f"model.layers.{i}.{h}.weight"])
    finish(w)
    return path


def test_llama_cpp_command_r_and_cohere2_ggufs_answer_as_transformers(pair, tmp_path):
    case, ref, _ = pair
    arch = {"cohere": "command-r", "cohere2": "cohere2"}[case]
    lm = load_model(write_cohere_gguf(tmp_path / "m.gguf", arch, ref), dtype=torch.float32)
    assert lm.model.logits_divisor == 2.0 and lm.config.architecture == ref.config.architectures[0]
    if case == "cohere2":
        assert [lm.config.uses_rope(i) for i in range(4)] == [True, True, True, False]
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
