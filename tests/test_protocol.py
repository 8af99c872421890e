"""The EAGLE-3 target protocol: conformance check, delegation for wrappers, the appended-patch bug."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_drafter, tiny_llama
from wrappers import DelegatingWrapper, PatchedWrapper, PlainWrapper

from eaglespec.cli import main
from eaglespec.config import SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import ProtocolError
from eaglespec.layers.context import ForwardContext
from eaglespec.protocol import PROTOCOL_METHODS, check_target
from eaglespec.sampling_params import SamplingParams


def test_llama_implements_protocol():
    m = tiny_llama()
    assert check_target(m).ok
    embed, head = m.get_embed_and_head()
    assert embed is m.model.embed_tokens.weight and head is m.lm_head.weight  # live tensors, not copies


def test_aux_states_are_layer_outputs_concatenated():
    m = tiny_llama(layers=6)
    ids = torch.randint(0, 97, (2, 11))
    m.set_eagle3_layers_to_capture([1, 2, 5])
    out = m(ids, ForwardContext.plain(2, 11))
    assert out.aux_hidden.shape == (2, 11, 3 * 64)
    # reference: run the layers by hand
    h = m.model.embed_tokens(ids)
    cos, sin = m.model.rotary(ForwardContext.plain(2, 11).positions)
    outs, d = [], None
    for layer in m.model.layers:
        h, d = layer(h, d, cos, sin, ForwardContext.plain(2, 11), None)  # the layer's output is h + d
        outs.append(h + d)
    torch.testing.assert_close(out.aux_hidden, torch.cat([outs[1], outs[2], outs[5]], -1))
    m.set_eagle3_layers_to_capture(None)
    assert m(ids, ForwardContext.plain(2, 11)).aux_hidden is None


def test_wrapper_without_delegation_is_refused_with_the_fix():
    w = PlainWrapper(tiny_llama())
    report = check_target(w)
    assert not report.ok
    msg = report.message()
    assert "PlainWrapper" in msg
    for m in PROTOCOL_METHODS:
        assert m in msg
    assert "'language_model'" in msg and 'delegate_eagle3("language_model")' in msg
    # the class alone (no instance) is diagnosed from its __init__
    assert check_target(PlainWrapper).delegate_to == "language_model"


def test_engine_refuses_wrapper_without_protocol():
    t = tiny_llama()
    w = PlainWrapper(t)
    with pytest.raises(ProtocolError, match="PlainWrapper does not implement the EAGLE-3 target protocol"):
        Engine(w, None, drafter=tiny_drafter(t), spec=SpecConfig(3, 1, 4))


def test_delegating_wrapper_passes_and_returns_inner_aux():
    inner = tiny_llama()
    w = DelegatingWrapper(inner)
    report = check_target(w)
    assert report.ok and report.delegated_via == "language_model"
    assert "delegated to 'language_model'" in report.message()
    # methods are defined in the class itself, with the class's qualified name
    for m in PROTOCOL_METHODS:
        assert m in DelegatingWrapper.__dict__
        assert DelegatingWrapper.__dict__[m].__qualname__ == f"DelegatingWrapper.{m}"
    w.set_eagle3_layers_to_capture([1, 2, 3])
    ids = torch.randint(0, 97, (1, 9))
    out = w(ids, ForwardContext.plain(1, 9))
    inner_out = inner(ids, ForwardContext.plain(1, 9))
    assert torch.equal(out.aux_hidden, inner_out.aux_hidden)
    assert w.get_embed_and_head()[0] is inner.model.embed_tokens.weight


def test_delegating_wrapper_speculates_losslessly():
    inner = tiny_llama()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    ref = [o.token_ids for o in Engine(inner, None).generate(prompts, params)]
    w = DelegatingWrapper(inner)
    eng = Engine(w, None, drafter=tiny_drafter(inner), spec=SpecConfig(4, 2, 6))
    assert [o.token_ids for o in eng.generate(prompts, params)] == ref


def test_appended_patch_is_refused():
    report = check_target(PatchedWrapper(tiny_llama()))
    assert not report.ok
    assert set(report.missing) == set(PROTOCOL_METHODS)
    assert report.module_level == list(PROTOCOL_METHODS)
    assert "module level" in report.message() and "outside the class" in report.message()


def test_check_cli(capsys):
    assert main(["check", "wrappers:DelegatingWrapper"]) == 0
    assert "implements the EAGLE-3 target protocol" in capsys.readouterr().out
    assert main(["check", "wrappers:PlainWrapper"]) == 1
    out = capsys.readouterr().out
    assert "PlainWrapper" in out and "language_model" in out
    assert main(["check", "wrappers.PatchedWrapper"]) == 1
    assert "module level" in capsys.readouterr().out
    assert main(["check", "no_such_module:Thing"]) == 2
    assert "cannot import" in capsys.readouterr().err
