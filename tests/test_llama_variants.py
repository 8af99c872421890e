"""Llama-layout families served by models/llama.py against transformers on tiny random configs (float32): Seed-OSS
(`SeedOssForCausalLM`: q/k/v biases, o_proj's as `attention_out_bias` says) and ERNIE 4.5 dense
(`Ernie4_5ForCausalLM`: `use_bias`, RoPE on adjacent pairs permuted to halves at load, the head tied); speculation
against plain greedy and the cache-free forward."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from tiny import FAMILY_PROMPTS, assert_family_speculates, greedy_by_recompute, plain_logits

from eaglespec.loading import load_model

COMMON = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, pad_token_id=0,
              rope_parameters=dict(rope_type="default", rope_theta=1e4))
CASES = {
    "seed_oss": ("SeedOss", dict(attention_bias=True, attention_out_bias=False, tie_word_embeddings=False)),
    "seed_oss o-bias": ("SeedOss", dict(attention_bias=True, attention_out_bias=True, tie_word_embeddings=False)),
    "ernie4_5": ("Ernie4_5", dict(use_bias=True)),  # tied, as released
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    prefix, kw = CASES[request.param]
    hc = getattr(transformers, f"{prefix}Config")(**COMMON, **kw)
    hc.architectures = [f"{prefix}ForCausalLM"]
    hc._attn_implementation = "eager"
    ref = getattr(transformers, f"{prefix}ForCausalLM")(hc).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in ref.named_parameters():
            t.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.2 * torch.randn(t.shape, generator=g)
                    if t.dim() == 1 else 2.0 * torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))
    folder = tmp_path_factory.mktemp(request.param.replace(" ", "_"))
    ref.save_pretrained(folder)
    return request.param, ref, load_model(folder, dtype=torch.float32)


def test_a_transformers_folder_answers_as_transformers(pair):
    case, ref, lm = pair
    attn = lm.model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and (attn.o_proj.bias is not None) == (case != "seed_oss")
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(plain_logits(lm.model, ids), want, rtol=1e-4, atol=1e-4)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, _, lm = pair
    plain = assert_family_speculates(lm.model, hidden=64)
    assert plain == [greedy_by_recompute(lm.model, p, 16) for p in FAMILY_PROMPTS]
