"""Multi-layer EAGLE-3 drafters (vLLM's llama_eagle3 since vllm-project/vllm#26164, speculators' Eagle3DraftModel):
the first layer takes the embedding and the hidden, layers 1..N-1 are plain Llama decoder layers, each with its own KV
cache. Greedy speculation with them equals plain greedy decoding (eager, and with the later layers on the folded-norm
path that CUDA engines run); checkpoints load under vLLM's names; mistakes are named."""

from __future__ import annotations

import json

import pytest
import torch
from test_drafter_checkpoint import drafter_logits, write_published
from test_norm_fold import with_norm_weights
from tiny import tiny_drafter, tiny_llama

from eaglespec.api import load_drafter
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.transforms import fold_norms, fuse_projections, use_norm_linear_kernel, use_rope_store_kernel
from eaglespec.errors import CheckpointError
from eaglespec.loading import load_safetensors, save_safetensors
from eaglespec.models.base import PreNormDecoderLayer
from eaglespec.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40)), [5]]
PARAMS = SamplingParams(max_new_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def reference(target):
    return [o.token_ids for o in Engine(target, None).generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)], ids=["chain", "tree"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_spec_equals_plain(target, reference, layers, spec, batch):
    drafter = tiny_drafter(target, seed=1, num_hidden_layers=layers)
    assert drafter.num_layers == layers and sorted(drafter.layers) == [str(i) for i in range(1, layers)]
    eng = Engine(target, None, EngineConfig(), drafter=drafter, spec=spec)
    outs = eng.generate(PROMPTS[:batch], PARAMS)
    assert [o.token_ids for o in outs] == reference[:batch]
    assert eng.runner.dkv.num_layers == layers  # a cache per drafter layer
    assert eng.stats.verify_steps > 0


def test_later_layers_on_the_folded_path_equal_the_module(target, reference, monkeypatch):
    """The drafter's later layers prepared as CUDA engines prepare them (fused projections, norms folded into them,
    the fused few-row kernel's limit at 0 so that every step takes the folded path, which updates its input in place)
    still draft what the plain drafter drafts: equal acceptance, and greedy output equal to plain decoding."""
    prompts, params = PROMPTS[:2], SamplingParams(max_new_tokens=12, ignore_eos=True)  # the interpreter is slow
    want = [r[:12] for r in reference[:2]]
    plain = with_norm_weights(tiny_drafter(target, seed=1, num_hidden_layers=3), seed=5)
    spec = SpecConfig(4, 2, 6)
    eng = Engine(target, None, drafter=plain, spec=spec)
    assert [o.token_ids for o in eng.generate(prompts, params)] == want
    tau = eng.stats.accept_length_mean

    wired = with_norm_weights(tiny_drafter(target, seed=1, num_hidden_layers=3), seed=5)
    fold_norms(use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(wired)), max_rows=0))
    assert all(layer.folded_norms for layer in wired.layers.values())
    calls: list[int] = []
    folded = PreNormDecoderLayer._forward_folded
    monkeypatch.setattr(PreNormDecoderLayer, "_forward_folded", lambda self, *a: calls.append(1) or folded(self, *a))
    eng = Engine(target, None, drafter=wired, spec=spec)
    assert [o.token_ids for o in eng.generate(prompts, params)] == want
    assert len(calls) > 10 and eng.stats.accept_length_mean == pytest.approx(tau, abs=1e-9)


def test_checkpoint_under_vllms_names(target, tmp_path):
    """midlayer.* (or layers.0.*) and layers.1.*, layers.2.*: the same drafter back, equal logits; a later layer's
    hidden_norm (vLLM builds one in every layer and runs only the first's) is ignored; a missing later-layer weight
    is named."""
    d = tiny_drafter(target, seed=1, num_hidden_layers=3)
    folder = write_published(tmp_path / "ours", d, 64, aux=(1, 2, 4), num_hidden_layers=3)
    names = set(load_safetensors(folder / "model.safetensors"))
    assert {"midlayer.self_attn.q_proj.weight", "layers.1.self_attn.q_proj.weight",
            "layers.2.mlp.down_proj.weight"} <= names
    tensors = load_safetensors(folder / "model.safetensors")
    tensors["layers.1.hidden_norm.weight"] = torch.ones(64)
    save_safetensors(tensors, folder / "model.safetensors")
    loaded = load_drafter(folder, "cpu", torch.float32)
    assert loaded.num_layers == 3
    (la, ha), (lb, hb) = drafter_logits(loaded, target), drafter_logits(d, target)
    assert torch.equal(la, lb) and torch.equal(ha, hb)
    one = tiny_drafter(target, seed=1)  # the same first layer alone drafts something else
    assert (drafter_logits(one, target)[0] - la).abs().max() > 1e-2

    del tensors["layers.2.mlp.down_proj.weight"]
    save_safetensors(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"layers\.2\.mlp\.down_proj\.weight"):
        load_drafter(folder, "cpu", torch.float32)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3
