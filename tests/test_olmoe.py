"""OLMoE (models/qwen_moe.py's OlmoeForCausalLM) against transformers on tiny random configs (float32): Qwen3-MoE's
pre-norm layers and names with OLMo 2's whole-projection q / k norms, the top-k softmax weights renormalised or not as
`norm_topk_prob` says; speculation against plain greedy and the cache-free forward; clip_qkv refused by name."""

from __future__ import annotations

import pytest
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.config import ModelConfig
from eaglespec.errors import ConfigError
from eaglespec.models import get_model_class
from eaglespec.models.olmo2 import Olmo2Attention

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, num_experts=8, num_experts_per_tok=3, max_position_embeddings=256,
              rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_a_transformers_folder_answers_as_transformers_and_speculates(tmp_path, norm_topk_prob):
    ref, lm = transformers_pair("Olmoe", tmp_path, **CONFIG, norm_topk_prob=norm_topk_prob)
    cfg = lm.config
    assert cfg.moe.norm_topk_prob == norm_topk_prob and cfg.moe.n_routed_experts == 8
    assert isinstance(lm.model.model.layers[0].self_attn, Olmo2Attention)
    assert_matches_transformers(ref, lm.model)
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_clip_qkv_is_refused():
    cfg = ModelConfig.from_hf(dict(CONFIG, architectures=["OlmoeForCausalLM"], model_type="olmoe", clip_qkv=8.0))
    with pytest.raises(ConfigError, match=r"OlmoeForCausalLM with clip_qkv 8.0 \(q / k / v clamped\) is not"):
        get_model_class(cfg.architecture)(cfg)
