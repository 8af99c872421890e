"""Qwen2 and Qwen3 (models/qwen.py) against transformers on tiny random configs (float32): logits and aux states, a
checkpoint folder written by transformers loaded through our loader, the cached path through the engine (greedy
speculative output equals plain, fused and folded projections included), and what is refused."""

from __future__ import annotations

import pytest
import torch
import transformers
from tiny import assert_speculation_equals_plain, plain_logits, tiny_drafter

from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine import transforms
from eaglespec.engine.engine import Engine
from eaglespec.layers.attention import QKNormAttention
from eaglespec.layers.context import ForwardContext
from eaglespec.loading import load_model
from eaglespec.models import get_model_class
from eaglespec.sampling_params import SamplingParams

COMMON = dict(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=5, max_position_embeddings=256,
              rms_norm_eps=1e-5, num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
CASES = {
    "qwen2": ("Qwen2", dict(tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3": ("Qwen3", dict(head_dim=16, tie_word_embeddings=False, rope_theta=1e6)),
    "qwen3-tied-mqa": ("Qwen3", dict(head_dim=12, num_key_value_heads=1, tie_word_embeddings=True)),
}


def hf_model(case: str):
    family, kw = CASES[case]
    hc = getattr(transformers, f"{family}Config")(**{**COMMON, **kw})
    hc.architectures = [f"{family}ForCausalLM"]
    torch.manual_seed(0)
    ref = getattr(transformers, f"{family}ForCausalLM")(hc).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that a mix-up shows
        for n, p in ref.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif n.endswith("bias"):
                p.normal_(0, 0.5)
    return ref


def ours_of(ref):
    ours = get_model_class(ref.config.architectures[0])(ModelConfig.from_hf(ref.config.to_dict())).eval()
    missing, unexpected = ours.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if ref.config.tie_word_embeddings:
        ours.lm_head.weight = ours.model.embed_tokens.weight
    return ours


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_aux_match_transformers(case):
    ref = hf_model(case)
    ours = ours_of(ref)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    layers = [0, 2, 3]
    ours.set_eagle3_layers_to_capture(layers)
    with torch.no_grad():
        r = ref(ids, output_hidden_states=True)
        o = ours(ids, ForwardContext.plain(2, 40))
    assert (o.logits - r.logits).abs().max().item() <= 1e-4
    expected_aux = torch.cat([r.hidden_states[i + 1] for i in layers], dim=-1)
    assert (o.aux_hidden - expected_aux).abs().max().item() <= 1e-4
    attn = ours.model.layers[0].self_attn
    assert isinstance(attn, QKNormAttention) == (case != "qwen2")
    if case == "qwen2":  # biases on q/k/v, none on o_proj
        assert attn.q_proj.bias is not None and attn.v_proj.bias is not None and attn.o_proj.bias is None


@pytest.mark.parametrize("case", ["qwen2", "qwen3"])
def test_a_checkpoint_folder_loads_and_answers_as_transformers(case, tmp_path):
    """A folder saved by transformers (config.json + safetensors) through our loader: greedy decoding through the
    engine's cache equals transformers' `generate`."""
    ref = hf_model(case)
    ref.save_pretrained(tmp_path)
    lm = load_model(tmp_path, device="cpu", dtype=torch.float32)
    assert type(lm.model).__name__ == f"{CASES[case][0]}ForCausalLM"
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(prompt):].tolist()
    got = Engine(lm.model, None).generate([prompt], SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
    assert got.token_ids == want


@pytest.mark.parametrize("case", ["qwen2", "qwen3"])
def test_greedy_speculation_equals_plain_with_every_cpu_transform(case):
    """Through the engine with a tiny EAGLE-3 drafter: speculative greedy output equals plain (chain and tree); and
    plain output is the same with fused q/k/v and gate/up, then with the add + norm + projection kernel for steps of
    up to 4 tokens and the input norms folded into the projections for longer ones (Qwen3, bias-free: Triton's
    interpreter; `attend_heads` scales q/k/v before the per-head norms), and with the RoPE + KV-store kernel, which
    applies Qwen3's per-head norms (`head_norms`) after the folded scale."""
    ours = ours_of(hf_model(case))
    drafter = tiny_drafter(ours, seed=2, hidden=48)
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 2], list(range(20, 45))]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = assert_speculation_equals_plain(ours, drafter, prompts, params, (SpecConfig(3, 1, 4), SpecConfig(4, 3, 8)))
    assert all(len(set(p)) > 4 for p in plain)
    fused = ours_of(hf_model(case))
    transforms.fuse_projections(fused)
    assert [o.token_ids for o in Engine(fused, None, EngineConfig(max_batch_size=3)).generate(prompts, params)] == plain
    transforms.use_rope_store_kernel(fused)  # Qwen3's per-head norms included
    assert all(m.rope_store is not None for m in fused.modules() if isinstance(m, QKNormAttention))
    transforms.fold_norms(transforms.use_norm_linear_kernel(fused, max_rows=4))
    assert all(layer.folded_norms for layer in fused.model.layers) == (case == "qwen3")
    short = SamplingParams(max_new_tokens=5, ignore_eos=True)  # (the interpreted kernels are slow: a short run)
    got = Engine(fused, None, EngineConfig(max_batch_size=2)).generate(prompts[:2], short)  # prefill 12 tokens: folded
    assert [o.token_ids for o in got] == [p[:5] for p in plain[:2]]  # decode steps of 2 rows: the fused kernel


def test_a_sliding_window_agrees_past_the_window():
    """use_sliding_window (layers from max_window_layers on see the last 16 tokens): the logits are transformers'
    windowed model's past the window, and the context is not capped."""
    cfg = transformers.Qwen3Config(**COMMON, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg._attn_implementation = "eager"
    ours_cfg = ModelConfig.from_hf(cfg.to_dict())
    assert ours_cfg.sliding_window == 16 and ours_cfg.context_limit == 256
    ref = transformers.Qwen3ForCausalLM(cfg).eval()
    ours = get_model_class("Qwen3ForCausalLM")(ours_cfg).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids).logits
    torch.testing.assert_close(plain_logits(ours, ids), want, rtol=1e-4, atol=1e-4)
