"""The CPU's weight-major projections (layers/cpu_linear.py, engine.transforms.use_cpu_linear): the same function as
nn.Linear at every row count (the padded ones included), the same Parameters, wired by prepare_for_inference on the
CPU after fusion, measured by api.load's CPU check in that form, and lossless through the engine."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tiny import assert_transformed_engine_equals_plain, tiny_llama

from eaglespec.config import SpecConfig
from eaglespec.engine.transforms import fuse_projections, prepare_for_inference, use_cpu_linear
from eaglespec.layers.cpu_linear import PAD_ROWS, CpuLinear, weight_major_linear


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear_at_every_row_count(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(40, 24, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    x = torch.randn(rows, 24, generator=g)
    y = weight_major_linear(x, w, b)
    assert y.shape == (rows, 40) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, rows, 24, generator=g)  # [B, T, K] as the layers pass it
    torch.testing.assert_close(weight_major_linear(x3, w, b), F.linear(x3, w, b), rtol=1e-5, atol=1e-5)


def test_padded_rows_are_dropped():
    """1 and 3 rows are computed as 2 and 4 (PAD_ROWS); the padding never reaches the output."""
    assert PAD_ROWS == {1: 2, 3: 4}
    w = torch.randn(8, 6)
    x = torch.randn(3, 6)
    y = weight_major_linear(x, w)
    assert y.shape == (3, 8)
    assert torch.allclose(y[:1], weight_major_linear(x[:1], w), atol=1e-6)  # row 0 alone (padded to 2) agrees


def test_transform_keeps_parameters_and_is_idempotent():
    m = tiny_llama(seed=0)
    before = {k: v for k, v in m.state_dict().items()}
    ids = {k: id(p) for k, p in m.named_parameters()}
    use_cpu_linear(m)
    lins = [x for x in m.modules() if isinstance(x, nn.Linear)]
    assert lins and all(type(x) is CpuLinear for x in lins)
    assert {k: id(p) for k, p in m.named_parameters()} == ids  # the same Parameters, nothing copied
    assert list(m.state_dict()) == list(before)  # the checkpoint names kept
    use_cpu_linear(m)  # again: nothing to wrap
    assert all(type(x) is CpuLinear for x in m.modules() if isinstance(x, nn.Linear))


def test_biased_projection_keeps_its_bias():
    lin = nn.Linear(12, 7, bias=True)
    w = CpuLinear.wrap(lin)
    assert w.weight is lin.weight and w.bias is lin.bias
    x = torch.randn(3, 12)
    torch.testing.assert_close(w(x), lin(x), rtol=1e-5, atol=1e-5)


def test_prepare_for_inference_wires_the_cpu_after_fusion():
    m = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), True, False)
    layer = m.model.layers[0]
    assert type(layer.self_attn.qkv_proj) is CpuLinear and type(layer.mlp.gate_up_proj) is CpuLinear
    assert type(m.lm_head) is CpuLinear


def test_api_times_the_target_in_its_inference_form(monkeypatch):
    """The CPU check (engine/verify_cost.py) measures the forward the engine will run: weight-major projections."""
    from eaglespec import api
    from eaglespec.config import EngineConfig

    seen: list[bool] = []
    monkeypatch.setattr("eaglespec.api.verify_cost_ratio", lambda model, tokens, repeats=3: seen.append(
        any(isinstance(x, CpuLinear) for x in model.modules())) or 1.0)
    api.load(config=EngineConfig(device="cpu", max_batch_size=1))
    assert seen == [True, True]  # the greedy and the sampled shapes' draft tokens


def test_engine_with_weight_major_projections_equals_plain():
    """Greedy speculation through the transformed target and drafter (float32) still equals plain decoding."""

    def prepare(target, drafter):
        for m in (target, drafter):
            use_cpu_linear(fuse_projections(m))

    assert_transformed_engine_equals_plain(prepare, SpecConfig(3, 2, 5), [[1, 2, 3, 4], list(range(10, 18))], 12)
    assert_transformed_engine_equals_plain(prepare, SpecConfig(2, 1, 3), [[5, 6, 7]], 10)
