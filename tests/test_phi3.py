"""Phi-3 / Phi-4 (models/phi3.py) against transformers' Phi3ForCausalLM on tiny random configs (float32): folders
saved by transformers (fused qkv_proj / gate_up_proj) through our loader, with default RoPE (Phi-4's), LongRoPE
(the 128K variants': short factors up to the original positions, which cap the context) and LongRoPE over 3/4 of each
head (Phi-4-mini's partial RoPE), speculation against plain greedy, llama.cpp's phi3 GGUFs, and what is refused."""

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
from tiny import assert_family_speculates, plain_logits

from eaglespec.config import EngineConfig
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
PARTIAL_PAIRS = 6  # Phi-4-mini's partial_rotary_factor 0.75: 12 of head_dim 16 rotated, 6 frequencies
CASES = {
    "default": dict(max_position_embeddings=256, rope_parameters=dict(rope_type="default", rope_theta=250000.0)),
    "longrope": dict(max_position_embeddings=256, original_max_position_embeddings=64, rope_parameters=LONGROPE),
    "partial longrope": dict(max_position_embeddings=256, original_max_position_embeddings=64, rope_parameters=dict(
        LONGROPE, partial_rotary_factor=0.75, short_factor=LONGROPE["short_factor"][:PARTIAL_PAIRS],
        long_factor=LONGROPE["long_factor"][:PARTIAL_PAIRS])),
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
    ref = hf_model(request.param, seed=5 if request.param == "partial longrope" else 0)  # answers that do not loop
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
    if case != "default":
        rope = lm.config.rope
        assert rope.type == "longrope" and rope.factor == 4.0 and rope.original_max_position_embeddings == 64
        assert lm.config.context_limit == 64
    assert lm.config.rotary_dim == (12 if case == "partial longrope" else 16)


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
    assert_family_speculates(lm.model, hidden=64)


def test_partial_rotary_leaves_the_tail_of_each_head_unrotated(loaded):
    """With partial RoPE, q and k dims past the rotated ones keep their projections at every position: the model's
    logits differ from a full-RoPE reading of the same weights (the factor is not ignored)."""
    case, ref, lm = loaded
    if case != "partial longrope":
        return
    ids = torch.randint(1, 101, (1, 40), generator=torch.Generator().manual_seed(3))
    full = copy.deepcopy(ref.config)
    full.rope_parameters = dict(full.rope_parameters, partial_rotary_factor=1.0,
                                short_factor=LONGROPE["short_factor"], long_factor=LONGROPE["long_factor"])
    other = transformers.Phi3ForCausalLM(full).eval()
    other.load_state_dict(ref.state_dict())
    with torch.no_grad():
        assert (other(ids).logits - plain_logits(lm.model, ids)).abs().max() > 0.05


def test_rotary_dims_must_be_even(tmp_path):
    hf_model("default", partial_rotary_factor=0.7).save_pretrained(tmp_path)  # 11.2 -> 11 dims of 16
    with pytest.raises(ConfigError, match="partial_rotary_factor 0.7 of head_dim 16 gives 11 rotated dims: RoPE "
                                          "needs an even number between 2 and head_dim"):
        load_model(tmp_path)


def write_phi3_gguf(path: Path, ref: transformers.Phi3ForCausalLM) -> None:
    """`ref` as llama.cpp's Phi3MiniModel writes it: `attn_qkv` and `ffn_up` (gate then up) fused, LongRoPE as
    rope_factors_short / _long tensors and its attention factor, the sliding window (0: none)."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "phi3")
    add_common(w, c, sd)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_rope_dimension_count(int(c.hidden_size // c.num_attention_heads * c.rope_parameters.get(
        "partial_rotary_factor", 1.0)))  # the rotated dims, as llama.cpp's converter writes them
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
    assert lm.config.context_limit == (256 if case == "default" else 64)
    assert lm.config.rotary_dim == (12 if case == "partial longrope" else 16)
    ids = torch.randint(1, 101, (2, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
    got = plain_logits(lm.model, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
