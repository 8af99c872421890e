"""OLMo 2 and 3 (models/olmo2.py) against transformers on tiny random configs (float32): post-norm layers, RMSNorms
over the whole q and k projections, OLMo 3's sliding windows on three layers of four; folders saved by transformers
through our loader; speculation against plain greedy and the cache-free forward; the fused-projection path."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers
from tiny import FAMILY_PROMPTS, assert_family_speculates, greedy_by_recompute, plain_logits

from eaglespec.config import EngineConfig
from eaglespec.engine import transforms
from eaglespec.engine.engine import Engine
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
    hc = getattr(transformers, f"{prefix}Config")(**CONFIG, **CASES[request.param])
    hc.architectures = [f"{prefix}ForCausalLM"]
    hc._attn_implementation = "eager"
    ref = getattr(transformers, f"{prefix}ForCausalLM")(hc).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in ref.named_parameters():
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g) if t.dim() == 1
                    else 2.0 * torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return request.param, ref, load_model(folder, dtype=torch.float32)


def test_a_transformers_folder_answers_as_transformers(pair):
    case, ref, lm = pair
    assert [lm.config.window_of(i) for i in range(4)] == ([8, 8, 8, None] if case == "olmo3" else [None] * 4)
    assert lm.model.model.layers[0].self_attn.q_norm.weight.shape == (64,)  # the whole projection's width
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(plain_logits(lm.model, ids), want, rtol=1e-4, atol=1e-4)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, _, lm = pair
    plain = assert_family_speculates(lm.model, hidden=64)
    assert plain == [greedy_by_recompute(lm.model, p, 16) for p in FAMILY_PROMPTS]


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
