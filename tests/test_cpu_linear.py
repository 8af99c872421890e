"""The CPU's weight-major projections (layers/cpu_linear.py, engine.transforms.use_cpu_linear): the same function as
nn.Linear at every row count (the padded ones included), the same Parameters, wired by prepare_for_inference on the
CPU after fusion, measured by api.load's CPU check in that form, and lossless through the engine. From 3 rows on the
oneDNN-packed copy of the weight: the same function, taken only where it fits the host's memory (one per distinct
weight), never stale after an in-place change, never under autograd; bfloat16 weights through it at every row count
where the CPU has native bf16, float16 and float64 never."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tiny import assert_transformed_engine_equals_plain, tiny_llama

from eaglespec.config import SpecConfig
from eaglespec.engine import transforms
from eaglespec.engine.transforms import fuse_projections, prepare_for_inference, use_cpu_linear
from eaglespec.layers import cpu_linear
from eaglespec.layers.cpu_linear import PAD_ROWS, CpuLinear, pack_weight, packable, weight_major_linear


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
    monkeypatch.setattr("eaglespec.api.verify_cost_ratios",
                        lambda model, sizes, repeats=5, record=None, as_verify=False: seen.append(
                            any(isinstance(x, CpuLinear) for x in model.modules())) or dict.fromkeys(sizes, 1.0))
    api.load(config=EngineConfig(device="cpu", max_batch_size=1, cpu_weights="dense"))
    assert seen == [True]  # one timing: the greedy and the sampled shapes' draft tokens


def test_engine_with_weight_major_projections_equals_plain():
    """Greedy speculation through the transformed target and drafter (float32) still equals plain decoding."""

    def prepare(target, drafter):
        for m in (target, drafter):
            use_cpu_linear(fuse_projections(m))
            assert all(x.packed is not None for x in m.modules() if isinstance(x, CpuLinear))  # verifies take the copy

    assert_transformed_engine_equals_plain(prepare, SpecConfig(3, 2, 5), [[1, 2, 3, 4], list(range(10, 18))], 12)
    assert_transformed_engine_equals_plain(prepare, SpecConfig(2, 1, 3), [[5, 6, 7]], 10)


def _packed_calls(monkeypatch) -> list[int]:
    """Rows of every product the packed copies compute from now on."""
    calls: list[int] = []
    real = cpu_linear.packed_linear

    def spy(x, packed, bias, n):
        calls.append(x.numel() // x.shape[-1])
        return real(x, packed, bias, n)

    monkeypatch.setattr(cpu_linear, "packed_linear", spy)
    return calls


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_copy_computes_the_same_function(rows, bias, monkeypatch):
    calls = _packed_calls(monkeypatch)
    g = torch.Generator().manual_seed(rows)
    lin = nn.Linear(24, 40, bias=bias)
    ref = nn.Linear(24, 40, bias=bias)
    ref.load_state_dict(lin.state_dict())
    m = CpuLinear.wrap(lin)
    assert m.pack() and m.packed is not None
    calls.clear()  # pack's own check of the copy
    x = torch.randn(2, rows, 24, generator=g)  # [B, T, K]: 2 x rows rows
    with torch.no_grad():
        y = m(x)
        torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
        assert y.shape == (2, rows, 40) and y.is_contiguous()
        assert calls == ([2 * rows] if 2 * rows >= cpu_linear.PACKED_MIN_ROWS else [])
        m(x[:1, :1])  # one row: weight-major
    assert calls == ([2 * rows] if 2 * rows >= cpu_linear.PACKED_MIN_ROWS else [])


def test_packed_copy_is_never_stale_nor_under_autograd(monkeypatch):
    calls = _packed_calls(monkeypatch)
    lin = CpuLinear.wrap(nn.Linear(16, 8))
    assert lin.pack()
    calls.clear()  # pack's own check of the copy
    x = torch.randn(5, 16)
    with torch.no_grad():
        lin.weight.mul_(2.0)  # an in-place change (a training step, a load_state_dict)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert calls == [] and lin.packed is None  # the stale copy dropped, not used
    assert lin.pack()
    calls.clear()
    y = lin(x)  # autograd on: weight-major, so gradients reach the weight
    y.sum().backward()
    assert calls == [] and lin.weight.grad is not None
    torch.testing.assert_close(lin.weight.grad, x.sum(0).expand(8, 16), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        lin(x)
    assert calls == [5]


def test_float32_and_native_bfloat16_weights_are_packed():
    assert packable(torch.float32) and pack_weight(torch.randn(8, 16)) is not None
    bf16 = pack_weight(torch.randn(8, 16, dtype=torch.bfloat16))
    assert (bf16 is not None) == packable(torch.bfloat16)  # where oneDNN has the CPU's native bf16 instructions
    assert not packable(torch.float16) and pack_weight(torch.randn(8, 16, dtype=torch.float16)) is None
    assert pack_weight(torch.randn(8, 16, dtype=torch.float64)) is None
    assert pack_weight(torch.empty(8, 16, device="meta")) is None


@pytest.mark.skipif(not packable(torch.bfloat16), reason="this CPU has no native bf16 for oneDNN")
def test_bfloat16_takes_the_packed_copy_from_one_row(monkeypatch):
    """bfloat16 products through the packed copy at every row count, within bf16 rounding of the float32 product."""
    calls = _packed_calls(monkeypatch)
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    m = CpuLinear.wrap(lin)
    assert m.pack()
    calls.clear()
    with torch.no_grad():
        for rows in (1, 2, 5):
            x = torch.randn(rows, 64, generator=g).to(torch.bfloat16)
            y = m(x)
            assert y.dtype == torch.bfloat16 and y.shape == (rows, 48)
            torch.testing.assert_close(y.float(), F.linear(x.float(), lin.weight.float(), lin.bias.float()),
                                       rtol=2e-2, atol=2e-2)
    assert calls == [1, 2, 5]


def test_prepare_packs_where_the_copies_fit_the_host(monkeypatch):
    """The copies are made when their bytes are at most CPU_PACK_MAX_SHARE of the host's available memory; with too
    little memory, or none known, none is made, and the projections stay weight-major."""
    def lins(m):
        return [x for x in m.modules() if isinstance(x, CpuLinear)]

    need = sum(x.weight.numel() * 4 for x in tiny_llama(seed=0).modules() if type(x) is nn.Linear)
    for room in (None, int(need / transforms.CPU_PACK_MAX_SHARE) - 1):
        monkeypatch.setattr("eaglespec.device_memory.host_available", lambda room=room: room)
        m = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), True, False)
        assert lins(m) and all(x.packed is None for x in lins(m))
    monkeypatch.setattr("eaglespec.device_memory.host_available", lambda: int(need / transforms.CPU_PACK_MAX_SHARE))
    m = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), True, False)
    assert lins(m) and all(x.packed is not None for x in lins(m))


def test_a_weight_shared_by_two_projections_is_packed_once():
    shared = nn.Linear(16, 8, bias=False)
    m = nn.Sequential(shared, nn.ReLU(), nn.Linear(8, 16), nn.Linear(16, 8, bias=False))
    m[3].weight = shared.weight
    use_cpu_linear(m)
    assert m[0].packed is not None and m[0].packed is m[3].packed and m[2].packed is not m[0].packed


def _product_name(product) -> str:
    return "direct" if product is F.linear else "weight_major" if product is cpu_linear.weight_major_linear \
        else "packed"


def _timed_products(monkeypatch, direct_faster: bool, direct_until: int = 2) -> list[tuple[str, int, int]]:
    """`cpu_linear._pass_seconds` replaced by fixed timings: F.linear faster or slower than the weight-major product
    at 1-2 rows, and faster than the packed copy up to `direct_until` rows; each timed pass recorded as (product,
    rows, weights)."""
    passes: list[tuple[str, int, int]] = []

    def fake(product, weights, rows):
        name = _product_name(product)
        passes.append((name, rows, len(weights)))
        if name == "packed":
            return 1.5
        if name == "direct" and rows > 2:
            return 1.0 if rows <= direct_until else 2.0
        return 1.0 if (name == "direct") == direct_faster else 2.0

    monkeypatch.setattr(cpu_linear, "_pass_seconds", fake)
    return passes


@pytest.mark.parametrize("direct_faster", [True, False])
def test_few_row_products_follow_the_measurement(direct_faster, monkeypatch):
    """use_cpu_linear times F.linear against the weight-major product (1 and 2 rows, one warm pass each and
    MEASURE_ROUNDS alternating rounds, over the first MEASURE_BYTES of the model's distinct weights) and gives every
    CpuLinear the faster for the steps its packed copy does not serve; where F.linear wins, it is timed against the
    packed copy at 3 rows, and here loses: from 3 rows the packed copy still computes."""
    monkeypatch.setattr(cpu_linear, "MEASURE_MIN_BYTES", 0)
    passes = _timed_products(monkeypatch, direct_faster)
    m = tiny_llama(seed=0)
    distinct = len({p.data_ptr() for n, p in m.named_parameters() if n.endswith("proj.weight") or "lm_head" in n})
    use_cpu_linear(m)
    lins = [x for x in m.modules() if isinstance(x, CpuLinear)]
    first = sorted({(p, r, distinct) for p in ("direct", "weight_major") for r in (1, 2)})
    assert sorted(set(passes[:16])) == first and len(passes[:16]) == 4 * (cpu_linear.MEASURE_ROUNDS + 1) == 16
    assert passes[4:8] == [("weight_major", 1, distinct), ("weight_major", 2, distinct), ("direct", 1, distinct),
                           ("direct", 2, distinct)]  # the products alternate round by round
    # F.linear faster at 1-2 rows: timed against the packed copy at 3 rows (8 passes, alternating), where it loses
    assert passes[16:] == ([("packed", 3, distinct), ("direct", 3, distinct)] * 4 if direct_faster else [])
    assert all(x.direct_rows == (2 if direct_faster else 0) for x in lins)
    n = len(passes)
    use_cpu_linear(m)  # idempotent: nothing wrapped, nothing timed again
    assert len(passes) == n
    weight_major, packed = [], _packed_calls(monkeypatch)
    real = cpu_linear.weight_major_linear
    monkeypatch.setattr(cpu_linear, "weight_major_linear", lambda x, w, b=None: weight_major.append(1) or real(x, w, b))
    lin = lins[0]
    for rows in (1, 2, 3, 5):
        x = torch.randn(rows, lin.in_features)
        with torch.no_grad():
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert packed == [3, 5]  # the packed copy from 3 rows on, as before
    assert len(weight_major) == (0 if direct_faster else 2)


@pytest.mark.parametrize("direct_until", [3, 5, 99])
def test_f_linear_takes_the_rows_where_it_beats_the_packed_copy(direct_until, monkeypatch):
    """Where F.linear beats the packed copy at 3 rows too (session 67's Intel CPU: MKL's F.linear costs about its
    one-row time up to 3 rows), it is timed at each next row count until the copy wins (at most DIRECT_MAX_ROWS), and
    steps up to the last row count it won take it: the packed copy from the row after."""
    monkeypatch.setattr(cpu_linear, "MEASURE_MIN_BYTES", 0)
    passes = _timed_products(monkeypatch, True, direct_until)
    m = use_cpu_linear(tiny_llama(seed=0))
    expect = min(direct_until, cpu_linear.DIRECT_MAX_ROWS)
    timed = sorted({r for p, r, _ in passes if p == "packed"})
    assert timed == list(range(3, min(direct_until + 1, cpu_linear.DIRECT_MAX_ROWS) + 1))
    lins = [x for x in m.modules() if isinstance(x, CpuLinear)]
    assert all(x.direct_rows == expect for x in lins)
    packed = _packed_calls(monkeypatch)
    lin = lins[0]
    for rows in range(1, 10):
        x = torch.randn(rows, lin.in_features)
        with torch.no_grad():
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert packed == list(range(expect + 1, 10))


def test_no_packed_copies_no_timing_past_two_rows(monkeypatch):
    """Without packed copies (PACKED off, or weights too large for the host's memory) F.linear serves every step
    where it won at 1-2 rows, and nothing is timed past 2 rows."""
    monkeypatch.setattr(cpu_linear, "MEASURE_MIN_BYTES", 0)
    monkeypatch.setattr(cpu_linear, "PACKED", False)
    passes = _timed_products(monkeypatch, True, 99)
    m = use_cpu_linear(tiny_llama(seed=0))
    assert {r for _, r, _ in passes} == {1, 2}
    assert all(x.direct_rows == 2 for x in m.modules() if isinstance(x, CpuLinear))
    assert cpu_linear.direct_rows([torch.zeros(8, 8)], {}) == 2  # no copies given


def test_small_models_and_a_switched_off_measurement_stay_weight_major(monkeypatch):
    """Projections holding fewer than MEASURE_MIN_BYTES (weights that stay in cache) are not timed, nor any model
    while MEASURE is off: weight-major at 1-2 rows, as measured on session 19's CPU. The pass reads MEASURE_BYTES."""
    passes = _timed_products(monkeypatch, True)
    m = use_cpu_linear(tiny_llama(seed=0))
    assert not passes and not any(x.direct_rows for x in m.modules() if isinstance(x, CpuLinear))
    monkeypatch.setattr(cpu_linear, "MEASURE_MIN_BYTES", 0)
    monkeypatch.setattr(cpu_linear, "MEASURE", False)
    m = use_cpu_linear(tiny_llama(seed=0))
    assert not passes and not any(x.direct_rows for x in m.modules() if isinstance(x, CpuLinear))
    ws = [torch.zeros(64, 64) for _ in range(10)]  # 16 KiB each
    monkeypatch.setattr(cpu_linear, "MEASURE_BYTES", 3 * 16 << 10)
    assert cpu_linear.direct_rows(ws) == 2 and {n for _, _, n in passes} == {3}  # the first three weights


def test_a_pass_slowed_by_another_process_does_not_decide(monkeypatch):
    """Each product's best pass decides: F.linear's first and last timed rounds slowed fivefold (another process took
    the cores) still leave it the faster, as its middle round shows (neither the last nor the mean round decides)."""
    seen: list[str] = []

    def fake(product, weights, rows):
        name = _product_name(product)
        seen.append(name)
        slowed = seen.count(name) in (3, 4, 7, 8)  # passes 1-2 of each product warm, then rounds 1-3 (2 passes each)
        return 2.0 if name == "weight_major" else 10.0 if slowed else 1.0

    monkeypatch.setattr(cpu_linear, "_pass_seconds", fake)
    assert cpu_linear.direct_rows([torch.zeros(8, 8)]) == 2


def test_engine_with_direct_few_row_products_equals_plain(monkeypatch):
    """Greedy speculation with F.linear at 1-3 rows (the timing's choice where it is faster: session 67's CPU) and
    the packed copies from 4 rows still equals plain decoding."""
    monkeypatch.setattr(cpu_linear, "MEASURE_MIN_BYTES", 0)
    _timed_products(monkeypatch, True, 3)

    def prepare(target, drafter):
        for m in (target, drafter):
            use_cpu_linear(fuse_projections(m))
            assert all(x.direct_rows == 3 for x in m.modules() if isinstance(x, CpuLinear))

    assert_transformed_engine_equals_plain(prepare, SpecConfig(3, 2, 5), [[1, 2, 3, 4], list(range(10, 18))], 12)
