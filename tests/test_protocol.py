"""The EAGLE-3 target protocol: conformance check, delegation for wrappers, the appended-patch bug."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from test_norm_linear_kernel import few_programs  # noqa: E402
from tiny import tiny_drafter, tiny_llama  # noqa: E402
from wrappers import DelegatingWrapper, PatchedWrapper, PlainWrapper  # noqa: E402

from eaglespec.cli import main  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import (  # noqa: E402
    fold_norms, fuse_projections, use_norm_linear_kernel, use_rope_store_kernel,
)
from eaglespec.errors import ProtocolError  # noqa: E402
from eaglespec.layers.context import ForwardContext  # noqa: E402
from eaglespec.models.base import PreNormDecoderLayer  # noqa: E402
from eaglespec.protocol import PROTOCOL_METHODS, check_target  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402


def test_llama_implements_protocol():
    m = tiny_llama()
    assert check_target(m).ok
    embed, head = m.get_embed_and_head()
    assert embed is m.model.embed_tokens.weight and head is m.lm_head.weight  # live tensors, not copies


@pytest.mark.parametrize("path", ["module", "fused", "folded"])
def test_aux_states_are_layer_outputs_concatenated(monkeypatch, path):
    """The captured states equal the layers' outputs run by hand, on the module path, the fused few-row kernels
    (Triton's interpreter) and the folded path; a state whose next layer adds the residual stream anyway is that
    layer's input sum (`keep_input`), the last layer's output the loop's own add."""
    m = tiny_llama(layers=6)
    T = 11
    if path != "module":
        few_programs(monkeypatch)
        m = use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(m)), max_rows=2 * T if path == "fused"
                                   else 0)
        if path == "folded":
            m = fold_norms(m)
    ids = torch.randint(0, 97, (2, T))
    m.set_eagle3_layers_to_capture([1, -1, 2, 5, 1])  # the embeddings (-1) and an id named twice too
    kept = []
    forward = PreNormDecoderLayer.forward
    monkeypatch.setattr(PreNormDecoderLayer, "forward", lambda self, *a, keep_input=False, **kw: kept.append(
        keep_input) or forward(self, *a, keep_input=keep_input, **kw))
    out = m(ids, ForwardContext.plain(2, T))
    assert out.aux_hidden.shape == (2, T, 5 * 64)
    # layers 2 and 3 hand back their input sums (layer 1's and 2's outputs); the folded path has no delta to add
    assert kept == ([False] * 6 if path == "folded" else [False, False, True, True, False, False])
    # reference: run the layers by hand
    h = m.model.embed_tokens(ids)
    embeds = h.clone()
    cos, sin = m.model.rotary(ForwardContext.plain(2, T).positions)
    outs, d = [], None
    for layer in m.model.layers:
        h, d = layer(h, d, cos, sin, ForwardContext.plain(2, T), None)  # the layer's output is h + d
        outs.append(h.clone() if d is None else h + d)
    torch.testing.assert_close(out.aux_hidden, torch.cat([outs[1], embeds, outs[2], outs[5], outs[1]], -1))
    m.set_eagle3_layers_to_capture(None)
    # keep_input with a delta on every path (the folded one copies its input sum before updating it in place)
    layer, x, d = m.model.layers[3], outs[2], torch.randn_like(outs[2])
    want = layer(x, d, cos, sin, ForwardContext.plain(2, T), None)
    *got, s = layer(x, d, cos, sin, ForwardContext.plain(2, T), None, keep_input=True)
    torch.testing.assert_close(s, x + d)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
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
