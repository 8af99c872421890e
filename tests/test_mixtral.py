"""Mixtral (models/mixtral.py) against transformers' MixtralForCausalLM on a tiny random config (float32): a folder
saved by transformers (its block_sparse_moe / w1 w2 w3 names) through our loader, llama.cpp's Mixtral GGUFs (stacked
and per-expert), speculation against plain greedy; and Mistral's sliding window, which no longer caps the context."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf_write import add_common, checkpoint_names, finish, llama_cpp_permute
from tiny import assert_family_speculates, per_expert, plain_logits, randomize_moe

from eaglespec.config import EngineConfig, ModelConfig, MoEConfig
from eaglespec.engine.engine import Engine
from eaglespec.loading import GGUFFile, load_model
from eaglespec.models import get_model_class
from eaglespec.sampling_params import SamplingParams

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=6, num_experts_per_tok=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False)
IDS = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))


def hf_model(seed: int = 0, **kw) -> transformers.MixtralForCausalLM:
    hc = transformers.MixtralConfig(**{**CONFIG, **kw})
    hc.architectures = ["MixtralForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.MixtralForCausalLM(hc).eval()
    randomize_moe(ref, seed)
    return ref


def test_a_transformers_folder_loads_and_answers_as_transformers(tmp_path):
    from safetensors import safe_open

    ref = hf_model(seed=3)
    ref.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"model.layers.0.block_sparse_moe.experts.5.w3.weight",
            "model.layers.2.block_sparse_moe.gate.weight"} <= names
    lm = load_model(tmp_path, dtype=torch.float32)
    assert type(lm.model).__name__ == "MixtralForCausalLM"
    assert lm.config.moe == MoEConfig(n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=0,
                                      moe_intermediate_size=96, norm_topk_prob=True, scoring_func="softmax",
                                      topk_method="greedy")
    assert lm.config.sliding_window is None and lm.config.context_limit == 256
    with torch.no_grad():
        want = ref(IDS).logits
    torch.testing.assert_close(plain_logits(lm.model, IDS), want, rtol=1e-4, atol=1e-4)


def write_mixtral_gguf(path: Path, ref: transformers.MixtralForCausalLM, stacked: bool = True) -> None:
    """`ref` as llama.cpp writes Mixtral: a `llama` GGUF with expert_count, q/k permuted, the experts stacked per
    projection (`ffn_*_exps`) or, as before 2024-04, one tensor per expert (`ffn_gate.E`)."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in per_expert(ref.state_dict()).items()}
    w = gguf.GGUFWriter(str(path), "llama")
    add_common(w, c, sd)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[pre + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", llama_cpp_permute(sd[pre + "self_attn.q_proj.weight"],
                                                                 c.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", llama_cpp_permute(sd[pre + "self_attn.k_proj.weight"],
                                                                 c.num_key_value_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[pre + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[pre + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[pre + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", sd[pre + "mlp.gate.weight"])
        for proj in ("gate", "up", "down"):
            per = [sd[f"{pre}mlp.experts.{e}.{proj}_proj.weight"] for e in range(c.num_local_experts)]
            if stacked:
                w.add_tensor(f"blk.{i}.ffn_{proj}_exps.weight", np.stack(per))
            else:
                for e, t in enumerate(per):
                    w.add_tensor(f"blk.{i}.ffn_{proj}.{e}.weight", t)
    finish(w)


@pytest.mark.parametrize("stacked", [True, False], ids=["ffn_exps", "per_expert"])
def test_llama_cpp_mixtral_gguf_answers_as_transformers(tmp_path, stacked):
    ref = hf_model(seed=4)
    write_mixtral_gguf(tmp_path / "m.gguf", ref, stacked)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert lm.config.architecture == "MixtralForCausalLM" and lm.config.moe.n_routed_experts == 6
    names = {n for n, _ in GGUFFile(tmp_path / "m.gguf").hf_tensors()}  # Mixtral's own: `eaglespec convert` writes
    assert names == checkpoint_names(ref, tmp_path / "hf")                  # a folder transformers loads
    with torch.no_grad():
        want = ref(IDS).logits
    torch.testing.assert_close(plain_logits(lm.model, IDS), want, rtol=1e-4, atol=1e-4)


def test_greedy_speculation_equals_plain():
    ref = hf_model(seed=1)
    cfg = ModelConfig.from_hf(ref.config.to_dict())
    ours = get_model_class(cfg.architecture)(cfg).eval()
    ours.load_state_dict(per_expert(ref.state_dict()), strict=True)
    assert_family_speculates(ours, hidden=64, new_tokens=24, distinct=8)


def mistral(**kw) -> ModelConfig:
    return ModelConfig.from_hf(dict(architectures=["MistralForCausalLM"], model_type="mistral", vocab_size=97,
                                    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=64, **kw))


def test_a_sliding_window_no_longer_caps_the_context():
    """Mistral-7B-v0.1's window (every layer) is attended as it is (tests/test_sliding_window.py): the engine runs the
    model to its max_position_embeddings, past the window."""
    cfg = mistral(sliding_window=16)
    assert cfg.sliding_window == 16 and cfg.context_limit == 64 and cfg.context_limit_reason == ""
    model = get_model_class(cfg.architecture)(cfg).eval()
    assert [layer.self_attn.window for layer in model.model.layers] == [16, 16]
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    engine = Engine(model, None, EngineConfig(max_batch_size=1))
    assert engine.context_len == 64
    out = engine.generate([list(range(1, 21))], SamplingParams(max_new_tokens=30, ignore_eos=True))[0]
    assert len(out.token_ids) == 30  # 50 positions: past the window
