"""OLMo 2 and 3 (models/olmo2.py) against transformers on tiny random configs (float32): post-norm layers, RMSNorms
over the whole q and k projections, OLMo 3's sliding windows on three layers of four; folders saved by transformers
through our loader; speculation against plain greedy and the cache-free forward; the fused-projection path."""

from __future__ import annotations

import copy

import pytest
from tiny import FAMILY_PROMPTS, assert_family_speculates, assert_matches_transformers, transformers_pair

from eaglespec.config import EngineConfig
from eaglespec.engine import transforms
from eaglespec.engine.engine import Engine
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
