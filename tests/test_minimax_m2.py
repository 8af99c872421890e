"""MiniMax-M2 (models/minimax_m2.py) against transformers on a tiny random config (float32): OLMo 2's whole-projection
q / k norms, RoPE over half of each head (the released `rotary_dim`), DeepSeek-V3's sigmoid router with its
correction bias over Mixtral-named experts; speculation against plain greedy and the cache-free forward; the released
config's reading."""

from __future__ import annotations

import torch
from tiny import assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.config import ModelConfig
from eaglespec.layers.moe import MoE, NoAuxRouter
from eaglespec.loading import load_model

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, rotary_dim=8, num_local_experts=8, num_experts_per_tok=2,
              max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)


def test_a_transformers_folder_answers_as_transformers_and_speculates(tmp_path):
    ref, _ = transformers_pair("MiniMaxM2", tmp_path, **CONFIG)
    with torch.no_grad():  # a correction bias that changes choices (transformers' init leaves it 0), saved again
        for layer in ref.model.layers:
            layer.mlp.e_score_correction_bias.copy_(0.5 * torch.randn(8, generator=torch.Generator().manual_seed(3)))
    ref.save_pretrained(tmp_path)
    lm = load_model(tmp_path, dtype=torch.float32)
    cfg, layer = lm.config, lm.model.model.layers[0]
    assert cfg.rotary_dim == 8 and isinstance(layer.mlp, MoE) and isinstance(layer.mlp.gate, NoAuxRouter)
    assert torch.equal(layer.mlp.gate.e_score_correction_bias, ref.model.layers[0].mlp.e_score_correction_bias)
    assert layer.self_attn.q_norm.weight.shape == (64,)
    assert_matches_transformers(ref, lm.model)
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_the_released_config():
    """MiniMaxAI/MiniMax-M2's config.json fields: 62 layers of 256 experts, 8 a token, heads of 128 dims rotating 64."""
    d = dict(architectures=["MiniMaxM2ForCausalLM"], model_type="minimax_m2", hidden_size=3072, intermediate_size=1536,
             num_hidden_layers=62, num_attention_heads=48, num_key_value_heads=8, head_dim=128, rotary_dim=64,
             num_local_experts=256, num_experts_per_tok=8, scoring_func="sigmoid", use_routing_bias=True,
             vocab_size=200064, rope_theta=5000000, max_position_embeddings=196608, rms_norm_eps=1e-6)
    cfg = ModelConfig.from_hf(d)
    assert cfg.rotary_dim == 64 and cfg.rope.theta == 5e6
    moe = cfg.moe
    assert (moe.n_routed_experts, moe.num_experts_per_tok, moe.scoring_func, moe.topk_method, moe.n_group) == (
        256, 8, "sigmoid", "noaux_tc", 1)
    assert moe.norm_topk_prob and moe.n_shared_experts == 0 and all(moe.is_sparse(i) for i in range(62))
