"""Gemma 3 and 2 (models/gemma.py) against transformers on tiny random configs (float32): Gemma 3's text model
(Gemma3ForCausalLM) and its multimodal wrapper run for text (Gemma3ForConditionalGeneration, its vision weights
skipped) from folders transformers saved, past the sliding window, with the local layers' own RoPE base and the global
layers' linear scaling; Gemma 2 with its soft-capped attention scores and logits; speculation against plain
greedy; llama.cpp's gemma2 / gemma3 GGUFs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import pytest
import torch
import transformers
from gguf_write import finish
from tiny import FAMILY_PROMPTS, assert_family_speculates, greedy_by_recompute, plain_logits

from eaglespec.config import ModelConfig
from eaglespec.loading import load_model
from eaglespec.sampling_params import SamplingParams

TEXT = dict(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=8, sliding_window_pattern=2,
            max_position_embeddings=256, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2, eos_token_id=1,
            tie_word_embeddings=False,  # untied: a tied tiny model repeats its input token (test_released_config_fields
            #                             ties, as the releases do)
            rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=1e6),
                             "sliding_attention": dict(rope_type="default", rope_theta=1e4)})


def randomize(model: torch.nn.Module, seed: int) -> None:
    """O(1) logits; norm weights (offsets from 1) away from 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in model.named_parameters():
            t.copy_(0.2 * torch.randn(t.shape, generator=g) if t.dim() == 1
                    else 2.0 * torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))


def text_model(seed: int = 0, **kw) -> transformers.Gemma3ForCausalLM:
    hc = transformers.Gemma3TextConfig(**{**TEXT, **kw})
    hc.architectures = ["Gemma3ForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Gemma3ForCausalLM(hc).eval()
    randomize(ref, seed)
    return ref


def wrapper_model(seed: int = 0, tie: bool = False) -> transformers.Gemma3ForConditionalGeneration:
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    hc = transformers.Gemma3Config(text_config=TEXT, vision_config=vision, mm_tokens_per_image=4,
                                   image_token_index=100, boi_token_index=98, eoi_token_index=99,
                                   tie_word_embeddings=tie)  # the wrapper's field decides (text_config's is False)
    hc.architectures = ["Gemma3ForConditionalGeneration"]
    hc._attn_implementation = "eager"
    hc.text_config._attn_implementation = "eager"
    ref = transformers.Gemma3ForConditionalGeneration(hc).eval()
    randomize(ref, seed)
    return ref


@pytest.fixture(scope="module", params=["text", "wrapper"])
def pair(request, tmp_path_factory):
    ref = text_model() if request.param == "text" else wrapper_model()
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return request.param, ref, load_model(folder, dtype=torch.float32)


def logits_of(ref, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref(input_ids=ids).logits


def test_a_transformers_folder_answers_as_transformers(pair):
    case, ref, lm = pair
    cfg = lm.config
    assert [cfg.window_of(i) for i in range(4)] == [8, None, 8, None]  # every second layer global
    assert (cfg.rope.type, cfg.rope.factor, cfg.rope.theta, cfg.rope_local.theta) == ("linear", 4.0, 1e6, 1e4)
    ids = torch.randint(3, 101, (2, 40), generator=torch.Generator().manual_seed(2))  # 5x the window
    torch.testing.assert_close(plain_logits(lm.model, ids), logits_of(ref, ids), rtol=1e-4, atol=1e-4)


def test_greedy_speculation_equals_plain(pair):
    _, _, lm = pair
    assert_family_speculates(lm.model, hidden=48, prompts=[[2] + p for p in FAMILY_PROMPTS])  # after BOS


def test_released_config_fields(tmp_path):
    """The fields of the released configs (transformers 4's: rope_theta, rope_local_base_freq, rope_scaling for the
    global layers, sliding_window_pattern) read as transformers 5 reads them."""
    ref = text_model(seed=1, tie_word_embeddings=True)
    ref.save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        d.pop(key)
    d.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling=dict(rope_type="linear", factor=4.0),
             sliding_window_pattern=2)
    (tmp_path / "config.json").write_text(json.dumps(d))
    lm = load_model(tmp_path, dtype=torch.float32)
    assert [lm.config.window_of(i) for i in range(4)] == [8, None, 8, None]
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    ids = torch.randint(3, 101, (1, 30), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(plain_logits(lm.model, ids), logits_of(ref, ids), rtol=1e-4, atol=1e-4)


def test_a_tied_wrapper_ties_whatever_text_config_says(tmp_path):
    """The releases' wrapper: no lm_head in the checkpoint, the head tied to the embedding (the wrapper's own
    tie_word_embeddings, True, against text_config's False here)."""
    ref = wrapper_model(seed=5, tie=True)
    ref.save_pretrained(tmp_path)
    lm = load_model(tmp_path, dtype=torch.float32)
    inner = lm.model.language_model
    assert inner.lm_head.weight is inner.model.embed_tokens.weight
    ids = torch.randint(3, 101, (1, 30), generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(plain_logits(lm.model, ids), logits_of(ref, ids), rtol=1e-4, atol=1e-4)


GEMMA2 = dict(TEXT, query_pre_attn_scalar=20, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
              rope_parameters=dict(rope_type="default", rope_theta=1e4))


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    hc = transformers.Gemma2Config(**GEMMA2)  # its default layer_types: the even layers windowed
    hc.architectures = ["Gemma2ForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Gemma2ForCausalLM(hc).eval()
    randomize(ref, 7)
    folder = tmp_path_factory.mktemp("gemma2")
    ref.save_pretrained(folder)
    return ref, load_model(folder, dtype=torch.float32)


def test_gemma2_answers_as_transformers(gemma2):
    """Gemma 2: soft-capped attention scores (cap 5: most scores are capped here) and logits (cap 3), no head norms,
    its even layers windowed; greedy speculation equals plain greedy and the cache-free forward."""
    ref, lm = gemma2
    assert [lm.config.window_of(i) for i in range(4)] == [8, None, 8, None]
    attn = lm.model.model.layers[0].self_attn
    assert (attn.softcap, attn.scale, lm.model.final_logit_softcap) == (5.0, 20**-0.5, 3.0)
    ids = torch.randint(3, 101, (2, 40), generator=torch.Generator().manual_seed(8))
    got = plain_logits(lm.model, ids)
    torch.testing.assert_close(got, logits_of(ref, ids), rtol=1e-4, atol=1e-4)
    assert got.abs().max() < 3.0  # capped
    plain = assert_family_speculates(lm.model, hidden=48, prompts=[[2] + p for p in FAMILY_PROMPTS])
    assert plain == [greedy_by_recompute(lm.model, [2] + p, 16) for p in FAMILY_PROMPTS]


def test_the_released_gemma2_fields(tmp_path):
    """A config without layer_types (transformers 4's): Gemma 2's even layers are the windowed ones."""
    d = dict(GEMMA2, architectures=["Gemma2ForCausalLM"], model_type="gemma2")
    d.pop("rope_parameters")
    cfg = ModelConfig.from_hf(d)
    assert [cfg.window_of(i) for i in range(4)] == [8, None, 8, None]


def test_fused_projections_without_the_llama_kernels(pair):
    """The CUDA path's fused q/k/v and gate/up projections (attend_heads with Gemma's head norms and scale); the RoPE
    + KV-store kernel, which would apply Llama's head norms, and the short-query kernel with it are not taken."""
    import copy

    from eaglespec.config import EngineConfig
    from eaglespec.engine import transforms
    from eaglespec.engine.engine import Engine

    case, _, lm = pair
    if case != "text":
        return
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    prompts = [[2, 5, 6, 7], [2] + list(range(20, 40))]
    cfg = EngineConfig(max_batch_size=2)
    want = [o.token_ids for o in Engine(lm.model, None, cfg).generate(prompts, params)]
    fused = copy.deepcopy(lm.model)
    transforms.use_short_attention_kernel(transforms.use_rope_store_kernel(transforms.fuse_projections(fused)))
    attn = fused.model.layers[0].self_attn
    assert hasattr(attn, "qkv_proj") and attn.rope_store is None and attn.attn_kernel is None
    assert [o.token_ids for o in Engine(fused, None, cfg).generate(prompts, params)] == want


def write_gemma_gguf(path: Path, ref, arch: str) -> None:
    """`ref` (transformers' Gemma2 / Gemma3ForCausalLM) as llama.cpp's Gemma2Model / Gemma3Model writes it: every norm
    weight stored as 1 + w, Gemma's norm names (ffn_norm: the pre-FFN norm, post_ffw_norm: the post-FFN one), the
    head tied (no output tensor), the window and (Gemma 3) a linear scaling of the global layers' RoPE, (Gemma 2) the
    soft caps; no query_pre_attn_scalar (llama.cpp derives it)."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    sd = {k: v + 1 if k.endswith("norm.weight") else v for k, v in sd.items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_sliding_window(c.sliding_window)
    if arch == "gemma3":
        full = c.rope_parameters["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    else:
        w.add_rope_freq_base(c.rope_parameters["rope_theta"])
        w.add_float32("gemma2.attn_logit_softcapping", c.attn_logit_softcapping)
        w.add_float32("gemma2.final_logit_softcapping", c.final_logit_softcapping)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "post_ffw_norm": "post_feedforward_layernorm"}
    if arch == "gemma3":
        names.update(attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")
    for i in range(c.num_hidden_layers):
        for g, h in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"model.layers.{i}.{h}.weight"])
    finish(w)


@pytest.mark.parametrize("arch", ["gemma3", "gemma2"])
def test_llama_cpp_gemma_ggufs_answer_as_transformers(tmp_path, arch):
    """llama.cpp's fixed patterns: Gemma 3's every sixth layer global (all four windowed here), Gemma 2's every
    other; the tied head; the norms' stored 1 taken off again."""
    if arch == "gemma3":
        # (the pattern of 6 windows all 4 layers; transformers' rope_parameters keep TEXT's linear global scaling)
        ref = text_model(seed=9, tie_word_embeddings=True, sliding_window_pattern=6, query_pre_attn_scalar=16)
    else:
        hc = transformers.Gemma2Config(**{**GEMMA2, "tie_word_embeddings": True, "query_pre_attn_scalar": 16})
        hc._attn_implementation = "eager"
        ref = transformers.Gemma2ForCausalLM(hc).eval()
        randomize(ref, 9)
    write_gemma_gguf(tmp_path / "m.gguf", ref, arch)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    cfg = lm.config
    assert [cfg.window_of(i) for i in range(4)] == ([8] * 4 if arch == "gemma3" else [8, None, 8, None])
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    ids = torch.randint(3, 101, (2, 30), generator=torch.Generator().manual_seed(10))
    torch.testing.assert_close(plain_logits(lm.model, ids), logits_of(ref, ids), rtol=1e-4, atol=1e-4)


def test_gemma_27b_ggufs_scale_by_hidden_over_heads():
    """llama.cpp's rule for the 27B models (62 layers for Gemma 3): query_pre_attn_scalar = hidden / heads."""
    from eaglespec.loading.gguf_fields import gemma_fields

    m = {"gemma3.block_count": 62, "gemma3.attention.sliding_window": 1024}
    fields = gemma_fields("gemma3", m, lambda k: m[f"gemma3.{k}"], 168, 128)
    assert fields["query_pre_attn_scalar"] == 168
    m["gemma3.block_count"] = 34  # 4B
    assert gemma_fields("gemma3", m, lambda k: m[f"gemma3.{k}"], 320, 256)["query_pre_attn_scalar"] == 256
