"""OLMoE (models/qwen_moe.py's OlmoeForCausalLM) against transformers on tiny random configs (float32): Qwen3-MoE's
pre-norm layers and names with OLMo 2's whole-projection q / k norms, the top-k softmax weights renormalised or not as
`norm_topk_prob` says; speculation against plain greedy and the cache-free forward; clip_qkv refused by name;
llama.cpp's olmoe GGUFs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_write import finish, start_file
from tiny import assert_family_speculates, assert_matches_transformers, per_expert, transformers_pair

from eaglespec.config import ModelConfig
from eaglespec.errors import ConfigError
from eaglespec.loading import load_model
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


# llama.cpp's olmoe tensors (OlmoeModel: no permutation, the experts stacked per projection) -> HF names
OLMOE_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
               "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate"}


def test_llama_cpp_olmoe_gguf_answers_as_transformers(tmp_path):
    """llama.cpp's OlmoeModel: Qwen3-MoE's layout with the whole-projection q / k norms, the experts of
    feed_forward_length stacked in ffn_{gate,up,down}_exps; no GGUF key for norm_topk_prob, so False, as llama.cpp's
    olmoe graph (and OLMoE's configs) have it; clamp_kqv (clip_qkv) refused."""
    ref, _ = transformers_pair("Olmoe", tmp_path / "hf", **CONFIG, norm_topk_prob=False)
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in per_expert(ref.state_dict()).items()}

    def write(path, extra=lambda w: None) -> None:
        w, _ = start_file(path, "olmoe", ref, sd=sd)
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        extra(w)
        for i in range(c.num_hidden_layers):
            pre = f"model.layers.{i}."
            for g, h in OLMOE_BLOCK.items():
                w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{h}.weight"])
            for proj in ("gate", "up", "down"):  # [E, rows, cols], expert 0 first
                w.add_tensor(f"blk.{i}.ffn_{proj}_exps.weight",
                             np.stack([sd[f"{pre}mlp.experts.{e}.{proj}_proj.weight"] for e in range(c.num_experts)]))
        finish(w)

    write(tmp_path / "m.gguf")
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    moe = lm.config.moe
    assert lm.config.architecture == "OlmoeForCausalLM" and not moe.norm_topk_prob
    assert (moe.n_routed_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (8, 3, 32)
    assert_matches_transformers(ref, lm.model, length=30, seed=2)
    write(tmp_path / "clip.gguf", lambda w: w.add_clamp_kqv(8.0))
    with pytest.raises(ConfigError, match=r"olmoe.attention.clamp_kqv \(the checkpoint's clip_qkv\) is not supported"):
        load_model(tmp_path / "clip.gguf", dtype=torch.float32)
