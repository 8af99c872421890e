"""Phi-3 / Phi-4 (models/phi3.py) against transformers' Phi3ForCausalLM on tiny random configs (float32): folders
saved by transformers (fused qkv_proj / gate_up_proj) through our loader, with default RoPE (Phi-4's) and LongRoPE
(the 128K variants': short factors up to the original positions, which cap the context), speculation against plain
greedy, and what is refused."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf_write import add_common, checkpoint_names, finish
from tiny import assert_speculation_equals_plain, plain_logits, tiny_drafter

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import ConfigError, RequestError
from eaglespec.loading import GGUFFile, load_model
from eaglespec.sampling_params import SamplingParams

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=0)
HEAD_PAIRS = 8  # head_dim 16: 8 rotation frequencies
g = torch.Generator().manual_seed(5)
LONGROPE = dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=64,
                short_factor=(1 + 2 * torch.rand(HEAD_PAIRS, generator=g)).tolist(),
                long_factor=(4 + 8 * torch.rand(HEAD_PAIRS, generator=g)).tolist())
CASES = {
    "default": dict(max_position_embeddings=256, rope_parameters=dict(rope_type="default", rope_theta=250000.0)),
    "longrope": dict(max_position_embeddings=256, original_max_position_embeddings=64, rope_parameters=LONGROPE),
}


def hf_model(case: str, seed: int = 0, **rope) -> transformers.Phi3ForCausalLM:
    """transformers' model for a case (a deep copy of it: transformers keeps the rope dict it is given), `rope`
    added to its rope parameters."""
    kw = copy.deepcopy(CASES[case])
    kw["rope_parameters"].update(rope)
    hc = transformers.Phi3Config(**CONFIG, **kw)
    hc.architectures = ["Phi3ForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Phi3ForCausalLM(hc).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # O(1) logits (transformers' init is too small to tell layouts apart)
        for _, t in ref.named_parameters():
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=gen) if t.dim() == 1
                    else torch.randn(t.shape, generator=gen) / math.sqrt(t.shape[-1]))
    return ref


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request, tmp_path_factory):
    ref = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return request.param, ref, load_model(folder, dtype=torch.float32)


def test_a_transformers_folder_answers_as_transformers(loaded):
    from safetensors import safe_open

    case, ref, lm = loaded
    with safe_open(str(lm.path / "model.safetensors"), "pt") as f:
        assert {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"} <= set(f.keys())
    ids = torch.randint(1, 101, (2, 60), generator=torch.Generator().manual_seed(1))  # within LongRoPE's 64
    with torch.no_grad():
        want = ref(ids).logits
    got = plain_logits(lm.model, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if case == "longrope":
        rope = lm.config.rope
        assert rope.type == "longrope" and rope.factor == 4.0 and rope.original_max_position_embeddings == 64
        assert lm.config.context_limit == 64


def test_longrope_caps_the_context_at_its_original_positions(loaded):
    case, _, lm = loaded
    engine = Engine(lm.model, None, EngineConfig(max_batch_size=1))
    if case == "default":
        assert engine.context_len == 256 and engine.context_note == ""
        return
    assert engine.context_len == 64
    with pytest.raises(RequestError, match="the prompt has 70 tokens but the model's context is 64 tokens "
                                           "\\(LongRoPE's original positions: its long factors"):
        engine.generate([list(range(1, 71))], SamplingParams(max_new_tokens=4))


def test_greedy_speculation_equals_plain(loaded):
    _, _, lm = loaded
    drafter = tiny_drafter(lm.model, seed=2, hidden=64)
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 2], list(range(20, 45))]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    plain = assert_speculation_equals_plain(lm.model, drafter, prompts, params,
                                            (SpecConfig(3, 1, 4), SpecConfig(4, 3, 8)))
    assert all(len(set(p)) > 4 for p in plain)


def test_partial_rotary_is_refused(tmp_path):
    hf_model("default", partial_rotary_factor=0.75).save_pretrained(tmp_path)  # Phi-4-mini's
    with pytest.raises(ConfigError, match="Phi3ForCausalLM with partial_rotary_factor 0.75: RoPE over part of each "
                                          "head is not implemented"):
        load_model(tmp_path)


def write_phi3_gguf(path: Path, ref: transformers.Phi3ForCausalLM) -> None:
    """`ref` as llama.cpp's Phi3MiniModel writes it: `attn_qkv` and `ffn_up` (gate then up) fused, LongRoPE as
    rope_factors_short / _long tensors and its attention factor, the sliding window (0: none)."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "phi3")
    add_common(w, c, sd)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_sliding_window(c.sliding_window or 0)
    rope = c.rope_parameters
    if rope["rope_type"] == "longrope":
        orig = rope["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        scale = c.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for g, h in (("attn_norm", "input_layernorm"), ("attn_qkv", "self_attn.qkv_proj"),
                     ("attn_output", "self_attn.o_proj"), ("ffn_norm", "post_attention_layernorm"),
                     ("ffn_up", "mlp.gate_up_proj"), ("ffn_down", "mlp.down_proj")):
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{h}.weight"])
    finish(w)


@pytest.mark.parametrize("case", list(CASES))
def test_llama_cpp_phi3_gguf_answers_as_transformers(tmp_path, case):
    ref = hf_model(case, seed=6)
    write_phi3_gguf(tmp_path / "m.gguf", ref)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert {n for n, _ in GGUFFile(tmp_path / "m.gguf").hf_tensors()} == checkpoint_names(ref, tmp_path / "hf")
    assert lm.config.architecture == "Phi3ForCausalLM" and lm.config.sliding_window is None
    assert lm.config.context_limit == (64 if case == "longrope" else 256)
    ids = torch.randint(1, 101, (2, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
    got = plain_logits(lm.model, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
