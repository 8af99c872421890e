"""GLM-4.5 (models/glm4_moe.py's Glm4MoeForCausalLM) against transformers on tiny random configs (float32): folders
saved by transformers through our loader, with partial RoPE (half of each head rotated), q/k/v biases, DeepSeek-V3's
grouped sigmoid router with its correction bias, a shared expert and a dense first layer, with and without the q/k
head norms; the checkpoint's MTP layer ignored; speculation against plain greedy; llama.cpp's glm4moe GGUFs."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf_write import add_common, checkpoint_names, finish
from safetensors.torch import load_file, save_file
from tiny import assert_family_speculates, assert_matches_transformers, per_expert, plain_logits, randomize_moe

from eaglespec.config import ModelConfig
from eaglespec.errors import ConfigError
from eaglespec.layers.attention import QKNormAttention
from eaglespec.layers.moe import MoE
from eaglespec.loading import GGUFFile, load_model

CONFIG = dict(vocab_size=101, hidden_size=48, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_routed_experts=8, num_experts_per_tok=3,
              n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
              norm_topk_prob=True, attention_bias=True, max_position_embeddings=256, rms_norm_eps=1e-5,
              tie_word_embeddings=False, rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                               partial_rotary_factor=0.5))


def hf_model(seed: int = 0, **overrides) -> transformers.Glm4MoeForCausalLM:
    hc = transformers.Glm4MoeConfig(**{**CONFIG, **overrides})
    hc.architectures = ["Glm4MoeForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Glm4MoeForCausalLM(hc).eval()
    randomize_moe(ref, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # a correction bias that changes which experts are chosen (a buffer, so not randomized)
        for name, b in ref.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn(b.shape, generator=g))
    return ref


@pytest.fixture(scope="module", params=[False, True], ids=["glm-4.5", "qk-norm"])
def pair(request, tmp_path_factory):
    ref = hf_model(use_qk_norm=request.param)
    folder = tmp_path_factory.mktemp("glm4moe")
    ref.save_pretrained(folder)
    return ref, load_model(folder, dtype=torch.float32)


def test_a_transformers_folder_answers_as_transformers(pair):
    ref, lm = pair
    assert type(lm.model).__name__ == "Glm4MoeForCausalLM" and lm.config.rotary_dim == 8
    moe = lm.config.moe
    assert (moe.n_group, moe.topk_group, moe.n_shared_experts, moe.scoring_func, moe.topk_method) == (
        2, 1, 1, "sigmoid", "noaux_tc")
    assert [isinstance(layer.mlp, MoE) for layer in lm.model.model.layers] == [False, True, True]
    attn = lm.model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None
    assert isinstance(attn, QKNormAttention) == bool(ref.config.use_qk_norm)
    assert_matches_transformers(ref, lm.model, length=40, seed=2)


def test_the_correction_bias_and_the_partial_rope_matter(pair):
    """Reading the same weights without the correction bias, or with RoPE over whole heads, changes the logits."""
    ref, lm = pair
    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base = plain_logits(lm.model, ids)
        full = hf_model(use_qk_norm=ref.config.use_qk_norm, rope_parameters=dict(
            rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0))
        full.load_state_dict(ref.state_dict())
        assert (full(ids).logits - base).abs().max() > 0.05
        for layer in lm.model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.zero_()
        unbiased = plain_logits(lm.model, ids)
        biases = [b for n, b in ref.named_buffers() if n.endswith("correction_bias")]
        for b, layer in zip(biases, lm.model.model.layers[1:], strict=True):
            layer.mlp.gate.e_score_correction_bias.copy_(b)
    assert (unbiased - base).abs().max() > 0.05
    torch.testing.assert_close(plain_logits(lm.model, ids), base)


def test_greedy_speculation_equals_plain(pair):
    _, lm = pair
    assert_family_speculates(lm.model, hidden=48)


def test_the_mtp_layer_is_ignored_and_the_partial_factor_defaults_to_half(tmp_path):
    """A released checkpoint carries its MTP layer as `model.layers.{num_hidden_layers}.*` (eh_proj, enorm, ...),
    and a config.json may leave partial_rotary_factor out (transformers' default for GLM-4.5: 0.5)."""
    ref = hf_model(seed=1)
    ref.save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd.update({"model.layers.3.eh_proj.weight": torch.zeros(48, 96), "model.layers.3.enorm.weight": torch.ones(48),
               "model.layers.3.mlp.experts.0.up_proj.weight": torch.zeros(24, 48)})
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1
    for holder in (cfg, cfg.get("rope_parameters") or {}):
        holder.pop("partial_rotary_factor", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    lm = load_model(tmp_path, dtype=torch.float32)
    assert lm.config.rotary_dim == 8
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(plain_logits(lm.model, ids), ref(ids).logits, rtol=1e-4, atol=1e-4)


def test_a_config_without_experts_is_refused():
    d = dict(CONFIG, architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe", n_routed_experts=0)
    from eaglespec.models import get_model_class

    cfg = ModelConfig.from_hf(d)
    with pytest.raises(ConfigError, match="Glm4MoeForCausalLM needs n_routed_experts, num_experts_per_tok and "
                                          "moe_intermediate_size in its config"):
        get_model_class(cfg.architecture)(cfg)


BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "post_attention_norm": "post_attention_layernorm"}
DENSE = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
SPARSE = {"ffn_gate_inp": "mlp.gate", "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
          "ffn_up_shexp": "mlp.shared_experts.up_proj", "ffn_down_shexp": "mlp.shared_experts.down_proj"}


def write_glm4moe_gguf(path: Path, ref: transformers.Glm4MoeForCausalLM, correction_bias: bool = True) -> None:
    """`ref` as llama.cpp's Glm4MoeModel writes it: heads of key_length dims with rope.dimension_count rotated, the
    pre-FFN norm as `post_attention_norm`, experts stacked per projection, the correction bias `exp_probs_b.bias`,
    and one MTP block after the others (`nextn_predict_layers`, counted in block_count): a copy of the last layer's
    tensors with its own nextn.* ones."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in per_expert(ref.state_dict()).items()}
    w = gguf.GGUFWriter(str(path), "glm4moe")
    add_common(w, c, sd)
    w.add_block_count(c.num_hidden_layers + 1)  # replaces add_common's (the last write of a key wins)
    w.add_nextn_predict_layers(1)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_dimension_count(int(c.head_dim * c.rope_parameters["partial_rotary_factor"]))
    w.add_feed_forward_length(c.intermediate_size)
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_leading_dense_block_count(c.first_k_dense_replace)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    w.add_expert_weights_norm(c.norm_topk_prob)
    for i in range(c.num_hidden_layers + 1):
        src = f"model.layers.{min(i, c.num_hidden_layers - 1)}."  # the MTP block: the last layer's copy
        sparse = i >= c.first_k_dense_replace
        for g, h in {**BLOCK, **(SPARSE if sparse else DENSE)}.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{src}{h}.weight"])
        for g in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(f"blk.{i}.{g}.bias", sd[f"{src}{BLOCK[g]}.bias"])
        if sparse and correction_bias:
            w.add_tensor(f"blk.{i}.exp_probs_b.bias", sd[f"{src}mlp.gate.e_score_correction_bias"])
            for proj in ("gate", "up", "down"):
                w.add_tensor(f"blk.{i}.ffn_{proj}_exps.weight", np.stack(
                    [sd[f"{src}mlp.experts.{e}.{proj}_proj.weight"] for e in range(c.n_routed_experts)]))
    n = c.num_hidden_layers
    for t, shape in (("eh_proj", (c.hidden_size, 2 * c.hidden_size)), ("enorm", (c.hidden_size,)),
                     ("hnorm", (c.hidden_size,)), ("shared_head_norm", (c.hidden_size,))):
        w.add_tensor(f"blk.{n}.nextn.{t}.weight", np.ones(shape, np.float32))
    finish(w)


def test_llama_cpp_glm4moe_gguf_answers_as_transformers(tmp_path):
    ref = hf_model(seed=3, n_group=1, topk_group=1)  # llama.cpp's glm4moe has no expert groups (nor GLM-4.5)
    write_glm4moe_gguf(tmp_path / "m.gguf", ref)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    cfg = lm.config
    assert (cfg.architecture, cfg.num_hidden_layers, cfg.head_dim, cfg.rotary_dim) == ("Glm4MoeForCausalLM", 3, 16, 8)
    assert (cfg.moe.first_k_dense_replace, cfg.moe.n_shared_experts, cfg.moe.routed_scaling_factor) == (1, 1, 2.5)
    names = {n for n, _ in GGUFFile(tmp_path / "m.gguf").hf_tensors()}
    own = checkpoint_names(ref, tmp_path / "hf")
    assert own <= names and all(n.startswith("model.layers.3.") for n in names - own)  # the MTP block's extras
    assert_matches_transformers(ref, lm.model, length=30, seed=2)


def test_a_glm4moe_gguf_without_the_correction_bias_is_refused(tmp_path):
    ref = hf_model(seed=3, n_group=1, topk_group=1)
    write_glm4moe_gguf(tmp_path / "m.gguf", ref, correction_bias=False)
    with pytest.raises(ConfigError, match=r"a glm4moe file needs sigmoid expert gating \(glm4moe.expert_gating_func "
                                          r"2, got 2\) and the router's correction bias \(blk.1.exp_probs_b.bias\)"):
        load_model(tmp_path / "m.gguf")
