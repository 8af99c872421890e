"""EAGLE-3.1 drafters (config.Eagle3Config: norm_before_fc, fc_norm, norm_output): read from config.json as the
engines that publish them write it, computed as a hand-written reference says, loaded and exported in the published
layout, trained through the same TTT path, and lossless in the engine."""

from __future__ import annotations

import json

import pytest
import torch
from test_drafter_checkpoint import write_published
from tiny import drafter_config, tiny_drafter, tiny_llama

from eaglespec.api import load_drafter
from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import CheckpointError, ConfigError
from eaglespec.layers.context import ForwardContext
from eaglespec.models.eagle3 import LlamaForCausalLMEagle3
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.drafter import (DrafterShape, calibrate_aux_norms, drafter_hf_config, new_drafter,
                                    renorm_drafter)
from eaglespec.train.export import export_drafter

VARIANTS = {  # name -> config flags
    "norm_before_fc+norm_output": dict(norm_before_fc=True, norm_output=True),  # speculators' "Eagle 3.1 (Llama)"
    "fc_norm+norm_output": dict(fc_norm=True, norm_output=True),  # the EAGLE-3.1 paper's
    "fc_norm": dict(fc_norm=True),
    "norm_output": dict(norm_output=True),
}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


def drafter31(target, flags: dict, seed: int = 1) -> LlamaForCausalLMEagle3:
    """A tiny drafter with `flags`, its norm weights away from 1 (so that a test sees them)."""
    d = tiny_drafter(target, seed=seed, **flags)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.startswith(("input_norm.", "fc_norm.", "norm.")):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return d


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_flags_are_read_at_the_top_level_or_in_eagle_config(target):
    plain = drafter_config(target.config).eagle
    assert not (plain.norm_before_fc or plain.fc_norm or plain.norm_output)
    top = drafter_config(target.config, norm_before_fc=True, norm_output=True).eagle
    assert top.norm_before_fc and top.norm_output and not top.fc_norm
    # NVIDIA's checkpoints keep them in eagle_config, which vLLM reads first
    nested = drafter_config(target.config, norm_output=False,
                            eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "fc_norm": True,
                                          "norm_output": True}).eagle
    assert nested.fc_norm and nested.norm_output and nested.aux_layer_ids == (1, 2, 3)
    with pytest.raises(ConfigError, match="both norm_before_fc .* and fc_norm .*: they are alternatives"):
        drafter_config(target.config, norm_before_fc=True, fc_norm=True)
    # vLLM speculators' format (the layer nested under transformer_layer_config) keeps them at its top level too
    # (speculators_config.py; its other fields: tests/test_speculators_format.py)
    spec = ModelConfig.from_hf({"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                                "draft_vocab_size": 8, "norm_before_residual": False, "norm_output": True,
                                "fc_norm": True, "transformer_layer_config": {
                                    "model_type": "llama", "hidden_size": 16, "num_attention_heads": 2,
                                    "num_hidden_layers": 1, "vocab_size": 32}}).eagle
    assert spec.fc_norm and spec.norm_output and not spec.norm_before_fc


@pytest.mark.parametrize("name", VARIANTS)
def test_forward_equals_eagle3_on_normalised_inputs(target, name):
    """Against a plain EAGLE-3 drafter with the same weights: the 3.1 drafter's logits equal the plain one's fed the
    aux states normalised by hand, and the hidden it hands the next step is norm(r) with norm_output (r without);
    then a second step on its own hidden agrees the same way."""
    flags = VARIANTS[name]
    d31 = drafter31(target, flags)
    d3 = tiny_drafter(target, seed=1)
    missing, unexpected = d3.load_state_dict(d31.state_dict(), strict=False)
    assert not missing and set(unexpected) == {n for n in d31.state_dict() if n.startswith(("input_norm.", "fc_norm."))}
    for d in (d31, d3):
        d.set_embed_and_head(*target.get_embed_and_head())
    Ht, eps = target.config.hidden_size, d31.config.rms_norm_eps
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, target.config.vocab_size, (2, 6), generator=g)
    aux = 3 * torch.randn(2, 6, 3 * Ht, generator=g)
    if flags.get("norm_before_fc"):
        aux_n = rms(aux, d31.input_norm.weight, eps)
    elif flags.get("fc_norm"):
        aux_n = torch.cat([rms(a, n.weight, eps) for a, n in zip(aux.split(Ht, -1), d31.fc_norm)], -1)
    else:
        aux_n = aux
    with torch.no_grad():
        l31, h31 = d31(ids, aux, ForwardContext.plain(2, 6), from_target=True)
        l3, h3 = d3(ids, aux_n, ForwardContext.plain(2, 6), from_target=True)
        torch.testing.assert_close(l31, l3, rtol=1e-5, atol=1e-5)
        expect = rms(h3, d3.norm.weight, eps) if flags.get("norm_output") else h3
        torch.testing.assert_close(h31, expect, rtol=1e-5, atol=1e-5)
        # the next step on its own hidden: the plain drafter given that same hidden computes the same logits
        l31b, h31b = d31(ids, h31, ForwardContext.plain(2, 6), from_target=False)
        l3b, h3b = d3(ids, h31, ForwardContext.plain(2, 6), from_target=False)
        torch.testing.assert_close(l31b, l3b, rtol=1e-5, atol=1e-5)
    assert (l31 - d3(ids, aux, ForwardContext.plain(2, 6), from_target=True)[0]).abs().max() > 1e-2 \
        or not (flags.get("norm_before_fc") or flags.get("fc_norm"))  # the input norms matter (not vacuous)


@pytest.mark.parametrize("name", ["norm_before_fc+norm_output", "fc_norm+norm_output"])
def test_published_checkpoint_round_trip(target, tmp_path, name):
    flags = VARIANTS[name]
    d = drafter31(target, flags)
    folder = write_published(tmp_path / "d", d, target.config.hidden_size, **flags)
    names = set(json.loads((folder / "config.json").read_text()))
    assert set(flags) <= names
    loaded = load_drafter(folder, "cpu", torch.float32)
    assert all(getattr(loaded.config.eagle, k) for k in flags)
    for n, t in d.state_dict().items():
        if not n.startswith("embed_tokens"):
            assert torch.equal(loaded.state_dict()[n], t), n
    # "model."-prefixed names, as some trainers write them, load too
    again = load_drafter(write_published(tmp_path / "p", d, target.config.hidden_size, prefix="model.", **flags),
                         "cpu", torch.float32)
    assert torch.equal(again.fc.weight, d.fc.weight)


def test_mismatched_flags_and_weights_are_named(target, tmp_path):
    d = drafter31(target, VARIANTS["fc_norm+norm_output"])
    # weights of the per-aux norms under a config without fc_norm: the weights are named, not ignored
    with pytest.raises(CheckpointError, match=r"3 weights the model does not use: .*fc_norm\.0\.weight"):
        load_drafter(write_published(tmp_path / "a", d, target.config.hidden_size, norm_output=True), "cpu",
                     torch.float32)
    plain = tiny_drafter(target, seed=1)
    with pytest.raises(CheckpointError, match=r"lacks 1 weights the model needs: input_norm\.weight"):
        load_drafter(write_published(tmp_path / "b", plain, target.config.hidden_size, norm_before_fc=True), "cpu",
                     torch.float32)


@pytest.mark.parametrize("name", ["norm_before_fc+norm_output", "fc_norm+norm_output"])
@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(4, 4, 8)], ids=["chain", "tree"])
def test_greedy_speculation_equals_plain(target, name, spec):
    prompts = [[1, 2, 3, 4, 5], list(range(10, 30)), [7]]
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    plain = [o.token_ids for o in Engine(target, None).generate(prompts, params)]
    eng = Engine(target, None, EngineConfig(), drafter=drafter31(target, VARIANTS[name]), spec=spec)
    assert [o.token_ids for o in eng.generate(prompts, params)] == plain
    assert eng.stats.verify_steps > 0


def test_the_cuda_wiring_keeps_speculation_lossless():
    """The drafter as CUDA wires it (fused projections, the MLP half's norm + projection kernel, the input kernel,
    the elementwise kernels; run here by Triton's interpreter, so on the drafter only): the norm_output path leaves
    the fused norm + head aside, the per-aux norms run as RMSNorm kernels, and greedy speculation still equals plain
    decoding."""
    from tiny import assert_transformed_engine_equals_plain

    from eaglespec.engine import transforms as tf

    def wire(target, drafter):
        tf.fuse_projections(drafter)
        tf.use_norm_linear_kernel(drafter)
        tf.use_elementwise_kernels(drafter)
        tf.use_draft_input_kernel(drafter)
        assert drafter.draft_input is not None and drafter.norm_head is not None

    assert_transformed_engine_equals_plain(wire, SpecConfig(3, 1, 4), [[1, 2, 3, 4, 5], [9, 10]], 8,
                                           VARIANTS["fc_norm+norm_output"])


def test_new_and_renormed_drafters_export_the_flags(target, tmp_path):
    shape = DrafterShape(fc_norm=True, norm_output=True)
    hf = drafter_hf_config(target.config, (1, 2, 2), 50, shape=shape)
    assert hf["fc_norm"] is True and hf["norm_output"] is True and "norm_before_fc" not in hf
    assert "fc_norm" not in drafter_hf_config(target.config, (1, 2, 2), 50)  # plain EAGLE-3 stays as published
    with pytest.raises(ConfigError, match="--norm-before-fc .* and --fc-norm .* are alternatives"):
        drafter_hf_config(target.config, (1, 2, 2), 50, shape=DrafterShape(norm_before_fc=True, fc_norm=True))
    fresh = new_drafter(target, (1, 2, 2), None, seed=0, shape=shape)
    assert fresh.fc_norm is not None and fresh.norm_output
    assert all(torch.equal(n.weight, torch.ones_like(n.weight)) for n in fresh.fc_norm)
    files = export_drafter(fresh, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["fc_norm"] is True and cfg["norm_output"] is True
    from safetensors import safe_open

    with safe_open(str(files[0]), "pt") as f:
        assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= set(f.keys())
    assert load_drafter(tmp_path / "out", "cpu", torch.float32).config.eagle.fc_norm

    # a plain drafter given the norms keeps every trained weight; removing them again is refused
    plain = new_drafter(target, (1, 2, 2), None, seed=3)
    moved = renorm_drafter(plain, DrafterShape(norm_before_fc=True, norm_output=True))
    assert moved.input_norm is not None and moved.norm_output and moved.input_norm.weight.requires_grad
    assert torch.equal(moved.midlayer.self_attn.q_proj.weight, plain.midlayer.self_attn.q_proj.weight)
    assert renorm_drafter(moved, DrafterShape()) is moved  # None: unchanged
    with pytest.raises(ConfigError, match="has EAGLE-3.1 norms .*: a continued drafter keeps them"):
        renorm_drafter(moved, DrafterShape(norm_output=False))
    with pytest.raises(ConfigError, match="are alternatives: the --init drafter already has the other"):
        renorm_drafter(moved, DrafterShape(fc_norm=True))
    # a drafter whose eagle_config says norm_output false (NVIDIA's layout keeps the flags there) gets it set there
    nested = tiny_drafter(target, seed=2, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 2],
                                                        "norm_output": False})
    nested.set_embed_and_head(*target.get_embed_and_head())
    assert not nested.norm_output
    assert renorm_drafter(nested, DrafterShape(norm_output=True)).norm_output
    assert ModelConfig.from_hf(dict(moved.config.raw)).eagle.norm_before_fc is True


@pytest.mark.parametrize("flag", ["norm_before_fc", "fc_norm"])
def test_calibrated_aux_norms_give_fc_its_trained_inputs(target, flag):
    """A norm added to a trained drafter, calibrated on aux states of one RMS per token (per aux state for fc_norm),
    passes fc exactly the inputs it was trained on; on states of varying RMS it is the least-squares fit, much
    closer than weight 1 and no worse than any other scalar or per-channel weight nearby."""
    plain = new_drafter(target, (1, 2, 2), None, seed=3)
    moved = renorm_drafter(plain, DrafterShape(**{flag: True}))
    n_aux, Ht = moved.n_aux, target.config.hidden_size
    g = torch.Generator().manual_seed(5)
    scale = torch.linspace(2, 40, n_aux * Ht)  # per-channel scales, as real hidden states have
    even = (torch.randn(64, n_aux * Ht, generator=g) * scale).reshape(64, n_aux, Ht)
    even = (even * torch.rsqrt(even.pow(2).mean(-1, keepdim=True)) * 10).reshape(64, -1)  # RMS 10 per state
    with torch.no_grad():
        assert not torch.allclose(moved.project_aux(even), plain.fc(even), rtol=0.1, atol=0.1)  # weight 1: far off
    names = calibrate_aux_norms(moved, even)
    assert names == (["input_norm.weight"] if flag == "norm_before_fc" else [f"fc_norm.{i}.weight" for i in range(3)])
    with torch.no_grad():
        torch.testing.assert_close(moved.project_aux(even), plain.fc(even), rtol=1e-4, atol=1e-4)
    # one token with massive activations (a Llama's first token: ~60x the RMS, in a few channels) beside normal
    # ones: the others still get about their trained inputs
    sink = even.clone()
    sink[0, :4] = 3000.0
    calibrate_aux_norms(moved, sink)
    with torch.no_grad():
        ref = plain.fc(sink[1:])
        assert (moved.project_aux(sink[1:]) - ref).norm() < 0.02 * ref.norm()  # a plain fit: 1.5-2.2
    # tokens of different RMS: the fit minimises the squared error relative to each token's scale
    varied = even * torch.exp(torch.randn(64, 1, generator=g) * 0.3)
    calibrate_aux_norms(moved, varied)
    norm = moved.input_norm if flag == "norm_before_fc" else moved.fc_norm[0]
    x = varied if flag == "norm_before_fc" else varied[:, :Ht]

    def err(w):
        return ((rms(x, w, norm.eps) - x).pow(2).sum(-1) / x.pow(2).mean(-1)).sum()
    with torch.no_grad():
        best = err(norm.weight)
        assert best < 0.25 * err(torch.ones_like(norm.weight))  # per-token scale is lost: not 0
        for f in (0.97, 1.03):
            assert best < err(norm.weight * f)
    assert calibrate_aux_norms(plain, even) == []  # no aux norm: nothing to set
