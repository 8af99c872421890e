"""Drafter checkpoints in the published EAGLE-3 format: round trip, variants, and every mismatch error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny import tiny_drafter, tiny_llama

from eaglespec.api import load_drafter
from eaglespec.config import SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import ConfigError, DrafterMismatchError
from eaglespec.layers.context import ForwardContext
from eaglespec.loading.safetensors_io import load_safetensors, save_safetensors


def write_published(folder: Path, drafter, target_hidden: int, aux=(1, 2, 3), prefix: str = "",
                    with_head: bool = True, **cfg_over) -> Path:
    """config.json + model.safetensors exactly as SGLang/vLLM read them (unprefixed names, d2t/t2d, eagle_config)."""
    c = drafter.config
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope.theta, "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size, "target_hidden_size": target_hidden, "tie_word_embeddings": False,
        "num_hidden_layers": 1, "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux), "use_aux_hidden_state": True},
    }
    if c.eagle.draft_vocab_size is not None:
        cfg["draft_vocab_size"] = c.eagle.draft_vocab_size
    cfg.update(cfg_over)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    sd = {k: v for k, v in drafter.state_dict().items() if not k.startswith("embed_tokens")}
    if not with_head:
        sd = {k: v for k, v in sd.items() if k not in ("lm_head.weight", "d2t", "t2d")}
    save_safetensors({prefix + k: v.contiguous() for k, v in sd.items()}, folder / "model.safetensors")
    return folder


def drafter_logits(d, target):
    d.set_embed_and_head(*target.get_embed_and_head())
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    hid = torch.randn(2, 7, 3 * 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, h = d(ids, hid, ForwardContext.plain(2, 7), from_target=True)
    return logits, h


@pytest.fixture()
def target():
    return tiny_llama()


def test_round_trip_identical_logits(target, tmp_path):
    d = tiny_drafter(target)
    folder = write_published(tmp_path / "d", d, 64)
    names = set(load_safetensors(folder / "model.safetensors"))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names
    assert not any(n.startswith("embed_tokens") for n in names)
    loaded = load_drafter(folder, "cpu", torch.float32)
    assert loaded.config.eagle.aux_layer_ids == (1, 2, 3)
    assert torch.equal(loaded.d2t, d.d2t) and torch.equal(loaded.t2d, d.t2d)
    a, b = drafter_logits(d, target), drafter_logits(loaded, target)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_prefixed_names_and_full_vocab_variant(target, tmp_path):
    d = tiny_drafter(target, draft_vocab=None)
    folder = write_published(tmp_path / "d", d, 64, prefix="model.", with_head=False)
    loaded = load_drafter(folder, "cpu", torch.float32)
    assert not loaded.has_own_head
    eng = Engine(target, None, drafter=loaded, spec=SpecConfig(3, 2, 5))
    assert loaded.lm_head.weight is target.lm_head.weight
    assert torch.equal(loaded.d2t, torch.zeros(97, dtype=torch.int64))
    assert eng.generate([[1, 2, 3]])[0].token_ids


def test_not_a_drafter(target, tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**{k: v for k, v in target.config.raw.items()}}))
    save_safetensors({k: v.contiguous() for k, v in target.state_dict().items()}, folder / "model.safetensors")
    with pytest.raises(ConfigError, match="is not an EAGLE-3 drafter"):
        load_drafter(folder, "cpu", torch.float32)


def test_hidden_size_mismatch(target, tmp_path):
    d = tiny_drafter(target)
    bad = tiny_llama(hidden=32)
    with pytest.raises(DrafterMismatchError, match="target_hidden_size 64 but the target's hidden size is 32"):
        Engine(bad, None, drafter=d, spec=SpecConfig(3, 1, 4))


def test_vocab_mismatch(target):
    d = tiny_drafter(target)
    bad = tiny_llama(vocab=120)
    with pytest.raises(DrafterMismatchError, match="vocab_size is 97 but the target's vocabulary has 120"):
        Engine(bad, None, drafter=d, spec=SpecConfig(3, 1, 4))


def test_aux_layers_outside_target(target, tmp_path):
    d = tiny_drafter(target)
    folder = write_published(tmp_path / "d", d, 64, aux=(1, 3, 40))
    loaded = load_drafter(folder, "cpu", torch.float32)
    with pytest.raises(DrafterMismatchError, match=r"aux layer ids \[1, 3, 40\] include \[40\], outside the target's 6"):
        Engine(target, None, drafter=loaded, spec=SpecConfig(3, 1, 4))


def test_aux_layer_count_mismatch(target, tmp_path):
    d = tiny_drafter(target)
    folder = write_published(tmp_path / "d", d, 64, aux=(1, 3))
    loaded = load_drafter(folder, "cpu", torch.float32)
    with pytest.raises(DrafterMismatchError, match="fc takes 3 aux layers but 2 aux layer ids"):
        Engine(target, None, drafter=loaded, spec=SpecConfig(3, 1, 4))


def test_vllm_aux_convention(target, tmp_path):
    """vLLM reads id k as 'after k layers': under that switch the same ids capture one layer earlier."""
    from eaglespec.config import EngineConfig

    d = tiny_drafter(target)
    folder = write_published(tmp_path / "d", d, 64, aux=(2, 3, 6))
    with pytest.raises(DrafterMismatchError, match="outside the target's 6 layers"):
        Engine(target, None, drafter=load_drafter(folder, "cpu", torch.float32), spec=SpecConfig(3, 1, 4))
    eng = Engine(target, None, EngineConfig(aux_convention="vllm"),
                 drafter=load_drafter(folder, "cpu", torch.float32), spec=SpecConfig(3, 1, 4))
    assert eng.aux_layer_ids == (1, 2, 5)
    ids = torch.randint(0, 97, (1, 5))
    with torch.no_grad():
        vllm_aux = target(ids, ForwardContext.plain(1, 5)).aux_hidden
        target.set_eagle3_layers_to_capture([1, 2, 5])
        assert torch.equal(vllm_aux, target(ids, ForwardContext.plain(1, 5)).aux_hidden)
