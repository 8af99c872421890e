"""SmolLM3 (`SmolLM3ForCausalLM`: models/llama.py's skeleton with NoPE layers) against transformers on a tiny random
config (float32): every fourth layer skips RoPE (`no_rope_layers`), with and without the sliding window on those
layers; speculation against plain greedy and the cache-free forward; llama.cpp's smollm3 GGUFs."""

from __future__ import annotations


import gguf
import pytest
import torch
from gguf_write import add_common, add_llama_layers, finish
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.config import ModelConfig
from eaglespec.errors import ConfigError
from eaglespec.loading import load_model

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
              pad_token_id=0, rope_parameters=dict(rope_type="default", rope_theta=5e6))


@pytest.fixture(scope="module", params=[False, True], ids=["nope", "nope-windowed"])
def pair(request, tmp_path_factory):
    return (request.param, *transformers_pair("SmolLM3", tmp_path_factory.mktemp("smollm3"), **CONFIG,
                                              use_sliding_window=request.param, sliding_window=8))


def test_a_transformers_folder_answers_as_transformers(pair):
    windowed, ref, lm = pair
    cfg = lm.config
    assert [cfg.uses_rope(i) for i in range(4)] == [True, True, True, False]
    assert [cfg.window_of(i) for i in range(4)] == ([None, None, None, 8] if windowed else [None] * 4)
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_released_config_and_bad_lists():
    """The released config names only no_rope_layer_interval (every 4th layer NoPE); a list of the wrong length is
    refused."""
    d = dict(CONFIG, architectures=["SmolLM3ForCausalLM"], model_type="smollm3", num_hidden_layers=8)
    assert [ModelConfig.from_hf(d).uses_rope(i) for i in range(8)] == [True, True, True, False] * 2
    with pytest.raises(ConfigError, match="no_rope_layers has 3 entries for 8 layers"):
        ModelConfig.from_hf(dict(d, no_rope_layers=[1, 1, 0]))


def test_llama_cpp_smollm3_gguf_answers_as_transformers(pair, tmp_path):
    """llama.cpp's SmolLM3Model: a Llama file (q / k rows permuted); its NoPE layers are llama.cpp's every fourth."""
    windowed, ref, _ = pair
    if windowed:  # (llama.cpp's SmolLM3 has no window)
        return
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "smollm3")
    add_common(w, c, sd)
    add_llama_layers(w, c, sd)
    finish(w)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert [lm.config.uses_rope(i) for i in range(4)] == [True, True, True, False]
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
