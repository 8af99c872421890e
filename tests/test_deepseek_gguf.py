"""llama.cpp's `deepseek2` GGUFs (DeepSeek-V2 / V2-Lite / V3 and Kimi-K2 files) written here, as its converter writes
them, from tiny random transformers DeepseekV3 / DeepseekV2 models: the config (MLA sizes in the new `*_mla` keys and
the old ones, the router by `expert_gating_func`, YaRN's log multiplier), `kv_b_proj` joined back from `attn_k_b` /
`attn_v_b` (or read whole from older files), transformers' logits (float32, and quantized with the reference holding
the same round trip), the GGUF -> HF folder conversion, and what is refused."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf_write import add_quantized, checkpoint_names, finish
from tiny import per_expert, plain_logits

from eaglespec.errors import CheckpointError, ConfigError
from eaglespec.loading import GGUFFile, convert_gguf, load_model
from eaglespec.loading.tokenizer import bytes_to_unicode

# Every matrix's rows a whole number of 32-element quantization blocks (nope 32, kv_lora 32, q_lora 32, v 16 x 4 heads)
COMMON = dict(vocab_size=101, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=32,
              v_head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=640)
YARN = dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
            rope_theta=10000.0)
CASES = {
    # V3 / Kimi-K2: sigmoid noaux_tc over 4 groups (2 kept), a dense first layer, q LoRA, YaRN past 16 positions
    "v3": ("DeepseekV3", dict(COMMON, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1, n_group=4,
                              topk_group=2, first_k_dense_replace=1, q_lora_rank=32, routed_scaling_factor=2.5,
                              norm_topk_prob=True, rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=1.0))),
    # V2-Lite: greedy softmax top-3 of 8, two shared experts, no q LoRA, weights not normalised, plain RoPE
    "v2_lite": ("DeepseekV2", dict(COMMON, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2,
                                   first_k_dense_replace=1, q_lora_rank=None, topk_method="greedy",
                                   routed_scaling_factor=1.0, rope_parameters=dict(rope_type="default",
                                                                                   rope_theta=10000.0))),
    # V2: group_limited_greedy (4 groups, 2 kept), q LoRA, routed scaling, YaRN with V2's mscale 0.707
    "v2_grouped": ("DeepseekV2", dict(COMMON, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
                                      first_k_dense_replace=0, q_lora_rank=32, topk_method="group_limited_greedy",
                                      n_group=4, topk_group=2, routed_scaling_factor=2.5,
                                      rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707))),
}
# GGUF tensor name (in a block) -> the HF name it holds ("{e}": experts stacked along the first dimension)
ATTENTION = {"attn_norm": "input_layernorm", "attn_q_a": "self_attn.q_a_proj",
             "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj", "attn_q": "self_attn.q_proj",
             "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
             "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm"}
DENSE = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
SPARSE = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
          "ffn_up_exps": "mlp.experts.{e}.up_proj", "ffn_down_exps": "mlp.experts.{e}.down_proj",
          "ffn_gate_shexp": "mlp.shared_experts.gate_proj", "ffn_up_shexp": "mlp.shared_experts.up_proj",
          "ffn_down_shexp": "mlp.shared_experts.down_proj"}
QUANTIZED = {"token_embd": Q.Q8_0, "output": Q.Q8_0, "attn_q_a": Q.Q4_0, "attn_q_b": Q.Q8_0, "attn_q": Q.Q8_0,
             "attn_kv_a_mqa": Q.Q8_0, "attn_k_b": Q.Q8_0, "attn_v_b": Q.Q4_1, "attn_kv_b": Q.Q8_0,
             "attn_output": Q.BF16,
             "ffn_gate_exps": Q.Q8_0, "ffn_up_exps": Q.Q4_1, "ffn_down_exps": Q.Q4_0, "ffn_gate_shexp": Q.F16,
             "ffn_gate": Q.Q8_0}


def hf_model(case: str, seed: int = 0) -> transformers.PreTrainedModel:
    family, kw = CASES[case]
    hc = getattr(transformers, f"{family}Config")(**kw)
    hc._attn_implementation = "eager"
    ref = getattr(transformers, f"{family}ForCausalLM")(hc).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # O(1) logits and input-dependent routing (transformers' init is too small)
        for name, t in list(ref.named_parameters()) + list(ref.named_buffers()):
            if "inv_freq" in name:
                continue
            if name.endswith("e_score_correction_bias"):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1:
                t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))
    return ref


def gguf_tensors(ref: transformers.PreTrainedModel, split_kv_b: bool) -> dict[str, np.ndarray]:
    """llama.cpp's converter in miniature: GGUF names, float32 numpy, experts stacked, kv_b_proj cut into attn_k_b
    [H, r, nope] (per head, transposed) and attn_v_b [H, v, r] when `split_kv_b` (its converter since the MLA
    rework)."""
    c = ref.config
    sd = {k: v.detach().float().numpy() for k, v in per_expert(ref.state_dict()).items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        blocks = {**ATTENTION, **(SPARSE if i >= c.first_k_dense_replace else DENSE)}
        for g, h in blocks.items():
            hf = f"{pre}{h}.weight"
            if "{e}" in hf:
                stack = [sd[hf.replace("{e}", str(e))] for e in range(c.n_routed_experts)]
                out[f"blk.{i}.{g}.weight"] = np.stack(stack)
            elif hf in sd:
                out[f"blk.{i}.{g}.weight"] = sd[hf]
        if f"{pre}mlp.gate.e_score_correction_bias" in sd:
            out[f"blk.{i}.exp_probs_b.bias"] = sd[f"{pre}mlp.gate.e_score_correction_bias"]
        kv_b = sd[f"{pre}self_attn.kv_b_proj.weight"]
        if split_kv_b:
            heads = kv_b.reshape(c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
            out[f"blk.{i}.attn_k_b.weight"] = np.ascontiguousarray(heads[:, : c.qk_nope_head_dim].transpose(0, 2, 1))
            out[f"blk.{i}.attn_v_b.weight"] = np.ascontiguousarray(heads[:, c.qk_nope_head_dim :])
        else:
            out[f"blk.{i}.attn_kv_b.weight"] = kv_b
    return out


def write_deepseek2_gguf(path: Path, ref: transformers.PreTrainedModel, *, split_kv_b: bool = True,
                         gating: int | None = None, types: dict[str, Q] | None = None, skip_keys: tuple[str, ...] = (),
                         skip_tensors: tuple[str, ...] = (), pre: str = "deepseek-v3") -> dict[str, np.ndarray]:
    """`ref` as a `deepseek2` GGUF with the metadata llama.cpp's DeepseekV2Model writes (the `*_mla` head sizes when
    `split_kv_b`, the old meaning of key_length / value_length otherwise); `gating` None: V3's 2 for a model with a
    correction bias, else V2's 1 (0: no key, as in files written before it existed). Returns what the file holds,
    dequantized: float32 arrays by GGUF name."""
    c = ref.config
    rope = c.rope_parameters
    v3 = hasattr(ref.model.layers[-1].mlp.gate, "e_score_correction_bias")
    gating = (2 if v3 else 1) if gating is None else gating
    w = gguf.GGUFWriter(str(path), "deepseek2")
    q_head = c.qk_nope_head_dim + c.qk_rope_head_dim
    keys = {
        "block_count": lambda: w.add_block_count(c.num_hidden_layers),
        "context_length": lambda: w.add_context_length(c.max_position_embeddings),
        "embedding_length": lambda: w.add_embedding_length(c.hidden_size),
        "feed_forward_length": lambda: w.add_feed_forward_length(c.intermediate_size),
        "attention.head_count": lambda: w.add_head_count(c.num_attention_heads),
        "attention.head_count_kv": lambda: w.add_head_count_kv(1),  # MLA written as one shared latent (MQA)
        "attention.layer_norm_rms_epsilon": lambda: w.add_layer_norm_rms_eps(c.rms_norm_eps),
        "rope.freq_base": lambda: w.add_rope_freq_base(rope["rope_theta"]),
        "rope.dimension_count": lambda: w.add_rope_dimension_count(c.qk_rope_head_dim),
        "leading_dense_block_count": lambda: w.add_leading_dense_block_count(c.first_k_dense_replace),
        "attention.kv_lora_rank": lambda: w.add_kv_lora_rank(c.kv_lora_rank),
        "attention.key_length": lambda: w.add_key_length(c.kv_lora_rank + c.qk_rope_head_dim if split_kv_b
                                                         else q_head),
        "attention.value_length": lambda: w.add_value_length(c.kv_lora_rank if split_kv_b else c.v_head_dim),
        "expert_feed_forward_length": lambda: w.add_expert_feed_forward_length(c.moe_intermediate_size),
        "expert_count": lambda: w.add_expert_count(c.n_routed_experts),
        "expert_used_count": lambda: w.add_expert_used_count(c.num_experts_per_tok),
        "expert_shared_count": lambda: w.add_expert_shared_count(c.n_shared_experts),
        "expert_weights_scale": lambda: w.add_expert_weights_scale(c.routed_scaling_factor),
        "expert_group_count": lambda: w.add_expert_group_count(c.n_group or 1),
        "expert_group_used_count": lambda: w.add_expert_group_used_count(c.topk_group or 1),
    }
    if split_kv_b:
        keys["attention.key_length_mla"] = lambda: w.add_key_length_mla(q_head)
        keys["attention.value_length_mla"] = lambda: w.add_value_length_mla(c.v_head_dim)
    if c.q_lora_rank:
        keys["attention.q_lora_rank"] = lambda: w.add_q_lora_rank(c.q_lora_rank)
    if c.norm_topk_prob:
        keys["expert_weights_norm"] = lambda: w.add_expert_weights_norm(True)
    if gating:
        keys["expert_gating_func"] = lambda: w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    if rope["rope_type"] == "yarn":
        keys["rope.scaling.type"] = lambda: w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        keys["rope.scaling.factor"] = lambda: w.add_rope_scaling_factor(rope["factor"])
        keys["rope.scaling.original_context_length"] = lambda: w.add_rope_scaling_orig_ctx_len(
            rope["original_max_position_embeddings"])
        keys["rope.scaling.yarn_log_multiplier"] = lambda: w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    for key, add in keys.items():
        if key not in skip_keys:
            add()
    add_vocabulary(w, c.vocab_size, pre)
    held = {}
    for name, arr in gguf_tensors(ref, split_kv_b).items():
        if name in skip_tensors:
            continue
        qtype = (types or {}).get(name.split(".")[-2], Q.F32)
        held[name] = add_quantized(w, name, arr, qtype)
    finish(w)
    return held


def add_vocabulary(w: gguf.GGUFWriter, vocab: int, pre: str) -> None:
    """A byte-level BPE vocabulary with DeepSeek's special tokens (outside the byte alphabet), BOS added."""
    byte_chars = list(bytes_to_unicode().values())
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(specials + ["ab"] + byte_chars[: vocab - len(specials) - 1])  # "a" is 69, "b" 70
    w.add_token_types([3] * len(specials) + [1] * (vocab - len(specials)))
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
                        "{% else %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
                        "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")


def with_weights(ref: transformers.PreTrainedModel, held: dict[str, np.ndarray]) -> None:
    """Give the transformers model the weights a (quantized) file holds: kv_b_proj re-joined head by head, the experts
    in transformers' fused [E, 2I, H] gate|up and [E, H, I] down."""
    c = ref.config
    new = {"model.embed_tokens.weight": held["token_embd.weight"], "model.norm.weight": held["output_norm.weight"],
           "lm_head.weight": held["output.weight"]}
    for i in range(c.num_hidden_layers):
        pre = f"model.layers.{i}."
        for g, h in {**ATTENTION, **DENSE, **SPARSE}.items():
            if "{e}" not in h and f"blk.{i}.{g}.weight" in held:
                new[f"{pre}{h}.weight"] = held[f"blk.{i}.{g}.weight"]
        if f"blk.{i}.exp_probs_b.bias" in held:
            new[f"{pre}mlp.gate.e_score_correction_bias"] = held[f"blk.{i}.exp_probs_b.bias"]
        if f"blk.{i}.attn_k_b.weight" in held:
            k_b, v_b = held[f"blk.{i}.attn_k_b.weight"], held[f"blk.{i}.attn_v_b.weight"]
            heads = [np.concatenate([k_b[h].T, v_b[h]]) for h in range(c.num_attention_heads)]
            new[f"{pre}self_attn.kv_b_proj.weight"] = np.concatenate(heads)
        else:
            new[f"{pre}self_attn.kv_b_proj.weight"] = held[f"blk.{i}.attn_kv_b.weight"]
        if i >= c.first_k_dense_replace:
            new[f"{pre}mlp.experts.gate_up_proj"] = np.concatenate(
                [held[f"blk.{i}.ffn_gate_exps.weight"], held[f"blk.{i}.ffn_up_exps.weight"]], 1)
            new[f"{pre}mlp.experts.down_proj"] = held[f"blk.{i}.ffn_down_exps.weight"]
    sd = ref.state_dict()
    assert set(new) == {k for k in sd if "inv_freq" not in k}
    with torch.no_grad():
        for k, v in new.items():
            sd[k].copy_(torch.from_numpy(v))


IDS = torch.randint(4, 101, (2, 40), generator=torch.Generator().manual_seed(1))  # 40 positions: past YaRN's 16


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("split_kv_b", [True, False], ids=["k_b+v_b", "kv_b"])
def test_logits_match_transformers(tmp_path, case, split_kv_b):
    ref = hf_model(case)
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, ref, split_kv_b=split_kv_b)
    assert {n for n, _ in GGUFFile(path).hf_tensors()} == checkpoint_names(ref, tmp_path / "hf")  # DeepSeek's own
    loaded = load_model(path, dtype="float32")
    with torch.no_grad():
        want = ref(IDS).logits
    torch.testing.assert_close(plain_logits(loaded.model, IDS), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", list(CASES))
def test_config(tmp_path, case):
    ref = hf_model(case)
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, ref)
    cfg = load_model(path, dtype="float32").config
    c = ref.config
    v3 = CASES[case][0] == "DeepseekV3"
    assert cfg.architecture == ("DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM")
    assert cfg.model_type == ("deepseek_v3" if v3 else "deepseek_v2")
    assert cfg.num_key_value_heads == cfg.num_attention_heads == 4  # not the file's MQA head_count_kv 1
    mla = cfg.mla
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (
        c.q_lora_rank, 32, 32, 8, 16)
    moe = cfg.moe
    assert (moe.n_routed_experts, moe.num_experts_per_tok, moe.n_shared_experts, moe.first_k_dense_replace,
            moe.routed_scaling_factor) == (8, 3, c.n_shared_experts, c.first_k_dense_replace, c.routed_scaling_factor)
    assert (moe.scoring_func, moe.topk_method, moe.norm_topk_prob, moe.router_float32) == {
        "v3": ("sigmoid", "noaux_tc", True, False), "v2_lite": ("softmax", "greedy", False, True),
        "v2_grouped": ("softmax", "group_limited_greedy", False, True)}[case]
    assert (moe.n_group, moe.topk_group) == ((4, 2) if case != "v2_lite" else (1, 1))
    if c.rope_parameters["rope_type"] == "yarn":
        want = c.rope_parameters["mscale_all_dim"]
        assert cfg.rope.type == "yarn" and cfg.rope.factor == 40.0 and cfg.rope.original_max_position_embeddings == 16
        assert cfg.rope.mscale == pytest.approx(want) and cfg.rope.mscale_all_dim == pytest.approx(want)
        assert cfg.rope.attention_factor == 1.0
    else:
        assert cfg.rope.type == "default"


def test_files_before_the_gating_key_are_softmax(tmp_path):
    """A V2 file written before `expert_gating_func` existed: llama.cpp reads it as softmax, and so do we."""
    ref = hf_model("v2_lite")
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, ref, split_kv_b=False, gating=0)
    assert "deepseek2.expert_gating_func" not in GGUFFile(path).metadata
    loaded = load_model(path, dtype="float32")
    assert loaded.config.architecture == "DeepseekV2ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(plain_logits(loaded.model, IDS), ref(IDS).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["v3", "v2_lite"])
def test_quantized_file_matches_transformers_on_the_same_weights(tmp_path, case):
    ref = hf_model(case, seed=3)
    path = tmp_path / "q.gguf"
    held = write_deepseek2_gguf(path, ref, types=QUANTIZED)
    assert {GGUFFile(path).tensors[i].qtype.name for i in range(len(GGUFFile(path).tensors))} >= {"Q8_0", "Q4_1"}
    with_weights(ref, held)
    loaded = load_model(path, dtype="float32")
    with torch.no_grad():
        torch.testing.assert_close(plain_logits(loaded.model, IDS), ref(IDS).logits, rtol=1e-4, atol=1e-4)
    # the joined kv_b_proj is exactly the file's two halves, head by head
    k_b, v_b = held["blk.0.attn_k_b.weight"], held["blk.0.attn_v_b.weight"]
    kv_b = dict(GGUFFile(path).hf_tensors())["model.layers.0.self_attn.kv_b_proj.weight"]
    assert torch.equal(kv_b[:32], torch.from_numpy(k_b[0].T)) and torch.equal(kv_b[32:48], torch.from_numpy(v_b[0]))


def test_convert_to_a_folder_loads_the_same_model(tmp_path):
    ref = hf_model("v3")
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, ref)
    folder = convert_gguf(path, tmp_path / "hf", torch.float32)
    a, b = load_model(path, dtype="float32"), load_model(folder, dtype="float32")
    assert b.config.architecture == "DeepseekV3ForCausalLM"
    torch.testing.assert_close(plain_logits(b.model, IDS), plain_logits(a.model, IDS), rtol=0, atol=0)


def test_tokenizer_keeps_deepseeks_special_tokens_whole(tmp_path):
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, hf_model("v3"))
    tok = load_model(path, dtype="float32").tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "ab"}], add_generation_prompt=True)
    assert text == "<｜begin▁of▁sentence｜><｜User｜>ab<｜Assistant｜>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [0, 2, 4, 3]  # each special token one id, "ab" merged
    assert tok.encode("ab", add_special_tokens=True) == [0, 4]  # add_bos_token
    assert tok.vocab_size == 101  # the special tokens added under their own ids, none appended
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert tok.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("skip, match", [
    (("attention.kv_lora_rank",), "lacks the GGUF metadata field 'deepseek2.attention.kv_lora_rank'"),
    (("expert_used_count",), "lacks the GGUF metadata field 'deepseek2.expert_used_count'"),
    (("rope.dimension_count",), "lacks the GGUF metadata field 'deepseek2.rope.dimension_count'"),
])
def test_missing_metadata_is_named(tmp_path, skip, match):
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, hf_model("v3"), skip_keys=skip)
    with pytest.raises(ConfigError, match=match):
        load_model(path)


def test_sigmoid_router_without_its_correction_bias_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, hf_model("v3"), skip_tensors=tuple(f"blk.{i}.exp_probs_b.bias" for i in range(3)))
    with pytest.raises(ConfigError, match=r"sigmoid expert gating .* without the router's correction bias "
                                          r"\(blk.1.exp_probs_b.bias\) is not supported"):
        load_model(path)


def test_unknown_gating_function_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    ref = hf_model("v2_lite")
    write_deepseek2_gguf(path, ref, skip_keys=("expert_gating_func",), gating=1)
    g = GGUFFile(path)
    g.metadata["deepseek2.expert_gating_func"] = 3
    with pytest.raises(ConfigError, match="deepseek2.expert_gating_func 3 is not supported"):
        g.hf_config()


def test_one_half_of_kv_b_alone_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    write_deepseek2_gguf(path, hf_model("v3"), skip_tensors=("blk.2.attn_v_b.weight",))
    with pytest.raises(CheckpointError, match="attn_k_b without attn_v_b: model.layers.2.self_attn.kv_b_proj.weight "
                                              "needs both of its halves"):
        load_model(path)
