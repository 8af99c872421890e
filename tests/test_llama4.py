"""Llama 4 (models/llama4.py) against transformers on tiny random configs (float32): chunked attention on the RoPE
layers (chunks of 8 over 40 tokens), NoPE layers with the query temperature (floor_scale 4, so it grows within the
test's positions), weightless q / k norms, a MoE every other layer whose routing weights scale the experts' inputs,
the text model and the multimodal wrapper for text; speculation against plain greedy and the cache-free forward; the
released configs' layer plans and parameter counts; the chunk mask over a verified tree's nodes; llama.cpp's llama4
GGUFs."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf_write import add_common, finish
from tiny import assert_family_speculates, assert_matches_transformers, plain_logits, randomize_moe

from eaglespec.config import ModelConfig
from eaglespec.layers.attention import GQAAttention, QKNormAttention
from eaglespec.layers.context import Chunk, ForwardContext
from eaglespec.layers.moe import MoE
from eaglespec.loading import load_model
from eaglespec.loading.checkpoint import build_on_meta
from eaglespec.models import get_model_class

TEXT = dict(vocab_size=101, hidden_size=64, intermediate_size=32, intermediate_size_mlp=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
            interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=8, floor_scale=4,
            attn_scale=0.1, use_qk_norm=True, max_position_embeddings=256, rms_norm_eps=1e-5,
            tie_word_embeddings=False, pad_token_id=0,
            rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=64))
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
              patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=64,
              pixel_shuffle_ratio=0.5)


def _saved(ref: torch.nn.Module, arch: str, folder) -> object:
    ref.config.architectures = [arch]
    randomize_moe(ref, 0)
    ref.save_pretrained(folder)
    return load_model(folder, dtype=torch.float32)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hc = transformers.Llama4TextConfig(**TEXT)
    hc._attn_implementation = "eager"
    ref = transformers.Llama4ForCausalLM(hc).eval()
    return ref, _saved(ref, "Llama4ForCausalLM", tmp_path_factory.mktemp("llama4"))


def test_a_transformers_folder_answers_as_transformers(pair):
    ref, lm = pair
    cfg, layers = lm.config, lm.model.model.layers
    assert [cfg.uses_rope(i) for i in range(4)] == [True, False, True, False]
    assert [layer.self_attn.window for layer in layers] == [Chunk(8), None, Chunk(8), None]
    assert [layer.self_attn.temperature for layer in layers] == [None, (4.0, 0.1, 1.0), None, (4.0, 0.1, 1.0)]
    assert [type(layer.self_attn) for layer in layers] == [QKNormAttention, GQAAttention] * 2
    assert [isinstance(layer.mlp, MoE) for layer in layers] == [False, True, False, True]
    assert all(torch.equal(layer.self_attn.q_norm.weight, torch.ones(16)) for layer in layers[::2])
    assert_matches_transformers(ref, lm.model)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    """Prompts of up to 25 tokens and 16 new ones: chunk boundaries inside the verified trees, temperatures > 1."""
    _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)


def test_the_multimodal_wrapper_answers_as_transformers_for_text(tmp_path):
    hc = transformers.Llama4Config(text_config=TEXT, vision_config=VISION)
    hc._attn_implementation = "eager"
    ref = transformers.Llama4ForConditionalGeneration(hc).eval()
    lm = _saved(ref, "Llama4ForConditionalGeneration", tmp_path)  # the vision tower and projector skipped
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    torch.testing.assert_close(plain_logits(lm.model, ids), want, rtol=1e-4, atol=1e-4)


# the released configs' text fields (meta-llama/Llama-4-Scout-17B-16E-Instruct, -Maverick-17B-128E-Instruct)
SCOUT = dict(architectures=["Llama4ForConditionalGeneration"], model_type="llama4",
             text_config=dict(model_type="llama4_text", hidden_size=5120, intermediate_size=8192,
                              intermediate_size_mlp=16384, num_hidden_layers=48, num_attention_heads=40,
                              num_key_value_heads=8, head_dim=128, num_local_experts=16, num_experts_per_tok=1,
                              interleave_moe_layer_step=1, no_rope_layers=[], attention_chunk_size=8192,
                              attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, use_qk_norm=True,
                              vocab_size=202048, max_position_embeddings=10485760, rms_norm_eps=1e-5,
                              rope_theta=500000.0, tie_word_embeddings=False,
                              rope_scaling=dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0,
                                                high_freq_factor=1.0, original_max_position_embeddings=8192)))
MAVERICK = dict(SCOUT, text_config=dict(SCOUT["text_config"], num_local_experts=128, interleave_moe_layer_step=2,
                                        use_qk_norm=False, rope_scaling=None))


@pytest.mark.parametrize("released,experts,total_b,active_b", [(SCOUT, 16, 107.8, 17.2), (MAVERICK, 128, 400.7, 17.2)])
def test_released_configs_plan_their_layers(released, experts, total_b, active_b):
    """Every fourth layer NoPE (an empty no_rope_layers means the default), the others chunked; Scout's MoE in every
    layer with q / k norms, Maverick's every other one without; the language models' parameters (the releases'
    109B / 400B include the vision tower), 17B of them active a token."""
    cfg = ModelConfig.from_hf(released)
    assert [cfg.uses_rope(i) for i in range(8)] == [True, True, True, False] * 2
    m = build_on_meta(get_model_class(cfg.architecture), cfg, torch.bfloat16)
    layers = m.language_model.model.layers
    assert [layer.self_attn.window for layer in layers[:4]] == [Chunk(8192)] * 3 + [None]
    assert layers[3].self_attn.temperature == (8192.0, 0.1, 1.0)
    assert isinstance(layers[0].self_attn, QKNormAttention) == (released is SCOUT)
    sparse = [isinstance(layer.mlp, MoE) for layer in layers]
    assert sparse == ([True] * 48 if released is SCOUT else [False, True] * 24)
    total = sum(p.numel() for p in m.parameters())
    expert = 3 * 5120 * 8192
    active = total - sum(sparse) * (experts - 1) * expert  # a token reads 1 routed expert a layer
    assert round(total / 1e9, 1) == total_b and round(active / 1e9, 1) == active_b


def test_chunk_and_window_masks_read_a_tree_nodes_own_positions():
    """A verified tree's nodes sit at cache slots L + i but at positions L + depth: the chunk (and window) masks read
    the positions. Row: 6 committed keys, a tree root + two children + a grandchild written at slots 6..9 with
    positions 6, 7, 7, 8; chunks of 8: the grandchild (position 8) starts a new chunk and sees itself only, though
    its parent's slot 7 lies in chunk 0 by slot and its own slot 9 in chunk 1."""
    positions = torch.tensor([[6, 7, 7, 8]])
    write = torch.tensor([[6, 7, 8, 9]])
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    mask = torch.cat((torch.ones(1, 4, 6, dtype=torch.bool), tree[None]), -1)  # [1, 4, 10]
    ctx = ForwardContext(positions=positions, write_index=write, attn_mask=mask)
    assert ctx.key_positions().tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 7, 8]]
    chunked = ctx.mask(Chunk(8))
    assert chunked[0, 3].nonzero().flatten().tolist() == [9]  # the grandchild: its own key, position 8
    assert torch.equal(chunked[0, :3], mask[0, :3])  # the others stay in chunk 0 with their whole prefix
    window = ctx.mask(3)  # keys at positions > p - 3
    assert window[0, 3].nonzero().flatten().tolist() == [6, 7, 9]  # positions 6, 7 (root, its parent) and 8
    assert window[0, 1].nonzero().flatten().tolist() == [5, 6, 7]


def write_llama4_gguf(path, ref) -> None:
    """`ref` (a transformers Llama4ForCausalLM) as llama.cpp's Llama4Model writes it: q / k rows as they are (no
    permutation), the fused experts split and transposed into ffn_{gate,up,down}_exps [E, out, in], the router, the
    shared expert, the dense layers' feed-forward length; Scout's llama3 scaling as `rope_freqs` factors."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama4")
    add_common(w, c, sd)
    w.add_feed_forward_length(c.intermediate_size_mlp)
    w.add_expert_feed_forward_length(c.intermediate_size)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_interleave_moe_layer_step(c.interleave_moe_layer_step)
    w.add_rope_dimension_count(c.head_dim)
    rope, half = c.rope_parameters, c.head_dim // 2
    factors = []  # the converter's llama3 factors (low == high: no ramp)
    for i in range(half):
        wavelen = 2 * math.pi * rope["rope_theta"] ** (2 * i / c.head_dim)
        old = rope["original_max_position_embeddings"]
        factors.append(1.0 if wavelen < old / rope["high_freq_factor"] else rope["factor"])
    assert 1.0 in factors and rope["factor"] in factors  # both kinds of frequency
    w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    for i in range(c.num_hidden_layers):
        pre, ff = f"model.layers.{i}.", f"model.layers.{i}.feed_forward."
        for g, h in (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"),
                     ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
                     ("attn_output", "self_attn.o_proj")):
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{h}.weight"])
        if f"{ff}router.weight" not in sd:  # a dense layer
            for g in ("gate", "up", "down"):
                w.add_tensor(f"blk.{i}.ffn_{g}.weight", sd[f"{ff}{g}_proj.weight"])
            continue
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", sd[f"{ff}router.weight"])
        gate, up = np.split(sd[f"{ff}experts.gate_up_proj"].transpose(0, 2, 1), 2, axis=1)  # [E, I, H] each
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(up))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", np.ascontiguousarray(
            sd[f"{ff}experts.down_proj"].transpose(0, 2, 1)))
        for g in ("gate", "up", "down"):
            w.add_tensor(f"blk.{i}.ffn_{g}_shexp.weight", sd[f"{ff}shared_expert.{g}_proj.weight"])
    finish(w)


def test_llama_cpp_llama4_gguf_answers_as_transformers(tmp_path):
    """A llama.cpp llama4 file of a model with llama.cpp's constants (chunks of 8,192, every fourth layer NoPE, the
    temperature's floor 8,192 and scale 0.1, q / k norms with 16 experts) and Scout's RoPE scaling."""
    text = dict(TEXT, num_hidden_layers=4, no_rope_layer_interval=4, attention_chunk_size=8192, floor_scale=8192,
                num_local_experts=16, interleave_moe_layer_step=1,
                rope_parameters=dict(rope_type="llama3", rope_theta=5e5, factor=16.0, low_freq_factor=1.0,
                                     high_freq_factor=1.0, original_max_position_embeddings=8192))
    hc = transformers.Llama4TextConfig(**text)
    hc._attn_implementation = "eager"
    ref = transformers.Llama4ForCausalLM(hc).eval()
    randomize_moe(ref, 3)
    write_llama4_gguf(tmp_path / "m.gguf", ref)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    cfg = lm.config
    assert cfg.architecture == "Llama4ForCausalLM" and [cfg.uses_rope(i) for i in range(4)] == [True] * 3 + [False]
    assert (cfg.rope.type, cfg.rope.factor, cfg.rope.low_freq_factor, cfg.rope.high_freq_factor) == (
        "llama3", 16.0, 1.0, 1.0)
    assert lm.model.model.layers[0].self_attn.window == Chunk(8192) and cfg.moe.n_routed_experts == 16
    assert_matches_transformers(ref, lm.model)
