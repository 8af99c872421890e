"""Drafters in vLLM speculators' format (eaglespec/speculators_config.py): a checkpoint written here under speculators'
names and config loads as the very drafter its EAGLE-3 layout twin loads as (float32, equal logits), computes
norm_before_residual as speculators' layer does, speculates losslessly with its aux ids read in vLLM's convention,
and every field eaglespec's drafter does not compute is refused by name."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from test_drafter_checkpoint import drafter_logits, write_published
from tiny import tiny_drafter, tiny_llama

from eaglespec.api import load_drafter
from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import ConfigError
from eaglespec.layers.context import ForwardContext
from eaglespec.loading.safetensors_io import load_safetensors, save_safetensors
from eaglespec.sampling_params import SamplingParams

# speculators' checkpoint names, from its source (github.com/vllm-project/speculators, src/speculators/):
# models/eagle3/core.py `Eagle3DraftModel` (fc, layers, norm, input_norm, fc_norm), model.py `DraftVocabMixin`
# (embed_tokens, lm_head, d2t, t2d), models/eagle3/model_definitions.py (layer 0: transformers' LlamaDecoderLayer,
# q/k/v over 2H, plus hidden_norm) -> the name of the same tensor in the tiny drafter's state_dict
SPECULATORS_NAMES = {
    "fc.weight": "fc.weight",
    "layers.0.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "layers.0.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "layers.0.self_attn.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "layers.0.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "d2t": "d2t",
    "t2d": "t2d",
    "input_norm.weight": "input_norm.weight",
    **{f"fc_norm.{i}.weight": f"fc_norm.{i}.weight" for i in range(3)},
}

VARIANTS = {  # name -> drafter config flags
    "norm_before_residual": dict(norm_before_residual=True),
    "eagle3": dict(norm_before_residual=False),
    # RedHatAI's gpt-oss speculator sets these three (its config, as quoted by other readers)
    "norm_before_fc+norm_output+norm_before_residual": dict(norm_before_residual=True, norm_before_fc=True,
                                                            norm_output=True),
    # vLLM's multi-layer EAGLE-3 (its llama_eagle3.py since vllm-project/vllm#26164; speculators' Eagle3DraftModel)
    "three layers": dict(norm_before_residual=True, num_hidden_layers=3),
}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


def drafter_with(target, flags: dict, draft_vocab: int | None = 50, seed: int = 1):
    """A tiny drafter with `flags`, every norm weight away from 1 (so that a swapped or dropped norm shows)."""
    d = tiny_drafter(target, seed=seed, draft_vocab=draft_vocab, **flags)
    g = torch.Generator().manual_seed(seed + 11)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return d


def speculators_dict(drafter, aux_vllm=(2, 3, 5), **top) -> dict:
    """config.json as speculators writes it (models/eagle3/config.py `Eagle3SpeculatorConfig`; its layer config as
    transformers 5 serialises a LlamaConfig, rope under rope_parameters)."""
    c, ec = drafter.config, drafter.config.eagle
    layer = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
        "rope_parameters": {"rope_theta": c.rope.theta, "rope_type": "default"}, "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": False, "vocab_size": c.vocab_size,
    }
    d = {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "speculators_version": "0.4.0",
        "draft_vocab_size": ec.draft_vocab_size or c.vocab_size, "norm_before_residual": ec.norm_before_residual,
        "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": list(aux_vllm) if aux_vllm else None,
        "norm_before_fc": ec.norm_before_fc, "fc_norm": ec.fc_norm, "norm_output": ec.norm_output,
        "embed_requires_grad": False, "dtype": "float32", "tie_word_embeddings": False,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "accept_tolerance": 0.0,
                                  "verifier_accept_k": 1}],
            "verifier": {"name_or_path": "tiny/target", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layer,
    }
    d.update(top)
    return d


def write_speculators(folder: Path, drafter, target, aux_vllm=(2, 3, 5), **top) -> Path:
    """config.json + model.safetensors under speculators' names (SPECULATORS_NAMES), with the verifier's embedding
    that speculators saves; without a draft vocabulary no d2t / t2d (DraftVocabMixin registers them as None)."""
    sd = drafter.state_dict()
    own = {n for n in sd if not n.startswith("embed_tokens.")}
    if drafter.config.eagle.draft_vocab_size is None:
        own -= {"d2t", "t2d"}
    names = {**SPECULATORS_NAMES, **{n: n for n in own if n.startswith("layers.")}}  # later layers: the same names
    tensors = {s: sd[o].contiguous() for s, o in names.items() if o in own}
    assert set(names[s] for s in tensors) == own  # the table names every weight
    tensors["embed_tokens.weight"] = target.get_embed_and_head()[0].detach().clone()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(speculators_dict(drafter, aux_vllm, **top)))
    save_safetensors(tensors, folder / "model.safetensors")
    return folder


def test_config_fields(target):
    d = drafter_with(target, VARIANTS["norm_before_fc+norm_output+norm_before_residual"])
    raw = speculators_dict(d, aux_vllm=(2, 3, 5))
    cfg = ModelConfig.from_hf(raw)
    ec = cfg.eagle
    assert cfg.architecture == "LlamaForCausalLMEagle3" and cfg.raw == raw
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (64, 4, 2, 97)
    assert ec.aux_layer_ids == (1, 2, 4) and ec.aux_ids_fixed  # vLLM's "after k layers" -> output of layer k-1
    assert ec.draft_vocab_size == 50 and ec.target_hidden_size == 64 and cfg.torch_dtype == "float32"
    assert ec.norm_before_residual and ec.norm_before_fc and ec.norm_output and not ec.fc_norm
    full = ModelConfig.from_hf({**raw, "draft_vocab_size": 97, "eagle_aux_hidden_state_layer_ids": None})
    assert full.eagle.draft_vocab_size is None and full.eagle.aux_layer_ids is None  # the target's head and layers


@pytest.mark.parametrize("name", VARIANTS)
def test_loads_as_its_eagle3_layout_twin(target, tmp_path, name):
    """The same weights written in both formats load as the same drafter: equal tensors, equal logits and hidden
    states (float32) for a step from the target's aux states and a step from the drafter's own hidden."""
    flags = VARIANTS[name]
    d = drafter_with(target, flags)
    ours = load_drafter(write_published(tmp_path / "ours", d, 64, aux=(1, 2, 4), **flags), "cpu", torch.float32)
    folder = write_speculators(tmp_path / "spec", d, target, aux_vllm=(2, 3, 5))
    assert {"layers.0.hidden_norm.weight", "embed_tokens.weight"} <= set(load_safetensors(folder / "model.safetensors"))
    spec = load_drafter(folder, "cpu", torch.float32)
    assert spec.config.eagle == ModelConfig.from_hf(spec.config.raw).eagle
    assert ours.config.eagle.aux_layer_ids == spec.config.eagle.aux_layer_ids == (1, 2, 4)
    for n, t in ours.state_dict().items():
        assert torch.equal(spec.state_dict()[n], t), n
    (la, ha), (lb, hb) = drafter_logits(ours, target), drafter_logits(spec, target)
    assert torch.equal(la, lb) and torch.equal(ha, hb)
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = ours(ids, ha, ForwardContext.plain(2, 7), from_target=False)
        b = spec(ids, hb, ForwardContext.plain(2, 7), from_target=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_norm_before_residual_is_speculators_layer(target):
    """Speculators' first layer (models/eagle3/model_definitions.py, Eagle3FirstLayerMixin.forward) with
    norm_before_residual: the residual is hidden_norm(hidden), then r + mlp(post_attention_layernorm(r)); here by
    hand from the drafter's modules. Without the flag the drafter differs (so the flag is not vacuous)."""
    d = drafter_with(target, VARIANTS["norm_before_residual"])
    plain = copy.deepcopy(d)
    plain.midlayer.norm_before_residual = False
    for m in (d, plain):
        m.set_embed_and_head(*target.get_embed_and_head())
    g = torch.Generator().manual_seed(4)
    ids, aux = torch.randint(0, 97, (2, 5), generator=g), 2 * torch.randn(2, 5, 3 * 64, generator=g)
    ctx = ForwardContext.plain(2, 5)
    with torch.no_grad():
        logits, hidden = d(ids, aux, ctx, from_target=True)
        mid = d.midlayer
        h = d.fc(aux)
        x = torch.cat((mid.input_layernorm(d.embed_tokens(ids)), mid.hidden_norm(h)), dim=-1)
        cos, sin = d.rotary(ctx.positions)
        r = mid.hidden_norm(h) + mid.self_attn(x, cos, sin, ctx, None)
        r = r + mid.mlp(mid.post_attention_layernorm(r))
        torch.testing.assert_close(hidden, r, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(logits, d.lm_head(d.norm(r)), rtol=1e-6, atol=1e-6)
        assert (plain(ids, aux, ctx, from_target=True)[0] - logits).abs().max() > 1e-2


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(4, 2, 8)], ids=["chain", "tree"])
def test_speculation_equals_plain_greedy(target, tmp_path, spec):
    """Aux ids [2, 3, 6] in vLLM's convention capture layers 1, 2 and 5 of the 6-layer target, whatever
    --aux-convention says; greedy speculation gives plain greedy tokens."""
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40))]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ref = [o.token_ids for o in Engine(target, None).generate(prompts, params)]
    d = drafter_with(target, VARIANTS["norm_before_residual"])
    folder = write_speculators(tmp_path / "spec", d, target, aux_vllm=(2, 3, 6))
    for conv in ("sglang", "vllm"):
        eng = Engine(target, None, EngineConfig(aux_convention=conv), drafter=load_drafter(folder, "cpu",
                                                                                           torch.float32), spec=spec)
        assert eng.aux_layer_ids == (1, 2, 5)
        assert [o.token_ids for o in eng.generate(prompts, params)] == ref
        assert eng.stats.verify_steps > 0


def test_full_vocabulary_takes_the_targets_head(target, tmp_path):
    """draft_vocab_size equal to the verifier's vocabulary: no d2t / t2d in the checkpoint, the lm_head saved (a copy
    of the verifier's) and then the target's own, an identity vocabulary map; no aux ids: the target's defaults."""
    d = drafter_with(target, VARIANTS["norm_before_residual"], draft_vocab=None)
    with torch.no_grad():
        d.lm_head.weight.copy_(target.lm_head.weight)
    folder = write_speculators(tmp_path / "spec", d, target, aux_vllm=None)
    assert not {"d2t", "t2d"} & set(load_safetensors(folder / "model.safetensors"))
    loaded = load_drafter(folder, "cpu", torch.float32)
    assert not loaded.has_own_head and loaded.config.eagle.draft_vocab_size is None
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    ref = Engine(target, None).generate([[3, 4, 5]], params)[0].token_ids
    eng = Engine(target, None, drafter=loaded, spec=SpecConfig(3, 1, 4))
    assert loaded.lm_head.weight is target.lm_head.weight
    assert torch.equal(loaded.d2t, torch.zeros(97, dtype=torch.int64))
    assert eng.aux_layer_ids == target.config.default_aux_layer_ids()
    assert eng.generate([[3, 4, 5]], params)[0].token_ids == ref


def _layer(**kw):
    return lambda d: d["transformer_layer_config"].update(kw)


def _drop(key, layer=False):
    return lambda d: (d["transformer_layer_config"] if layer else d).pop(key)


REFUSALS = {  # config change -> the message (each names the field)
    "dflash": (lambda d: d.update(speculators_model_type="dflash"), "speculators_model_type is 'dflash'"),
    "no layer": (_drop("transformer_layer_config"), "lacks transformer_layer_config"),
    "qwen3 layer": (_layer(model_type="qwen3"), "transformer_layer_config.model_type is 'qwen3': eaglespec's drafter layer is llama's"),
    "no model_type": (_drop("model_type", layer=True), "transformer_layer_config.model_type is None"),
    "sliding": (_layer(layer_types=["sliding_attention"]), "layer_types has sliding-window layers"),
    "no draft_vocab_size": (_drop("draft_vocab_size"), r"does not state draft_vocab_size.*\(32000 against"),
    "no norm_before_residual": (_drop("norm_before_residual"), r"does not state norm_before_residual.*false against"),
    "trained embedding": (lambda d: d.update(embed_requires_grad=True), "sets embed_requires_grad"),
    "four aux ids": (lambda d: d.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3, 4]),
                     r"\[1, 2, 3, 4\] are not three"),
    "aux id 0": (lambda d: d.update(eagle_aux_hidden_state_layer_ids=[0, 2, 4]), "include 0, the embedding output"),
    "both aux norms": (lambda d: d.update(norm_before_fc=True, fc_norm=True), "both norm_before_fc .* and fc_norm"),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_refusals_name_the_field(target, name):
    change, message = REFUSALS[name]
    d = speculators_dict(drafter_with(target, VARIANTS["eagle3"]))
    change(d)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_hf(d)


def test_refusal_names_the_file_and_init_is_refused(target, tmp_path):
    """Through the loader the refusal also names config.json; and `eaglespec train --init` does not continue a
    speculators drafter (its export would write speculators' config over the EAGLE-3 layout's names)."""
    from eaglespec.train.drafter import drafter_from_checkpoint

    d = drafter_with(target, VARIANTS["norm_before_residual"])
    bad = write_speculators(tmp_path / "bad", d, target, embed_requires_grad=True)
    with pytest.raises(ConfigError, match=r"embed_requires_grad .*\(.*bad/config.json\)"):
        load_drafter(bad, "cpu", torch.float32)
    good = write_speculators(tmp_path / "good", d, target)
    with pytest.raises(ConfigError, match="vLLM speculators' format, which eaglespec runs but does not continue"):
        drafter_from_checkpoint(target, str(good))
