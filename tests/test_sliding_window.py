"""Sliding-window attention (`ModelConfig.layer_windows`, `ForwardContext.mask(window)`): past the window, the logits of
Mistral (every layer windowed), Qwen3 (the layers from max_window_layers on), Qwen2-MoE (its even layers) and Phi-3
equal transformers'; the engine's cached steps (prefill, decode, a chain's and a tree's verify, the fused RoPE +
KV-store and short-query attention kernels under Triton's interpreter) decode what the cache-free forward does; which
layers a config windows."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tiny import (assert_speculation_equals_plain, greedy_by_recompute, plain_logits, randomize_moe,  # noqa: E402
                  tiny_drafter)

from eaglespec.config import EngineConfig, ModelConfig, SpecConfig  # noqa: E402
from eaglespec.engine import transforms  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.errors import ConfigError  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

COMMON = dict(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False)
WINDOW = 8
# name -> (transformers class prefix, config fields, which of the 4 layers are windowed)
CASES = {
    "mistral": ("Mistral", dict(sliding_window=WINDOW, head_dim=16), [True] * 4),  # 16: the short-query kernel's
    "qwen3": ("Qwen3", dict(head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2),
              [False, False, True, True]),
    "qwen2_moe": ("Qwen2Moe", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=3,
                                   moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=6,
                                   num_experts_per_tok=2), [True, False, True, False]),
    "phi3": ("Phi3", dict(sliding_window=WINDOW, pad_token_id=0), [True] * 4),
}


def hf_model(case: str):
    prefix, kw, _ = CASES[case]
    hc = getattr(transformers, f"{prefix}Config")(**COMMON, **kw)
    hc.architectures = [f"{prefix}ForCausalLM"]
    hc._attn_implementation = "eager"
    ref = getattr(transformers, f"{prefix}ForCausalLM")(hc).eval()
    randomize_moe(ref, 0)  # O(1) logits, attention that depends on the positions
    return ref


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    from eaglespec.loading import load_model

    ref = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return request.param, ref, load_model(folder, dtype=torch.float32).model


def test_logits_past_the_window_are_transformers(pair):
    case, ref, ours = pair
    assert [ours.config.window_of(i) == WINDOW for i in range(4)] == CASES[case][2]
    assert ours.config.context_limit == 256  # no cap: the window is attended as it is
    ids = torch.randint(1, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
        torch.testing.assert_close(plain_logits(ours, ids), want, rtol=1e-4, atol=1e-4)
        for layer in ours.model.layers:  # the same weights under full attention: other logits past the window
            layer.self_attn.window = None
        full = plain_logits(ours, ids)
        for i, layer in enumerate(ours.model.layers):
            layer.self_attn.window = ours.config.window_of(i)
    assert (full[:, :WINDOW] - want[:, :WINDOW]).abs().max() < 1e-4  # within the window, the same
    assert (full[:, WINDOW + 4 :] - want[:, WINDOW + 4 :]).abs().max() > 0.05


PROMPTS = [[5, 6, 7], [40, 41, 2, 9, 33, 12, 70, 71, 72, 8, 1, 3], list(range(20, 45))]


def test_cached_decoding_and_speculation_past_the_window(pair):
    _, _, ours = pair
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = assert_speculation_equals_plain(ours, tiny_drafter(ours, seed=2, hidden=48), PROMPTS, params,
                                            (SpecConfig(3, 1, 4), SpecConfig(4, 3, 8)))
    assert plain == [greedy_by_recompute(ours, p, 20) for p in PROMPTS]
    assert all(len(set(p)) > 4 for p in plain), plain


def test_the_fused_kernels_apply_the_window(pair):
    """The GPU path's RoPE + KV-store and short-query attention kernels (run by Triton's interpreter) read the
    windowed mask: plain decoding and a chain's speculation still give the cache-free reference's tokens."""
    case, _, ours = pair
    if case != "mistral":
        return
    import copy

    fused = copy.deepcopy(ours)
    drafter = tiny_drafter(fused, seed=2, hidden=48)
    transforms.use_short_attention_kernel(transforms.use_rope_store_kernel(transforms.fuse_projections(fused)))
    attn = fused.model.layers[0].self_attn
    assert attn.attn_kernel is not None and attn.attn_kernel.fits(2, 1, 4, 2, 16, torch.float32)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = [greedy_by_recompute(ours, p, 12) for p in PROMPTS[1:]]
    cfg = EngineConfig(max_batch_size=2)
    assert [o.token_ids for o in Engine(fused, None, cfg).generate(PROMPTS[1:], params)] == want
    eng = Engine(fused, None, cfg, drafter=drafter, spec=SpecConfig(3, 1, 4))
    assert [o.token_ids for o in eng.generate(PROMPTS[1:], params)] == want


def config(**kw) -> ModelConfig:
    return ModelConfig.from_hf(dict(COMMON, architectures=["Qwen2ForCausalLM"], **kw))


@pytest.mark.parametrize("kw, windows", [
    (dict(model_type="qwen2", sliding_window=16, use_sliding_window=False), [None] * 4),  # Qwen2.5's: unused
    (dict(model_type="qwen2", sliding_window=16, use_sliding_window=True), [None] * 4),  # max_window_layers 28
    (dict(model_type="qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=1), [None] + [16] * 3),
    (dict(model_type="qwen2_moe", sliding_window=16, use_sliding_window=True, max_window_layers=3),
     [16, None, 16, None]),
    (dict(model_type="mistral", sliding_window=16), [16] * 4),
    (dict(model_type="mistral", sliding_window=None), [None] * 4),
    (dict(model_type="qwen2", sliding_window=16, layer_types=["full_attention", "sliding_attention"] * 2),
     [None, 16, None, 16]),  # transformers 5 writes layer_types: they decide
])
def test_which_layers_are_windowed(kw, windows):
    cfg = config(**kw)
    assert [cfg.window_of(i) for i in range(4)] == windows and cfg.context_limit == 256


def test_bad_layer_types_are_refused():
    with pytest.raises(ConfigError, match="layer_types must name 'sliding_attention' or 'full_attention' for each "
                                          "of the 4 layers"):
        config(model_type="mistral", sliding_window=16, layer_types=["sliding_attention"] * 3)
    with pytest.raises(ConfigError, match="layer_types must name"):
        config(model_type="mistral", sliding_window=16, layer_types=["chunked_attention"] * 4)
