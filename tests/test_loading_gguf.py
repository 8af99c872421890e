"""GGUF loading: the real SmolLM2 against transformers (logits, greedy generation), tiny GGUFs written here for the
quantization types, the q/k un-permutation and the errors."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf_write import finish, llama_cpp_permute, quantize_k
from tiny import plain_logits

from eaglespec.errors import CheckpointError, ConfigError
from eaglespec.loading import GGUFFile, load_model
from eaglespec.loading.gguf_names import expert_names, gguf_to_hf_name, unpermute_qk

MT_BENCH = Path(__file__).resolve().parents[1] / "src" / "eaglespec" / "assets" / "mt_bench_question.jsonl"


DEFAULT_TYPES = {
    "token_embd": Q.Q8_0, "output": Q.F16, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.F16,
    "attn_output": Q.BF16, "ffn_gate": Q.Q8_0, "ffn_up": Q.F32, "ffn_down": Q.Q4_0,
}


def write_tiny_gguf(
    path: Path, types: dict[str, Q] | None = None, arch: str = "llama", hidden: int = 64, heads: int = 4,
    kv_heads: int = 2, ffn: int = 96, layers: int = 2, vocab: int = 64, tied: bool = False, head_dim: int | None = None,
    split_max_tensors: int = 0, extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> dict[str, np.ndarray]:
    """A random GGUF (no tokenizer) of llama.cpp's `llama` layout (q/k permuted), or its `qwen2` (q/k/v biases) or
    `qwen3` (per-head q/k norms) layouts (q/k as in HF); returns the HF-layout float32 weights before quantization."""
    rng = np.random.default_rng(0)
    types = {**DEFAULT_TYPES, **(types or {})}
    hd = head_dim or hidden // heads
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)  # > 0: PATH-0000i-of-0000n.gguf shards
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(vocab)
    if extra is not None:  # more metadata (a vocabulary, say)
        extra(w)
    originals: dict[str, np.ndarray] = {}

    def put(name: str, shape: tuple[int, ...], kind: str | None = None, norm: bool = False) -> None:
        arr = (1.0 if norm else 0.0) + (rng.standard_normal(shape) * 0.2).astype(np.float32)
        originals[name] = arr.astype(np.float32)
        data = arr.astype(np.float32)
        if kind == "attn_q" and arch == "llama":
            data = llama_cpp_permute(data, heads)
        if kind == "attn_k" and arch == "llama":
            data = llama_cpp_permute(data, kv_heads)
        qtype = types.get(kind or "", Q.F32)
        try:
            raw = (quantize_k(data, qtype) if qtype.name in ("Q4_K", "Q5_K", "Q6_K")
                   else gguf.quants.quantize(data, qtype))  # K-quants: gguf cannot write them
        except NotImplementedError:  # a type the package cannot write (Q8_1): zero blocks of its size
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((*data.shape[:-1], data.shape[-1] // block * size), np.uint8)
        w.add_tensor(name, raw, raw_dtype=qtype)

    put("token_embd.weight", (vocab, hidden), "token_embd")
    put("output_norm.weight", (hidden,), norm=True)
    if not tied:
        put("output.weight", (vocab, hidden), "output")
    for i in range(layers):
        put(f"blk.{i}.attn_norm.weight", (hidden,), norm=True)
        put(f"blk.{i}.attn_q.weight", (heads * hd, hidden), "attn_q")
        put(f"blk.{i}.attn_k.weight", (kv_heads * hd, hidden), "attn_k")
        put(f"blk.{i}.attn_v.weight", (kv_heads * hd, hidden), "attn_v")
        put(f"blk.{i}.attn_output.weight", (hidden, heads * hd), "attn_output")
        if arch == "qwen2":
            for proj, rows in (("attn_q", heads * hd), ("attn_k", kv_heads * hd), ("attn_v", kv_heads * hd)):
                put(f"blk.{i}.{proj}.bias", (rows,))
        if arch == "qwen3":
            put(f"blk.{i}.attn_q_norm.weight", (hd,), norm=True)
            put(f"blk.{i}.attn_k_norm.weight", (hd,), norm=True)
        put(f"blk.{i}.ffn_norm.weight", (hidden,), norm=True)
        put(f"blk.{i}.ffn_gate.weight", (ffn, hidden), "ffn_gate")
        put(f"blk.{i}.ffn_up.weight", (ffn, hidden), "ffn_up")
        put(f"blk.{i}.ffn_down.weight", (hidden, ffn), "ffn_down")
    finish(w)
    return originals


# --- the real SmolLM2 ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_smollm2(smollm2_gguf: Path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


def test_smollm2_config_from_gguf_metadata(smollm2):
    c = smollm2.config
    assert c.architecture == "LlamaForCausalLM" and c.model_type == "llama"
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (30, 576, 9, 3)
    assert (c.head_dim, c.intermediate_size, c.vocab_size) == (64, 1536, 49152)
    assert c.rope.theta == 100000.0 and c.rope.type == "default"
    assert c.rms_norm_eps == pytest.approx(1e-5)
    assert c.max_position_embeddings == 8192
    assert c.tie_word_embeddings
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)


def test_smollm2_weights_are_tied_and_materialized(smollm2):
    m = smollm2.model
    embed, head = m.get_embed_and_head()
    assert embed is head  # tied: one live tensor
    assert not any(p.is_meta for p in m.parameters()) and not any(b.is_meta for b in m.buffers())
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in m.parameters())
    assert not m.training


def test_smollm2_logits_match_transformers(smollm2, hf_smollm2):
    tok = smollm2.tokenizer
    ids = torch.tensor([tok.encode("The capital of France is Paris. The capital of Italy is")])
    ours = plain_logits(smollm2.model, ids)
    with torch.no_grad():
        ref = hf_smollm2(ids).logits
    assert ours.shape == ref.shape == (1, ids.shape[1], 49152)
    assert (ours - ref).abs().max().item() <= 1e-4
    assert tok.decode([int(ours[0, -1].argmax())]).strip() == "Rome"


def test_smollm2_greedy_matches_transformers_generate(smollm2, hf_smollm2):
    """32 greedy tokens on 3 MT-bench prompts (chat template applied), token for token.

    transformers generates for the 3 prompts in one left-padded batch. Our side is checked by teacher forcing: one
    causal forward over prompt + transformers' tokens, whose argmax at every position must be the next token. That
    holds iff our own greedy loop would produce exactly those tokens (each greedy step sees the same prefix), at the
    cost of one forward instead of 32.
    """
    tok = smollm2.tokenizer
    questions = [json.loads(line) for line in MT_BENCH.read_text().splitlines()[:3]]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}])) for q in questions]
    n = max(map(len, prompts))
    pad = tok.pad_token_id
    x = torch.tensor([[pad] * (n - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf_smollm2.generate(x, attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=pad)
    for q, ids, row in zip(questions, prompts, out):
        ref = row[n:].tolist()
        if tok.eos_token_id in ref:  # finished early: the rest is padding
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        logits = plain_logits(smollm2.model, torch.tensor([ids + ref]))[0]
        ours = logits[len(ids) - 1 : -1].argmax(-1).tolist()
        assert ours == ref, (q["question_id"], tok.decode(ours), tok.decode(ref))
        assert len(ref) == 32 or ref[-1] == tok.eos_token_id


# --- tiny GGUFs written here -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


def test_tiny_gguf_all_quant_types_match_transformers(tiny_gguf):
    from transformers import AutoModelForCausalLM

    path, originals = tiny_gguf
    ours = load_model(path, dtype=torch.float32)
    assert ours.tokenizer is None  # the file carries no vocabulary
    assert not ours.config.tie_word_embeddings
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids).logits
    assert (plain_logits(ours.model, ids) - expected).abs().max().item() <= 1e-4
    # Independently of transformers: the un-permuted q/k are the HF-layout originals up to quantization error, and
    # the F32 tensors are exact.
    sd = ours.model.state_dict()
    q = originals["blk.0.attn_q.weight"]
    k = originals["blk.1.attn_k.weight"]
    assert np.abs(sd["model.layers.0.self_attn.q_proj.weight"].numpy() - q).max() < 0.1 * np.abs(q).max()
    assert np.abs(sd["model.layers.1.self_attn.k_proj.weight"].numpy() - k).max() < 0.1 * np.abs(k).max()
    assert np.array_equal(sd["model.layers.1.mlp.up_proj.weight"].numpy(), originals["blk.1.ffn_up.weight"])
    assert np.array_equal(sd["model.norm.weight"].numpy(), originals["output_norm.weight"])


def test_tiny_gguf_loads_in_bfloat16(tiny_gguf):
    path, _ = tiny_gguf
    m = load_model(path, dtype=torch.bfloat16).model
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    assert m.model.rotary.inv_freq.dtype == torch.float32 and not m.model.rotary.inv_freq.is_meta
    assert torch.isfinite(plain_logits(m, torch.tensor([[1, 2, 3]])).float()).all()


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)  # 3 heads of dim 4
    assert np.array_equal(unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    b = np.arange(12, dtype=np.float32)  # a bias is permuted the same way
    assert np.array_equal(unpermute_qk(llama_cpp_permute(b, 3), 3), b)


def test_gguf_name_table():
    assert gguf_to_hf_name("token_embd.weight") == ("model.embed_tokens.weight", None)
    assert gguf_to_hf_name("output.weight") == ("lm_head.weight", None)
    assert gguf_to_hf_name("blk.12.attn_q.weight") == ("model.layers.12.self_attn.q_proj.weight", "q")
    assert gguf_to_hf_name("blk.3.attn_k.weight") == ("model.layers.3.self_attn.k_proj.weight", "k")
    assert gguf_to_hf_name("blk.3.attn_output.weight")[0] == "model.layers.3.self_attn.o_proj.weight"
    assert gguf_to_hf_name("blk.0.ffn_norm.weight")[0] == "model.layers.0.post_attention_layernorm.weight"
    assert gguf_to_hf_name("blk.4.ffn_gate_inp.weight") == ("model.layers.4.mlp.gate.weight", None)
    assert gguf_to_hf_name("blk.4.ffn_up_exps.weight") == ("model.layers.4.mlp.experts.{e}.up_proj.weight", "experts")
    assert expert_names(gguf_to_hf_name("blk.4.ffn_down_exps.weight")[0], 2) == [
        "model.layers.4.mlp.experts.0.down_proj.weight", "model.layers.4.mlp.experts.1.down_proj.weight"]
    with pytest.raises(CheckpointError, match="blk.0.ssm_a"):
        gguf_to_hf_name("blk.0.ssm_a")


def test_unsupported_tensor_type_is_named(tmp_path):
    path = tmp_path / "q8_1.gguf"
    write_tiny_gguf(path, types={"ffn_up": Q.Q8_1})  # llama.cpp's activation type, never a model's weights
    with pytest.raises(CheckpointError) as e:
        load_model(path)
    msg = str(e.value)
    assert "blk.0.ffn_up.weight" in msg and "Q8_1" in msg and "Q5_K, Q6_K, IQ1_S" in msg and str(path) in msg


def test_tiny_gguf_with_q5_types_matches_transformers(tmp_path):
    """Q5_0 / Q5_1 (in llama.cpp's Q5 mixes) through gguf.quants, against transformers' reading of the same file."""
    from transformers import AutoModelForCausalLM

    path = tmp_path / "q5.gguf"
    write_tiny_gguf(path, types={"attn_q": Q.Q5_0, "attn_k": Q.Q5_1, "ffn_gate": Q.Q5_1, "ffn_down": Q.Q5_0})
    ours = load_model(path, dtype=torch.float32)
    assert {t.qtype.name for t in GGUFFile(path).tensors} >= {"Q5_0", "Q5_1"}
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids).logits
    assert (plain_logits(ours.model, ids) - expected).abs().max().item() <= 1e-4


def test_split_gguf_loads_from_any_shard(tmp_path, tiny_gguf):
    """llama.cpp's split files: the metadata in the first shard, the tensors over all three; the same model as the
    whole file, whichever shard is named."""
    whole, _ = tiny_gguf
    write_tiny_gguf(tmp_path / "m.gguf", split_max_tensors=8)
    shards = sorted(tmp_path.glob("m-*-of-00003.gguf"))
    assert [p.name for p in shards] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    from eaglespec.loading.gguf_header import read_header

    assert "llama.block_count" in read_header(shards[0]).metadata  # the model's keys in the first shard only
    assert "llama.block_count" not in read_header(shards[2]).metadata
    assert GGUFFile(shards[2]).metadata["llama.block_count"] == 2
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    want = plain_logits(load_model(whole, dtype=torch.float32).model, ids)
    for shard in (shards[0], shards[2]):
        g = GGUFFile(shard)
        assert g.shards == shards and len(g.tensors) == len(GGUFFile(whole).tensors) == 21
        assert torch.equal(plain_logits(load_model(shard, dtype=torch.float32).model, ids), want)


def test_split_gguf_problems_are_named(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", split_max_tensors=8)
    (tmp_path / "m-00002-of-00003.gguf").rename(tmp_path / "m-2.gguf")
    with pytest.raises(CheckpointError, match="m-00001-of-00003.gguf is one of 3 shards of a split GGUF, and "
                                              "m-00002-of-00003.gguf is not beside it"):
        load_model(tmp_path / "m-00001-of-00003.gguf")
    (tmp_path / "m-00003-of-00003.gguf").rename(tmp_path / "renamed.gguf")
    with pytest.raises(CheckpointError, match="renamed.gguf is one of 3 shards of a split GGUF \\(split.count 3\\), "
                                              "but its name does not say where the others are"):
        load_model(tmp_path / "renamed.gguf")
    (tmp_path / "m-2.gguf").rename(tmp_path / "m-00003-of-00003.gguf")  # shard 2 where shard 3 belongs
    (tmp_path / "renamed.gguf").rename(tmp_path / "m-00002-of-00003.gguf")
    with pytest.raises(CheckpointError, match="m-00002-of-00003.gguf is not shard 2 of 3 \\(its split.no 2"):
        load_model(tmp_path / "m-00001-of-00003.gguf")


def test_unsupported_gguf_architecture(tmp_path):
    path = tmp_path / "other.gguf"
    write_tiny_gguf(path, arch="gemma")  # (Gemma 1: not supported)
    from eaglespec.loading.gguf_config import GGUF_ARCHITECTURES

    assert {"llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "deepseek2", "phi3", "glm4moe", "gpt-oss", "gemma2",
            "gemma3", "granite", "smollm3", "llama4", "olmo2", "olmoe", "ernie4_5", "exaone4",
            "glm4", "command-r", "cohere2"} == set(GGUF_ARCHITECTURES)
    listed = ", ".join(map(repr, GGUF_ARCHITECTURES))
    with pytest.raises(ConfigError, match=re.escape(f"GGUF architecture 'gemma' is not supported (only {listed}); "
                                                    "load the model's Hugging Face folder instead")):
        load_model(path)


@pytest.mark.parametrize("arch, kw", [("qwen2", dict(tied=True)), ("qwen3", dict(head_dim=128, hidden=256))])
def test_qwen_ggufs_match_transformers(tmp_path, arch, kw):
    """llama.cpp's `qwen2` (q/k/v biases) and `qwen3` (per-head q/k norms, head_dim from key_length) layouts, whose
    q/k are not permuted: the logits equal transformers' loading of the same file (quantized as the Llama one)."""
    from transformers import AutoModelForCausalLM

    path = tmp_path / f"{arch}.gguf"
    originals = write_tiny_gguf(path, arch=arch, **kw)
    ours = load_model(path, dtype=torch.float32)
    assert type(ours.model).__name__ == f"{arch.capitalize()}ForCausalLM"
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids).logits
    assert (plain_logits(ours.model, ids) - expected).abs().max().item() <= 1e-4
    sd = ours.model.state_dict()  # q as written: the HF layout, up to Q4_0's error
    q = originals["blk.0.attn_q.weight"]
    assert np.abs(sd["model.layers.0.self_attn.q_proj.weight"].numpy() - q).max() < 0.1 * np.abs(q).max()


def llama3_rope_factors(factor: float, theta: float, dim: int, original: int = 8192) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's converter writes for a Llama 3.1 config (low 1, high 4 frequency factors)."""
    out = []
    for freq in 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * np.pi / freq
        if wavelen < original / 4:
            out.append(1.0)
        elif wavelen > original:
            out.append(factor)
        else:
            smooth = (original / wavelen - 1) / 3
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_llama31_rope_freqs_are_its_llama3_scaling(tmp_path):
    """Llama 3.1 - 3.3 files: RoPE scaling as a `rope_freqs` tensor (16-dim heads at theta 10^4 over 8192 original
    positions: 6 high frequencies, one ramped, one scaled). Read back as the llama3 rope_scaling, the logits equal
    transformers' Llama with that scaling and the file's weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path / "llama31.gguf"
    factors = llama3_rope_factors(8.0, 10000.0, 16)
    assert list(factors[:6]) == [1.0] * 6 and 1 < factors[6] < 8 and factors[7] == 8
    originals = write_tiny_gguf(path, types={k: Q.F32 for k in DEFAULT_TYPES}, vocab=64,
                                extra=lambda w: w.add_tensor("rope_freqs.weight", factors))
    ours = load_model(path, dtype=torch.float32)
    rope = ours.config.rope
    assert (rope.type, rope.factor, rope.low_freq_factor, rope.high_freq_factor,
            rope.original_max_position_embeddings) == ("llama3", 8.0, 1.0, 4.0, 8192)
    scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192, rope_theta=10000.0)
    ref = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                       max_position_embeddings=128, rope_parameters=scaling,
                                       tie_word_embeddings=False)).eval()
    sd = ref.state_dict()
    with torch.no_grad():
        for name, arr in originals.items():
            sd[gguf_to_hf_name(name)[0]].copy_(torch.from_numpy(arr))
    ids = torch.randint(0, 64, (1, 120), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids).logits
    assert (plain_logits(ours.model, ids) - expected).abs().max().item() <= 1e-4
    bent = factors.copy()
    bent[6] *= 1.1  # not the ramp Llama 3's parameters give
    write_tiny_gguf(path, extra=lambda w: w.add_tensor("rope_freqs.weight", bent))
    with pytest.raises(ConfigError,
                       match="its rope_freqs factors are not Llama 3's or Llama 4's RoPE scaling \\(factor 8,"):
        load_model(path)


def test_corrupt_gguf(tmp_path, smollm2_gguf):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="garbage.gguf is not a readable GGUF file"):
        load_model(garbage)
    truncated = tmp_path / "truncated.gguf"
    with smollm2_gguf.open("rb") as f:
        truncated.write_bytes(f.read(2_000_000))  # metadata intact, tensor data cut off
    with pytest.raises(CheckpointError, match="truncated.gguf"):
        load_model(truncated)


def test_gguf_metadata_values(smollm2_gguf):
    g = GGUFFile(smollm2_gguf)
    assert g.architecture == "llama"
    assert g.metadata["tokenizer.ggml.model"] == "gpt2"
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 49152
    assert g.hf_config()["tie_word_embeddings"] is True
