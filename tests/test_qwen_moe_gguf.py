"""llama.cpp's `qwen3moe` GGUFs (Qwen3-30B-A3B's layout: the router `ffn_gate_inp`, the experts stacked per projection
in `ffn_{gate,up,down}_exps`) written here from a tiny random transformers Qwen3MoeForCausalLM, loaded through our
loader as `Qwen3MoeForCausalLM`: its config, one tensor per expert in the right place, transformers' logits (float32
and quantized: the reference then holds the same quantize -> dequantize round trip), and what is refused."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf_write import add_quantized, finish, random_k_quant
from tiny import per_expert, plain_logits, randomize_moe

from eaglespec.errors import CheckpointError, ConfigError
from eaglespec.layers.moe import MoE
from eaglespec.loading import GGUFFile, load_model
from eaglespec.loading.tokenizer import bytes_to_unicode

# hidden 64 and moe_intermediate_size 32: every row a whole number of 32-element quantization blocks
CONFIG = dict(vocab_size=101, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
              max_position_embeddings=256, rms_norm_eps=1e-6, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, rope_theta=1e6, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
              decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False)
# GGUF name -> the HF name it holds ("{e}": the experts stacked along the first dimension, expert 0 first)
BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj", "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
# a mix of the quantized types (the experts' three projections each a different one), as llama.cpp's mixes do
QUANTIZED = {"token_embd": Q.Q8_0, "output": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q8_0, "attn_v": Q.F16,
             "attn_output": Q.BF16, "ffn_gate_inp": Q.F16, "ffn_gate_exps": Q.Q8_0, "ffn_up_exps": Q.Q4_1,
             "ffn_down_exps": Q.Q4_0}


def hf_qwen3_moe(seed: int = 0, tied: bool = False, **kw) -> transformers.Qwen3MoeForCausalLM:
    hc = transformers.Qwen3MoeConfig(**{**CONFIG, **kw}, tie_word_embeddings=tied)
    hc.architectures = ["Qwen3MoeForCausalLM"]
    hc._attn_implementation = "eager"
    ref = transformers.Qwen3MoeForCausalLM(hc).eval()
    randomize_moe(ref, seed)
    return ref


def gguf_tensors(ref: transformers.Qwen3MoeForCausalLM) -> dict[str, np.ndarray]:
    """llama.cpp's converter in miniature: GGUF names, float32 numpy in the HF layout, experts stacked."""
    sd = {k: v.detach().float().numpy() for k, v in per_expert(ref.state_dict()).items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not ref.config.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    n_experts = ref.config.num_experts
    for i in range(ref.config.num_hidden_layers):
        for g, h in BLOCK.items():
            hf = f"model.layers.{i}.{h}.weight"
            stack = [sd[hf.replace("{e}", str(e))] for e in range(n_experts)] if "{e}" in hf else None
            out[f"blk.{i}.{g}.weight"] = np.stack(stack) if stack else sd[hf]
    return out


def write_qwen3moe_gguf(path: Path, ref: transformers.Qwen3MoeForCausalLM, types: dict[str, Q] | None = None,
                        skip_keys: tuple[str, ...] = (), skip_tensors: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """`ref` as a `qwen3moe` GGUF (with a byte-level BPE vocabulary, Qwen's pre-split); tensor kinds quantized as
    `types` says (else F32). Returns what the file holds, dequantized: float32 arrays by GGUF name."""
    c = ref.config
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    keys = {
        "block_count": lambda: w.add_block_count(c.num_hidden_layers),
        "context_length": lambda: w.add_context_length(c.max_position_embeddings),
        "embedding_length": lambda: w.add_embedding_length(c.hidden_size),
        "feed_forward_length": lambda: w.add_feed_forward_length(c.intermediate_size),
        "expert_feed_forward_length": lambda: w.add_expert_feed_forward_length(c.moe_intermediate_size),
        "expert_count": lambda: w.add_expert_count(c.num_experts),
        "expert_used_count": lambda: w.add_expert_used_count(c.num_experts_per_tok),
        "attention.head_count": lambda: w.add_head_count(c.num_attention_heads),
        "attention.head_count_kv": lambda: w.add_head_count_kv(c.num_key_value_heads),
        "attention.key_length": lambda: w.add_key_length(c.head_dim),
        "attention.value_length": lambda: w.add_value_length(c.head_dim),
        "attention.layer_norm_rms_epsilon": lambda: w.add_layer_norm_rms_eps(c.rms_norm_eps),
        "rope.freq_base": lambda: w.add_rope_freq_base(c.rope_parameters["rope_theta"]),
    }
    for key, add in keys.items():
        if key not in skip_keys:
            add()
    byte_chars = list(bytes_to_unicode().values())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(byte_chars[: c.vocab_size - 3] + ["ab", "<|endoftext|>", "<|im_end|>"])  # "a" is 64, "b" 65
    w.add_token_types([1] * (c.vocab_size - 2) + [3, 3])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(c.vocab_size - 1)
    held = {}
    for name, arr in gguf_tensors(ref).items():
        if name in skip_tensors:
            continue
        kind = name.split(".")[-2]
        qtype = (types or {}).get(kind, Q.F32)
        data = random_k_quant(arr.shape, qtype, seed=len(held)) if qtype in (Q.Q4_K, Q.Q6_K) else None
        held[name] = add_quantized(w, name, arr, qtype, data)
    finish(w)
    return held


def with_weights(ref: transformers.Qwen3MoeForCausalLM, held: dict[str, np.ndarray]) -> None:
    """Give the transformers model the weights a (quantized) file holds, through transformers' own fused layout."""
    n_experts, inter = ref.config.num_experts, ref.config.moe_intermediate_size
    sd = ref.state_dict()
    new = {"model.embed_tokens.weight": held["token_embd.weight"], "model.norm.weight": held["output_norm.weight"],
           "lm_head.weight": held.get("output.weight", held["token_embd.weight"])}
    for i in range(ref.config.num_hidden_layers):
        for g, h in BLOCK.items():
            if "{e}" not in h:
                new[f"model.layers.{i}.{h}.weight"] = held[f"blk.{i}.{g}.weight"]
        gate_up = np.concatenate([held[f"blk.{i}.ffn_gate_exps.weight"], held[f"blk.{i}.ffn_up_exps.weight"]], 1)
        new[f"model.layers.{i}.mlp.experts.gate_up_proj"] = gate_up
        new[f"model.layers.{i}.mlp.experts.down_proj"] = held[f"blk.{i}.ffn_down_exps.weight"]
        assert gate_up.shape == tuple(sd[f"model.layers.{i}.mlp.experts.gate_up_proj"].shape) == (
            n_experts, 2 * inter, ref.config.hidden_size)
    with torch.no_grad():
        for k, v in new.items():
            sd[k].copy_(torch.from_numpy(v))


IDS = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("quantized, tied", [(False, False), (True, True)], ids=["f32", "quantized-tied"])
def test_qwen3moe_gguf_matches_transformers(tmp_path, quantized, tied):
    """The GGUF through our loader gives transformers' logits at 1e-4: F32 as written, and a quantized file (Q8_0,
    Q4_0, Q4_1 experts; F16 router; BF16, Q4_0, Q8_0 attention; tied head) against transformers holding the same
    dequantized weights. Every expert's projections are its own: a swap of two experts or of gate and up fails."""
    ref = hf_qwen3_moe(seed=1, tied=tied)
    path = tmp_path / "tiny-qwen3moe.gguf"
    held = write_qwen3moe_gguf(path, ref, QUANTIZED if quantized else None)
    lm = load_model(path, dtype=torch.float32)
    ours = lm.model
    assert type(ours).__name__ == "Qwen3MoeForCausalLM" and all(isinstance(x.mlp, MoE) for x in ours.model.layers)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tied
    if quantized:
        unquantized = plain_logits(ours, IDS)  # (not ours: the file's weights are not the reference's now)
        with torch.no_grad():
            gap = (unquantized - ref(IDS).logits).abs().max().item()
            cos = torch.nn.functional.cosine_similarity(unquantized.flatten(), ref(IDS).logits.flatten(), 0).item()
        assert gap > 1e-2 and cos > 0.9  # quantization moved the logits, a little
        with_weights(ref, held)
    sd = ours.state_dict()
    for i in range(CONFIG["num_hidden_layers"]):
        router = torch.from_numpy(held[f"blk.{i}.ffn_gate_inp.weight"])
        assert torch.equal(sd[f"model.layers.{i}.mlp.gate.weight"], router)
        for e in range(CONFIG["num_experts"]):
            for proj in ("gate", "up", "down"):
                want = torch.from_numpy(held[f"blk.{i}.ffn_{proj}_exps.weight"][e])
                assert torch.equal(sd[f"model.layers.{i}.mlp.experts.{e}.{proj}_proj.weight"], want), (i, e, proj)
    with torch.no_grad():
        want = ref(IDS).logits
    assert want.std() > 0.3
    assert (plain_logits(ours, IDS) - want).abs().max().item() <= 1e-4
    # the vocabulary came along: byte-level BPE (one merge), <|im_end|> (id 100) the end of a turn
    assert lm.tokenizer is not None and lm.tokenizer.encode("abba") == [98, 65, 64]
    assert lm.tokenizer.eos_token_ids == (100,) and lm.config.eos_token_ids == (100,)


def test_k_quant_experts(tmp_path):
    """Q4_K gate/up and Q6_K down experts (256-element super-blocks, dequantized by gguf.quants, one expert's rows at a
    time): each expert's tensor is its rows of the file, and the logits are transformers' with those weights."""
    ref = hf_qwen3_moe(seed=2, hidden_size=256, moe_intermediate_size=256, num_experts=4, num_experts_per_tok=2,
                       num_hidden_layers=2)
    path = tmp_path / "k.gguf"
    held = write_qwen3moe_gguf(path, ref, {"ffn_gate_exps": Q.Q4_K, "ffn_up_exps": Q.Q4_K, "ffn_down_exps": Q.Q6_K})
    with_weights(ref, held)
    ours = load_model(path, dtype=torch.float32).model
    sd = ours.state_dict()
    for e in range(4):
        for proj in ("gate", "up", "down"):
            want = torch.from_numpy(held[f"blk.1.ffn_{proj}_exps.weight"][e])
            assert torch.equal(sd[f"model.layers.1.mlp.experts.{e}.{proj}_proj.weight"], want)
    assert held["blk.1.ffn_down_exps.weight"].std() > 1e-3  # not all zeros
    with torch.no_grad():
        want = ref(IDS).logits
    assert want.std() > 0.3 and (plain_logits(ours, IDS) - want).abs().max().item() <= 1e-4


def test_expert_order_matters(tmp_path):
    """The check above has teeth: the same file with two experts' rows exchanged in one layer (or gate and up) gives
    other logits."""
    ref = hf_qwen3_moe(seed=1)
    good = tmp_path / "good.gguf"
    write_qwen3moe_gguf(good, ref)
    base = plain_logits(load_model(good, dtype=torch.float32).model, IDS)
    for swap in ("experts", "gate-up"):
        with torch.no_grad():
            experts = ref.model.layers[1].mlp.experts
            if swap == "experts":
                experts.gate_up_proj[[2, 5]] = experts.gate_up_proj[[5, 2]].clone()
                experts.down_proj[[2, 5]] = experts.down_proj[[5, 2]].clone()
            else:
                experts.gate_up_proj.copy_(experts.gate_up_proj.roll(CONFIG["moe_intermediate_size"], dims=1))
        path = tmp_path / f"{swap}.gguf"
        write_qwen3moe_gguf(path, ref)
        assert (plain_logits(load_model(path, dtype=torch.float32).model, IDS) - base).abs().max().item() > 1e-2


def test_qwen3moe_gguf_config_equals_the_hf_config(tmp_path):
    ref = hf_qwen3_moe()
    path = tmp_path / "cfg.gguf"
    write_qwen3moe_gguf(path, ref)
    cfg = load_model(path, dtype=torch.float32).config
    want = transformers.Qwen3MoeConfig(**CONFIG)
    assert cfg.architecture == "Qwen3MoeForCausalLM" and cfg.model_type == "qwen3_moe"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings) == (
        want.hidden_size, want.num_hidden_layers, want.num_attention_heads, want.num_key_value_heads, want.head_dim,
        want.intermediate_size, want.vocab_size, want.max_position_embeddings)
    assert cfg.rope.theta == 1e6 and cfg.rms_norm_eps == pytest.approx(1e-6) and not cfg.tie_word_embeddings
    moe = cfg.moe
    assert (moe.n_routed_experts, moe.num_experts_per_tok, moe.moe_intermediate_size, moe.norm_topk_prob) == (
        want.num_experts, want.num_experts_per_tok, want.moe_intermediate_size, True)
    assert (moe.scoring_func, moe.topk_method, moe.n_shared_experts, moe.decoder_sparse_step, moe.mlp_only_layers) == (
        "softmax", "greedy", 0, 1, ())


def test_converted_folder_loads_in_transformers(tmp_path):
    """`eaglespec convert` of a qwen3moe GGUF: a folder transformers itself loads (our config dict in its spelling, one
    tensor per expert) and runs to the original's logits."""
    from eaglespec.loading.convert import convert_gguf

    ref = hf_qwen3_moe(seed=3)
    path = tmp_path / "conv.gguf"
    write_qwen3moe_gguf(path, ref)
    out = convert_gguf(path, tmp_path / "hf")
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(back).__name__ == "Qwen3MoeForCausalLM" and back.config.norm_topk_prob is True
    with torch.no_grad():
        assert (back(IDS).logits - ref(IDS).logits).abs().max().item() <= 1e-4


def test_expert_size_without_its_key_comes_from_the_tensors(tmp_path):
    """llama.cpp reads `expert_feed_forward_length` as optional; without it the stacked gate tensor gives the size."""
    path = tmp_path / "nokey.gguf"
    write_qwen3moe_gguf(path, hf_qwen3_moe(), skip_keys=("expert_feed_forward_length", "feed_forward_length"))
    cfg = GGUFFile(path).hf_config()
    assert cfg["moe_intermediate_size"] == 32 and cfg["num_experts"] == 8 and cfg["norm_topk_prob"] is True


@pytest.mark.parametrize("key", ["expert_count", "expert_used_count", "block_count"])
def test_missing_metadata_is_named(tmp_path, key):
    path = tmp_path / f"no-{key}.gguf"
    write_qwen3moe_gguf(path, hf_qwen3_moe(), skip_keys=(key,))
    with pytest.raises(ConfigError, match=f"lacks the GGUF metadata field 'qwen3moe.{key}'"):
        load_model(path)


@pytest.mark.parametrize("tensor, named", [("blk.1.ffn_gate_inp.weight", "model.layers.1.mlp.gate.weight"),
                                           ("blk.2.ffn_up_exps.weight", "model.layers.2.mlp.experts.0.up_proj.weight")])
def test_missing_tensor_is_named(tmp_path, tensor, named):
    path = tmp_path / "missing.gguf"
    write_qwen3moe_gguf(path, hf_qwen3_moe(), skip_tensors=(tensor,))
    with pytest.raises(CheckpointError, match=f"lacks \\d+ weights the model needs: {named}"):
        load_model(path)


def test_experts_in_a_qwen3_gguf_are_refused(tmp_path):
    """A dense architecture's file with expert_count set (not a layout llama.cpp writes): refused by name (a `llama`
    one is Mixtral, tests/test_mixtral.py)."""
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_expert_count(8)
    w.add_expert_used_count(2)
    w.add_tensor("token_embd.weight", np.zeros((10, 64), np.float32))
    finish(w)
    with pytest.raises(ConfigError, match="a 'qwen3' GGUF with experts \\(qwen3.expert_count 8\\) is not supported"):
        load_model(path)
