"""OLMo 2 and 3 (models/olmo2.py) against transformers on tiny random configs (float32): post-norm layers, RMSNorms
over the whole q and k projections, OLMo 3's sliding windows on three layers of four; folders saved by transformers
through our loader; speculation against plain greedy and the cache-free forward; the fused-projection path; llama.cpp's
olmo2 GGUFs (OLMo 2 and 3)."""

from __future__ import annotations

import copy

import gguf
import pytest
import torch
from gguf_write import finish, start_file
from tiny import FAMILY_PROMPTS, assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.config import EngineConfig
from eaglespec.engine import transforms
from eaglespec.engine.engine import Engine
from eaglespec.errors import ConfigError
from eaglespec.loading import load_model
from eaglespec.sampling_params import SamplingParams

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
              pad_token_id=0)
CASES = {"olmo2": dict(rope_parameters=dict(rope_type="default", rope_theta=5e5)),
         "olmo3": dict(sliding_window=8)}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    prefix = {"olmo2": "Olmo2", "olmo3": "Olmo3"}[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    return (request.param, *transformers_pair(prefix, folder, **CONFIG, **CASES[request.param]))


def test_a_transformers_folder_answers_as_transformers(pair):
    case, ref, lm = pair
    assert [lm.config.window_of(i) for i in range(4)] == ([8, 8, 8, None] if case == "olmo3" else [None] * 4)
    assert lm.model.model.layers[0].self_attn.q_norm.weight.shape == (64,)  # the whole projection's width
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_fused_projections_keep_the_norms(pair):
    """The CUDA path's fused q/k/v projection: the norms apply to its q and k slices; no RoPE + KV-store kernel."""
    case, _, lm = pair
    if case != "olmo2":
        return
    fused = copy.deepcopy(lm.model)
    transforms.use_short_attention_kernel(transforms.use_rope_store_kernel(transforms.fuse_projections(fused)))
    attn = fused.model.layers[0].self_attn
    assert hasattr(attn, "qkv_proj") and attn.rope_store is None
    params, cfg = SamplingParams(max_new_tokens=10, ignore_eos=True), EngineConfig(max_batch_size=2)
    want = [o.token_ids for o in Engine(lm.model, None, cfg).generate(FAMILY_PROMPTS[1:], params)]
    assert [o.token_ids for o in Engine(fused, None, cfg).generate(FAMILY_PROMPTS[1:], params)] == want


# llama.cpp's olmo2 tensors (Olmo2Model: no permutation) -> the HF names they hold
OLMO2_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
               "post_attention_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm"}


def write_olmo2_gguf(path, case: str, ref, extra=lambda w: None) -> None:
    """An olmo2 GGUF as llama.cpp's Olmo2Model writes it from `ref` (OLMo 3: its window and pattern too)."""
    c = ref.config
    w, sd = start_file(path, "olmo2", ref)
    if case == "olmo3":
        w.add_sliding_window(c.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    extra(w)
    for i in range(c.num_hidden_layers):
        for g, h in OLMO2_BLOCK.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"model.layers.{i}.{h}.weight"])
    finish(w)


def test_llama_cpp_olmo2_gguf_answers_as_transformers(pair, tmp_path):
    """llama.cpp's Olmo2Model (OLMo 2 and 3): q / k rows as HF's, the whole-projection q / k norms, the post-norms
    as post_attention_norm / post_ffw_norm; OLMo 3 by its attention.sliding_window, windowed by the pattern."""
    case, ref, _ = pair
    write_olmo2_gguf(tmp_path / "m.gguf", case, ref)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    assert lm.config.architecture == {"olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM"}[case]
    assert [lm.config.window_of(i) for i in range(4)] == ([8, 8, 8, None] if case == "olmo3" else [None] * 4)
    assert_matches_transformers(ref, lm.model, length=30, seed=2)


def test_olmo2_ggufs_we_cannot_run_are_refused(pair, tmp_path):
    """clip_qkv, and OLMo 3's YaRN (transformers scales its full-attention layers only): a sentence each."""
    case, ref, _ = pair
    write_olmo2_gguf(tmp_path / "clip.gguf", case, ref, lambda w: w.add_clamp_kqv(8.0))
    with pytest.raises(ConfigError, match=r"olmo2.attention.clamp_kqv \(the checkpoint's clip_qkv\) is not supported"):
        load_model(tmp_path / "clip.gguf", dtype=torch.float32)
    write_olmo2_gguf(tmp_path / "yarn.gguf", case, ref, lambda w: (w.add_rope_scaling_type(gguf.RopeScalingType.YARN),
                                                                    w.add_rope_scaling_factor(8.0)))
    if case == "olmo3":
        with pytest.raises(ConfigError, match="windows and RoPE scaling .* not supported; load the Hugging Face"):
            load_model(tmp_path / "yarn.gguf", dtype=torch.float32)
    else:  # OLMo 2 has no windows: a YaRN file runs as YaRN everywhere, as any other architecture's
        assert load_model(tmp_path / "yarn.gguf", dtype=torch.float32).config.rope.type == "yarn"
