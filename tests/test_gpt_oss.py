"""gpt-oss (models/gpt_oss.py) against transformers on a tiny random config (float32): a folder saved by transformers
(fused experts) and one holding the experts in MXFP4 as released, through our loader; attention sinks, alternating
sliding windows, YaRN, the biased router and clamped SwiGLU experts; speculation against plain greedy; llama.cpp's
gpt-oss GGUFs (experts split or with gate and up stacked)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import pytest
import torch
import transformers
from gguf_write import add_common, finish
from safetensors.torch import load_file, save_file
from tiny import assert_family_speculates, assert_matches_transformers, plain_logits

from eaglespec.errors import CheckpointError
from eaglespec.layers.attention import sdpa_written_out
from eaglespec.loading import load_model
from eaglespec.models.gpt_oss import FP4_VALUES, dequant_mxfp4

CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_local_experts=6, num_experts_per_tok=2, sliding_window=8,
              layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=256,
              rms_norm_eps=1e-5, swiglu_limit=7.0, tie_word_embeddings=False,
              rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                   original_max_position_embeddings=32, truncate=False))


def hf_model(seed: int = 0) -> transformers.GptOssForCausalLM:
    hc = transformers.GptOssConfig(**CONFIG)
    hc.architectures = ["GptOssForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.GptOssForCausalLM(hc).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # O(1) logits; sinks and biases that matter; gates that reach the clamp
        for name, t in ref.named_parameters():
            if t.dim() == 1 and name.endswith("norm.weight"):
                t.copy_(1 + 0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1 or name.endswith("_bias"):
                t.copy_(0.5 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(2.0 * torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-2 if "experts" in name else -1]))
    return ref


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    ref = hf_model()
    folder = tmp_path_factory.mktemp("gptoss")
    ref.save_pretrained(folder)
    return ref, load_model(folder, dtype=torch.float32)


def test_a_transformers_folder_answers_as_transformers(pair):
    ref, lm = pair
    assert [lm.config.window_of(i) for i in range(4)] == [8, None, 8, None]
    assert (lm.config.moe.router_bias, lm.config.moe.swiglu_limit, lm.config.moe.swiglu_alpha) == (True, 7.0, 1.702)
    assert_matches_transformers(ref, lm.model, length=40, seed=2)


def test_the_sinks_and_the_clamp_matter(pair):
    """Zero sinks (a learned sink logit of 0 still takes a share: set far below instead) or an unclamped SwiGLU
    change the logits: both are exercised."""
    _, lm = pair
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base = plain_logits(lm.model, ids)
        attn = lm.model.model.layers[1].self_attn
        saved = attn.sinks.clone()
        attn.sinks.fill_(-1e4)
        no_sink = plain_logits(lm.model, ids)
        attn.sinks.copy_(saved)
        experts = [e for layer in lm.model.model.layers for e in layer.mlp.experts]
        for e in experts:
            e.limit = 1e9
        unclamped = plain_logits(lm.model, ids)
        for e in experts:
            e.limit = 7.0
    assert (no_sink - base).abs().max() > 0.05 and (unclamped - base).abs().max() > 0.05


def test_sinks_equal_a_softmax_with_an_extra_column():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 5, 4, 8, generator=g), torch.randn(2, 7, 2, 8, generator=g), torch.randn(2, 7, 2, 8,
                                                                                                       generator=g)
    mask = torch.rand(2, 5, 7, generator=g) > 0.3
    sinks = torch.randn(4, generator=g)
    kh, vh = k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)
    s = torch.einsum("bthd,bkhd->bhtk", q, kh) / math.sqrt(8)
    s = torch.cat((s.masked_fill(~mask[:, None], float("-inf")), sinks[None, :, None, None].expand(2, 4, 5, 1)), -1)
    want = torch.einsum("bhtk,bkhd->bthd", torch.softmax(s, -1)[..., :-1], vh)
    torch.testing.assert_close(sdpa_written_out(q, k, v, mask, None, sinks), want, rtol=1e-5, atol=1e-6)


def test_greedy_speculation_equals_plain_and_the_cache_free_forward(pair):
    _, lm = pair
    assert_family_speculates(lm.model, hidden=64, recompute=True)  # the cached steps' sinks and windows


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., cols] (cols a multiple of 32) -> (blocks uint8 [..., G, 16], scales uint8 [..., G]): each block of 32
    scaled by a power of 2 that brings its largest magnitude to at most 6, every value the nearest E2M1 code."""
    blocks = w.reshape(*w.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1).clamp_min(1e-30)
    exp = torch.ceil(torch.log2(amax / 6.0)).to(torch.int32)  # [..., G]
    x = blocks / torch.exp2(exp.float())[..., None]
    table = torch.tensor(FP4_VALUES)
    codes = (x[..., None] - table).abs().argmin(-1).to(torch.uint8)  # [..., G, 32]
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exp + 127).to(torch.uint8)


def test_released_mxfp4_experts_load(tmp_path):
    """The releases' layout: `*_blocks` / `*_scales` for the expert weights (quant_method mxfp4), biases plain.
    The reference holds the dequantized weights; the logits agree."""
    ref = hf_model(seed=4)
    ref.save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    with torch.no_grad():
        for name in [n for n in sd if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            blocks, scales = quantize_mxfp4(sd.pop(name).transpose(1, 2).contiguous())  # [E, out, in]
            sd[f"{name}_blocks"], sd[f"{name}_scales"] = blocks, scales
            ref.get_parameter(name).copy_(dequant_mxfp4(blocks, scales).transpose(1, 2))
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    lm = load_model(tmp_path, dtype=torch.float32)
    assert_matches_transformers(ref, lm.model, length=30, seed=5)


def test_dequant_mxfp4_layout():
    """Byte j of a block holds elements 2j (low nibble) and 2j + 1 (high nibble); the scale is 2^(s - 127)."""
    blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)  # one row of one block
    blocks[0, 0, 0] = 0x2F  # element 0: code 15 (-6), element 1: code 2 (1.0)
    got = dequant_mxfp4(blocks, torch.tensor([[129]], dtype=torch.uint8))
    assert got.shape == (1, 32) and got[0, :3].tolist() == [-24.0, 4.0, 0.0]
    with pytest.raises(CheckpointError, match="MXFP4 blocks"):
        dequant_mxfp4(blocks, torch.tensor([1, 2], dtype=torch.uint8))


def write_gpt_oss_gguf(path: Path, ref: transformers.GptOssForCausalLM, fused_gate_up: bool) -> None:
    """`ref` as llama.cpp's GptOssModel writes it: the experts split from transformers' interleaved gate_up columns
    into `ffn_gate_exps` / `ffn_up_exps` (or stacked in one `ffn_gate_up_exps`, gate first), each [E, out, in], with
    their biases; the router's bias, the sinks, YaRN as rope.scaling fields, the window (even layers)."""
    c = ref.config
    sd = {k: v.detach().float() for k, v in ref.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    add_common(w, c, {k: v.numpy() for k, v in sd.items()})
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.intermediate_size)
    w.add_sliding_window(c.sliding_window)
    rope = c.rope_parameters
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for g, h in (("attn_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm")):
            w.add_tensor(f"blk.{i}.{g}.weight", sd[f"{pre}{h}.weight"].numpy())
        for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
            for kind in ("weight", "bias"):
                w.add_tensor(f"blk.{i}.{g}.{kind}", sd[f"{pre}self_attn.{h}.{kind}"].numpy())
        w.add_tensor(f"blk.{i}.attn_sinks.weight", sd[f"{pre}self_attn.sinks"].numpy())
        for kind in ("weight", "bias"):
            w.add_tensor(f"blk.{i}.ffn_gate_inp.{kind}", sd[f"{pre}mlp.router.{kind}"].numpy())
        gate_up = sd[f"{pre}mlp.experts.gate_up_proj"].transpose(1, 2)  # [E, 2I, H], rows gate, up, gate, ...
        gate_up_bias = sd[f"{pre}mlp.experts.gate_up_proj_bias"]
        parts = {"gate": (gate_up[:, 0::2], gate_up_bias[:, 0::2]), "up": (gate_up[:, 1::2], gate_up_bias[:, 1::2])}
        if fused_gate_up:
            w.add_tensor(f"blk.{i}.ffn_gate_up_exps.weight", torch.cat((parts["gate"][0], parts["up"][0]), 1).numpy())
            w.add_tensor(f"blk.{i}.ffn_gate_up_exps.bias", torch.cat((parts["gate"][1], parts["up"][1]), 1).numpy())
        else:
            for g, (wt, b) in parts.items():
                w.add_tensor(f"blk.{i}.ffn_{g}_exps.weight", wt.contiguous().numpy())
                w.add_tensor(f"blk.{i}.ffn_{g}_exps.bias", b.contiguous().numpy())
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", sd[f"{pre}mlp.experts.down_proj"].transpose(1, 2).contiguous()
                     .numpy())
        w.add_tensor(f"blk.{i}.ffn_down_exps.bias", sd[f"{pre}mlp.experts.down_proj_bias"].numpy())
    finish(w)


@pytest.mark.parametrize("fused_gate_up", [False, True])
def test_llama_cpp_gpt_oss_gguf_answers_as_transformers(tmp_path, fused_gate_up):
    ref = hf_model(seed=6)
    write_gpt_oss_gguf(tmp_path / "m.gguf", ref, fused_gate_up)
    lm = load_model(tmp_path / "m.gguf", dtype=torch.float32)
    cfg = lm.config
    assert cfg.architecture == "GptOssForCausalLM" and [cfg.window_of(i) for i in range(4)] == [8, None, 8, None]
    assert (cfg.rope.type, cfg.rope.factor, cfg.rope.truncate) == ("yarn", 4.0, False)
    assert_matches_transformers(ref, lm.model, length=40, seed=7)
