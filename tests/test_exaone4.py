"""EXAONE 4 (models/olmo2.py's Exaone4ForCausalLM) against transformers on tiny random configs (float32): OLMo 2's
post-norm layers with per-head q / k norms; with a window, three layers of four windowed and rotated, the fourth
global and NoPE (past the window: 40 tokens, a window of 8); without one, every layer global and rotated;
speculation against plain greedy and the cache-free forward; the released "LLLG" pattern; llama.cpp's exaone4 GGUFs."""

from __future__ import annotations

import pytest
import torch
from gguf_write import finish, start_file
from test_olmo2 import OLMO2_BLOCK
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.config import ModelConfig
from eaglespec.layers.attention import QKNormAttention
from eaglespec.loading import load_model

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
              tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              rope_parameters=dict(rope_type="default", rope_theta=1e6))


@pytest.fixture(scope="module", params=[8, None], ids=["windowed", "global"])
def pair(request, tmp_path_factory):
    # (transformers' own config divides by the pattern without a window unless the layer types are given)
    types = {} if request.param else dict(layer_types=["full_attention"] * 4)
    return (request.param, *transformers_pair("Exaone4", tmp_path_factory.mktemp("exaone4"), **CONFIG,
                                              sliding_window=request.param, **types))


def test_a_transformers_folder_answers_as_transformers(pair):
    window, ref, lm = pair
    cfg = lm.config
    assert [cfg.window_of(i) for i in range(4)] == ([8, 8, 8, None] if window else [None] * 4)
    assert [cfg.uses_rope(i) for i in range(4)] == ([True, True, True, False] if window else [True] * 4)
    assert isinstance(lm.model.model.layers[0].self_attn, QKNormAttention)
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_the_released_pattern():
    """EXAONE-4.0-32B's config names its layers by letters, "LLLG" (no layer_types)."""
    d = dict(CONFIG, architectures=["Exaone4ForCausalLM"], model_type="exaone4", num_hidden_layers=8,
             sliding_window=4096, sliding_window_pattern="LLLG")
    cfg = ModelConfig.from_hf(d)
    assert [cfg.window_of(i) for i in range(8)] == [4096, 4096, 4096, None] * 2
    assert [cfg.uses_rope(i) for i in range(8)] == [True, True, True, False] * 2


def test_llama_cpp_exaone4_gguf_answers_as_transformers(pair, tmp_path):
    """llama.cpp's Exaone4Model: OLMo 2's tensor names (per-head q / k norms here), not permuted; the windowed layers
    by attention.sliding_window and its pattern (only they rotated); without a window every layer global."""
    window, ref, _ = pair
    c = ref.config
    w, sd = start_file(tmp_path / "m.gguf", "exaone4", ref)
    if window:
        w.add_sliding_window(window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    for i in range(c.num_hidden_layers):
        for g, h in OLMO2_BLOCK.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"model.layers.{i}.{h}.weight"])
    finish(w)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert lm.config.architecture == "Exaone4ForCausalLM"
    assert [lm.config.uses_rope(i) for i in range(4)] == ([True, True, True, False] if window else [True] * 4)
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
