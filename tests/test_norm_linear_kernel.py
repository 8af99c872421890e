"""The fused add + RMSNorm + projection Triton kernel, run by Triton's interpreter on the CPU, against PyTorch."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is built (it is built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tiny import assert_transformed_engine_equals_plain, tiny_llama  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.transforms import fuse_projections, use_norm_linear_kernel, use_rope_store_kernel  # noqa: E402
from eaglespec.layers.context import ForwardContext  # noqa: E402
import eaglespec.layers.norm_linear_kernel as nlk  # noqa: E402
from eaglespec.layers.norm_linear_kernel import MAX_ROWS, add_norm_linear, add_norm_linear_reference  # noqa: E402


def few_programs(monkeypatch) -> None:
    """The interpreter runs programs one after another: engine tests launch one column block per call (one program
    per call at one row, one per row in the row grid)."""
    blocks = nlk._blocks

    def one_block(M: int, N: int, K: int, gated: bool, norm: bool = True, pdl: bool = False) -> tuple:
        bm, _, bk, *rest = blocks(M, N, K, gated, norm, pdl)
        return bm, 1 << (N - 1).bit_length(), bk, *rest

    monkeypatch.setattr(nlk, "_blocks", one_block)
    monkeypatch.setattr(nlk, "_ROW_GRID_BLOCKS", {k: (512, 1) for k in nlk._ROW_GRID_BLOCKS})


def record_rows(monkeypatch, module, name: str) -> set[int]:
    """Wrap the launcher `module.name` (its first argument the [M, K] rows) so that the row counts it serves are
    recorded in the returned set."""
    seen: set[int] = set()
    launch = getattr(module, name)
    monkeypatch.setattr(module, name, lambda h2, *a: seen.add(h2.shape[0]) or launch(h2, *a))
    return seen


@pytest.mark.parametrize("M,K,N", [(1, 48, 40), (3, 200, 24), (8, 64, 130), (2, 2048, 20)])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("with_delta", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference(M, K, N, gated, with_delta, dtype):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    h = torch.randn(2, M // 2, K, generator=g).to(dtype) if M % 2 == 0 else torch.randn(M, 1, K, generator=g).to(dtype)
    d = torch.randn(h.shape, generator=g).to(dtype) if with_delta else None
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype)
    w = (torch.randn(2 * N if gated else N, K, generator=g) / K ** 0.5).to(dtype)
    h1, y1 = add_norm_linear(h, d, nw, 1e-5, w, gated)
    h2, y2 = add_norm_linear_reference(h, d, nw, 1e-5, w, gated)
    assert h1.shape == h2.shape and y1.shape == y2.shape == (*h.shape[:-1], N)
    if dtype == torch.float32:
        assert torch.equal(h1, h2)  # the residual sum is the same sum
        assert torch.allclose(y1, y2, atol=1e-5, rtol=1e-5)
    else:  # Triton's interpreter truncates float32 -> bfloat16 where the GPU rounds to nearest, so each of the
        # kernel's 3-4 roundings may be a step off here: a loose bound (benchmarks/step_kernels_check.py checks bf16 on the GPU)
        assert ((h1.float() - h2.float()).abs() <= 2 ** -7 * h2.float().abs()).all()
        assert ((y1.float() - y2.float()).abs() <= 2 ** -4 * (1 + y2.float().abs())).all()


@pytest.mark.parametrize("K", [80, 576])  # split as 64 + 16 and 512 + 64 (`_k_chunks`)
@pytest.mark.parametrize("gated,with_delta,norm", [(False, True, True), (True, True, True), (False, False, False)])
def test_split_row_matches_reference(K, gated, with_delta, norm):
    """The row loop reading a row as two power-of-two chunks (SmolLM2's 576 and 1536) equals the reference in
    float32."""
    row_loop = True
    assert nlk._k_chunks(K)[1] > 0
    M, N = 3, 12
    g = torch.Generator().manual_seed(K)
    h = torch.randn(M, 1, K, generator=g)
    d = torch.randn(M, 1, K, generator=g) if with_delta else None
    nw = 1 + 0.1 * torch.randn(K, generator=g)
    w = torch.randn(2 * N if gated else N, K, generator=g) / K ** 0.5
    blocks = (4, 4, 1 << (K - 1).bit_length(), 1, row_loop)
    if norm:
        h1, y1 = add_norm_linear(h, d, nw, 1e-5, w, gated, blocks=blocks)
        h2, y2 = add_norm_linear_reference(h, d, nw, 1e-5, w, gated)
        assert torch.equal(h1, h2)
    else:
        y1, y2 = nlk.linear_rows(h, w, blocks=blocks), torch.nn.functional.linear(h, w)
    assert torch.allclose(y1, y2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("M,K,per", [(3, 80, 1), (8, 576, 1), (7, 80, 2), (12, 576, 4)])
@pytest.mark.parametrize("gated,with_delta,norm", [(False, True, True), (True, True, True), (False, False, False)])
def test_row_grid_matches_reference(M, K, per, gated, with_delta, norm):
    """One program per (column block, row) (the policy for 2..ROW_GRID_ROWS rows), or per group of `per` rows: the
    one-row row loop over each row equals the reference in float32."""
    N = 12
    blocks = None if per == 1 else (per, 4, 1 << (K - 1).bit_length(), 1, True, True)  # explicit groups of rows
    g = torch.Generator().manual_seed(M + K)
    h = torch.randn(M, 1, K, generator=g)
    d = torch.randn(M, 1, K, generator=g) if with_delta else None
    nw = 1 + 0.1 * torch.randn(K, generator=g)
    w = torch.randn(2 * N if gated else N, K, generator=g) / K ** 0.5
    if norm:
        h1, y1 = add_norm_linear(h, d, nw, 1e-5, w, gated, blocks)
        h2, y2 = add_norm_linear_reference(h, d, nw, 1e-5, w, gated)
        assert torch.equal(h1, h2)
    else:
        y1, y2 = nlk.linear_rows(h, w, blocks), torch.nn.functional.linear(h, w)
    assert torch.allclose(y1, y2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gated,with_delta,norm", [(False, True, True), (True, True, True), (False, False, False)])
def test_few_row_steps_compute_each_row_as_a_one_row_step(gated, with_delta, norm):
    """Steps of 2..DOT_MIN_ROWS - 1 rows (the row grid) compute every row as the GPU's one-row step does (`_blocks`
    with PDL: the row loop, 4 columns a program, K = 576 in two chunks), bit for bit in bf16: so a one-row chain's
    verify of up to 5 tokens gets plain decoding's projections (session 65: the chain of 4's answers all equal plain
    decoding's on an H100; on tensor cores, 19 of 80)."""
    K, N = 576, 12
    g = torch.Generator().manual_seed(65)
    nw = (1 + 0.1 * torch.randn(K, generator=g)).bfloat16()
    w = (torch.randn(2 * N if gated else N, K, generator=g) / K ** 0.5).bfloat16()
    one_row = nlk._blocks(1, N, K, gated, norm, pdl=True)
    assert one_row[4] is True and nlk.DOT_MIN_ROWS == 6
    for M in range(2, nlk.DOT_MIN_ROWS):
        h = torch.randn(M, 1, K, generator=g).bfloat16()
        d = torch.randn(M, 1, K, generator=g).bfloat16() if with_delta else None
        if norm:
            many = add_norm_linear(h, d, nw, 1e-5, w, gated)
            alone = [add_norm_linear(h[i:i + 1], None if d is None else d[i:i + 1], nw, 1e-5, w, gated, one_row)
                     for i in range(M)]
            assert torch.equal(many[0], torch.cat([a[0] for a in alone]))
            assert torch.equal(many[1], torch.cat([a[1] for a in alone]))
        else:
            many = nlk.linear_rows(h, w)
            assert torch.equal(many, torch.cat([nlk.linear_rows(h[i:i + 1], w, one_row) for i in range(M)]))


def test_too_wide_is_refused():
    K = nlk.ONE_SHOT_K + 1
    with pytest.raises(AssertionError):
        add_norm_linear(torch.zeros(1, 1, K), None, torch.ones(K), 1e-5, torch.zeros(8, K), False)


def test_layers_use_it_only_for_few_rows():
    """The transform wires Llama layers; a forward of few rows takes the fused path, a longer one keeps the modules,
    and both give the plain model's logits."""
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    ref = tiny_llama(seed=0)
    m = use_norm_linear_kernel(fuse_projections(tiny_llama(seed=0)), max_rows=4)
    layer = m.model.layers[0]
    assert layer.norm_linear is add_norm_linear and layer.norm_linear_rows == 4
    calls = []
    layer.norm_linear = lambda *a: calls.append(1) or add_norm_linear(*a)
    long = m(ids, ForwardContext.plain(1, 5, ids.device)).logits
    assert calls == []  # 5 rows > 4: the module path
    short = m(ids[:, :3], ForwardContext.plain(1, 3, ids.device)).logits
    assert calls == [1, 1]  # attention half and MLP half
    assert torch.allclose(long, ref(ids, ForwardContext.plain(1, 5, ids.device)).logits, atol=1e-5)
    assert torch.allclose(short, ref(ids[:, :3], ForwardContext.plain(1, 3, ids.device)).logits, atol=1e-5)


def test_unfused_layers_are_left_alone():
    m = use_norm_linear_kernel(tiny_llama(seed=0))  # q/k/v not fused: nothing to fuse the norm into
    assert all(layer.norm_linear is None for layer in m.model.layers)


def test_engine_with_the_kernels_equals_plain(monkeypatch):
    """Both Triton kernels through the whole engine (float32): the decode steps of a 2-row batch and the
    verify steps of a one-step chain (2 x 2 rows) take the fused path; greedy speculation still equals plain decoding."""
    few_programs(monkeypatch)
    rows_seen = record_rows(monkeypatch, nlk, "_launch")

    def prepare(target, drafter):
        for m in (target, drafter):
            use_rope_store_kernel(fuse_projections(m))
        use_norm_linear_kernel(target)

    assert_transformed_engine_equals_plain(prepare, SpecConfig(1, 1, 2), [[1, 2, 3, 4], list(range(10, 15))], 6)
    assert {2, 4} <= rows_seen  # two rows' decode, two rows' verify of 2 tokens


@pytest.mark.parametrize("B,T,R,K", [(1, 4, 1, 80), (3, 4, 1, 576), (2, 5, 2, 48), (3, 3, 2, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_indexed_rows_equal_gathering_first(B, T, R, K, dtype):
    """`index` [B, R]: the rows at those positions of h + delta only, read in place by the row loop (under
    DOT_MIN_ROWS rows: a catch-up's last real pair) or gathered first (6 rows: the tensor-core kernel's path): the
    same sums, the same products as the kernel on the gathered rows, bit for bit."""
    from eaglespec.layers.context import gather_rows

    g = torch.Generator().manual_seed(B * 100 + T * 10 + R)
    h = torch.randn(B, T, K, generator=g).to(dtype)
    d = torch.randn(B, T, K, generator=g).to(dtype)
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype)
    w = (torch.randn(40, K, generator=g) / K ** 0.5).to(dtype)
    idx = torch.randint(0, T, (B, R), generator=g)
    h1, y1 = add_norm_linear(h, d, nw, 1e-5, w, False, index=idx)
    h2, y2 = add_norm_linear(gather_rows(h, idx), gather_rows(d, idx), nw, 1e-5, w, False)
    assert h1.shape == (B, R, K) and y1.shape == (B, R, 40)
    assert torch.equal(h1, h2) and torch.equal(y1, y2)
    h3, y3 = add_norm_linear_reference(gather_rows(h, idx), gather_rows(d, idx), nw, 1e-5, w, False)
    if dtype == torch.float32:  # and the PyTorch path's values
        assert torch.equal(h1, h3) and torch.allclose(y1, y3, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("B,T,K", [(1, 1, 80), (1, 4, 576), (2, 2, 48), (1, 3, 576), (2, 3, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_rows_read_in_place_equal_gathering_first(monkeypatch, B, T, K, dtype):
    """`embed_norm_linear(table, ids, ...)`: a first layer's input rows read from the embedding table by the kernel
    (under DOT_MIN_ROWS rows: one row's program, the row grid) or gathered first (6 rows): the residual stream written
    and the same products as the kernel on the gathered rows, bit for bit."""
    from eaglespec.layers.norm_linear_kernel import embed_norm_linear

    g = torch.Generator().manual_seed(B * 100 + T * 10 + K)
    table = torch.randn(50, K, generator=g).to(dtype)
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype)
    w = (torch.randn(40, K, generator=g) / K ** 0.5).to(dtype)
    ids = torch.randint(0, 50, (B, T), generator=g)
    launched = record_rows(monkeypatch, nlk, "_launch")
    h1, y1 = embed_norm_linear(table, ids, nw, 1e-5, w)
    assert launched == ({50} if B * T < nlk.DOT_MIN_ROWS else {B * T})  # the table itself, or the gathered rows
    h2, y2 = add_norm_linear(torch.nn.functional.embedding(ids, table), None, nw, 1e-5, w, False)
    assert h1.shape == (B, T, K) and y1.shape == (B, T, 40)
    assert torch.equal(h1, h2) and torch.equal(y1, y2)


def test_first_layer_gathers_the_embedding(monkeypatch):
    """A capturing forward of 2 to EMBED_FOLD_MAX_ROWS (4) rows on the fused path (a verify) skips the embedding module
    (the first layer's kernel reads the table's rows); one-row and longer ones, forwards without capture (plain
    decoding) and captures of the embedding's output keep it; logits and aux states are those of the model without
    the fold."""
    from eaglespec.models import base
    from eaglespec.models.base import PreNormDecoderLayer

    few_programs(monkeypatch)
    m = use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(tiny_llama(seed=0))))
    calls = []
    m.model.embed_tokens.register_forward_hook(lambda *a: calls.append(1))
    ids = torch.tensor([[5, 9, 2, 7, 1, 3]])
    outs = {}
    for fold in (True, False):
        if not fold:
            monkeypatch.setattr(PreNormDecoderLayer, "fuses_embedding", lambda self, rows: False)
        for n, capture in ((1, [0, 1]), (2, [0, 1]), (4, [0, 1]), (4, None), (4, [-1, 1]), (5, [0, 1]), (6, [0, 1])):
            calls.clear()
            m.set_eagle3_layers_to_capture(capture)
            out = m(ids[:, :n], ForwardContext.plain(1, n))
            outs[fold, n, str(capture)] = (out.logits, out.aux_hidden)
            assert len(calls) == (0 if fold and 1 < n <= base.EMBED_FOLD_MAX_ROWS and capture == [0, 1] else 1)
    m.set_eagle3_layers_to_capture(None)
    for key in [k for k in outs if k[0]]:
        for a, b in zip(outs[key], outs[(False, *key[1:])]):
            assert (a is None and b is None) or torch.equal(a, b)
    # the probe's settings (base.EMBED_FOLD_MIN_ROWS, EMBED_FOLD_PLAIN): one-row and plain forwards fold too
    monkeypatch.undo()
    few_programs(monkeypatch)
    plain = {n: m(ids[:, :n], ForwardContext.plain(1, n)).logits for n in (1, 3)}  # the policy: no fold
    monkeypatch.setattr(base, "EMBED_FOLD_MIN_ROWS", 1)
    monkeypatch.setattr(base, "EMBED_FOLD_PLAIN", True)
    for n in (1, 3):
        calls.clear()
        assert torch.equal(m(ids[:, :n], ForwardContext.plain(1, n)).logits, plain[n]) and calls == []


def _drafter_pair(monkeypatch, **drafter_kw) -> tuple:
    """(target, plain, fused): a tiny fused target and its drafter with the RoPE + KV-store kernel, plain and with the
    norm + projection kernels wired (one program per call: `few_programs`), both on the target's embedding."""
    from copy import deepcopy

    from tiny import tiny_drafter

    few_programs(monkeypatch)
    target = fuse_projections(tiny_llama(seed=0))
    plain = use_rope_store_kernel(fuse_projections(tiny_drafter(target, seed=1, **drafter_kw)))
    fused = use_norm_linear_kernel(deepcopy(plain))
    for d in (plain, fused):
        d.set_embed_and_head(*target.get_embed_and_head())
    return target, plain, fused


def _catch_up(drafter, seed: int, logits_index: torch.Tensor | None = None) -> tuple:
    """A catch-up of 4 (token, aux state) pairs through `drafter` into a fresh cache: (logits, hidden, the cache)."""
    from eaglespec.engine.kv_cache import KVCache

    g = torch.Generator().manual_seed(seed)
    toks, aux = torch.randint(0, 97, (1, 4), generator=g), torch.randn(1, 4, 3 * 64, generator=g)
    kv = KVCache(1, drafter.kv_cache_shapes(), 1, 8, torch.float32, "cpu")
    pos = torch.arange(4)[None]
    ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=torch.ones(4, 4, dtype=torch.bool).tril()[None],
                         kv=kv.layers(), logits_index=logits_index)
    return (*drafter(toks, aux, ctx, from_target=True), kv)


def test_a_catch_up_takes_its_last_pair_through_the_indexed_head(monkeypatch):
    """A drafter forward with `logits_index` (a catch-up) runs the fused final norm + head on those positions' rows
    (the indexed kernel: no add or gather before it) and returns their logits and next hidden [B, R, H], equal to
    the unfused drafter's (float32)."""
    _, plain, fused = _drafter_pair(monkeypatch)
    indexed = []
    fused.norm_head = lambda h, *a, **kw: indexed.append(kw.get("index") is not None) or add_norm_linear(h, *a, **kw)
    (l1, h1, _), (l2, h2, _) = (_catch_up(d, 5, torch.tensor([[2]])) for d in (plain, fused))
    assert indexed == [True] and l1.shape == l2.shape == (1, 1, 50) and h1.shape == h2.shape == (1, 1, 64)
    assert torch.allclose(l1, l2, atol=1e-5, rtol=1e-5) and torch.allclose(h1, h2, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_drafter_mlp_half_through_the_kernel(monkeypatch, norm_before_residual):
    """The transform wires an EAGLE-3 drafter's layer too (its MLP half: add, norm, gate/up, SiLU) and its final norm
    + draft head: a catch-up of 4 tokens and a draft step of 1 give the plain drafter's logits and hidden states
    (float32), and speculation with it still gives the target's tokens; with norm_before_residual too (the kernel
    then adds the attention to hidden_norm(h), a strided view). A drafter without a draft vocabulary (the target's
    head) keeps its head on cuBLAS."""
    from tiny import tiny_drafter

    from eaglespec.engine.engine import Engine
    from eaglespec.sampling_params import SamplingParams

    target, plain, fused = _drafter_pair(monkeypatch, norm_before_residual=norm_before_residual)
    layer = fused.midlayer
    assert layer.norm_linear is add_norm_linear and layer.norm_linear_rows == nlk.ROW_GRID_ROWS  # float32's limit
    assert fused.norm_head is add_norm_linear and fused.norm_head_rows == 1  # transforms.DRAFT_HEAD_ROWS
    fused.norm_head_rows = 4  # here: the catch-up's 4 rows too
    no_vocab = use_norm_linear_kernel(fuse_projections(tiny_drafter(target, seed=1, draft_vocab=None)))
    assert no_vocab.norm_head is None and no_vocab.midlayer.norm_linear is add_norm_linear
    calls, head_calls = [], []
    layer.norm_linear = lambda h, *a: calls.append(h.shape[0] * h.shape[1]) or add_norm_linear(h, *a)
    fused.norm_head = lambda h, *a, **kw: head_calls.append(h.shape[0] * h.shape[1]) or add_norm_linear(h, *a, **kw)
    outs = []
    for d in (plain, fused):
        logits, h, kv = _catch_up(d, 3)  # a catch-up of 4 tokens
        ctx = ForwardContext(positions=torch.tensor([[4]]), write_index=torch.tensor([[4]]),
                             attn_mask=torch.ones(1, 1, 5, dtype=torch.bool), kv=kv.layers())
        logits2, h2 = d(torch.tensor([[5]]), h[:, -1:], ctx, from_target=False)  # a draft step
        outs.append((logits, h, logits2, h2))
    for a, b in zip(*outs):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    assert calls == [4, 1] and head_calls == [4, 1]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    prompts = [[1, 2, 3, 4], list(range(10, 15))]
    ref = [o.token_ids for o in Engine(target, None).generate(prompts, params)]
    eng = Engine(target, None, drafter=fused, spec=SpecConfig(3, 1, 4))
    assert [o.token_ids for o in eng.generate(prompts, params)] == ref


@pytest.mark.parametrize("M,K,N", [(1, 48, 40), (3, 200, 24), (8, 64, 130), (2, 2048, 20)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_rows_matches_f_linear(M, K, N, dtype):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    x = torch.randn(M, 1, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    y, ref = nlk.linear_rows(x, w), torch.nn.functional.linear(x, w)
    assert y.shape == ref.shape == (M, 1, N) and y.dtype == dtype
    if dtype == torch.float32:
        assert torch.allclose(y, ref, atol=1e-5, rtol=1e-5)
    else:  # one output rounding (the interpreter truncates where the GPU rounds)
        assert ((y.float() - ref.float()).abs() <= 2 ** -6 * (1 + ref.float().abs())).all()


def test_few_rows_linear_switches_by_rows_and_keeps_the_weight():
    from eaglespec.layers.few_rows_linear import FewRowsLinear

    lin = torch.nn.Linear(32, 20, bias=False)
    assert FewRowsLinear.wrap(lin, 2).kernel is nlk.linear_rows  # the default kernel
    calls = []
    m = FewRowsLinear.wrap(lin, 2, lambda x, w: calls.append(tuple(x.shape)) or nlk.linear_rows(x, w))
    assert m.weight is lin.weight and list(m.state_dict()) == ["weight"]
    x = torch.randn(1, 3, 32)
    assert torch.allclose(m(x[:, :2]), lin(x[:, :2]), atol=1e-5) and calls == [(1, 2, 32)]
    assert torch.allclose(m(x), lin(x), atol=1e-6) and len(calls) == 1  # 3 rows > 2: F.linear
    with pytest.raises(AssertionError):
        FewRowsLinear.wrap(torch.nn.Linear(4, 4), 2)  # a bias: not for this kernel


def test_linear_rows_transform_wires_target_and_drafter(monkeypatch):
    """o_proj and down_proj of a Llama target and of a drafter, and the drafter's fc, become FewRowsLinear; layers wider
    than ONE_SHOT_K or weights over FEW_ROWS_MAX_WEIGHTS elements are left to cuBLAS; with every kernel wired, greedy
    speculation still equals plain decoding."""
    import eaglespec.engine.transforms as transforms
    from eaglespec.engine.transforms import use_linear_rows_kernel
    from eaglespec.layers.few_rows_linear import FewRowsLinear

    few_programs(monkeypatch)
    m = use_linear_rows_kernel(tiny_llama(seed=0))
    layer = m.model.layers[0]
    assert isinstance(layer.self_attn.o_proj, FewRowsLinear) and isinstance(layer.mlp.down_proj, FewRowsLinear)
    assert type(layer.mlp.gate_proj) is torch.nn.Linear and type(m.lm_head) is torch.nn.Linear  # not named

    def wired() -> bool:
        return any(isinstance(x, FewRowsLinear) for x in use_linear_rows_kernel(tiny_llama(seed=0)).modules())

    monkeypatch.setattr(nlk, "ONE_SHOT_K", 32)  # narrower than the tiny model's 64: nothing wired
    assert not wired()
    monkeypatch.setattr(nlk, "ONE_SHOT_K", 2048)
    cap = transforms.FEW_ROWS_MAX_WEIGHTS
    monkeypatch.setattr(transforms, "FEW_ROWS_MAX_WEIGHTS", 64 * 64 - 1)  # below one 64 x 64 weight
    assert not wired()
    monkeypatch.setattr(transforms, "FEW_ROWS_MAX_WEIGHTS", cap)

    def prepare(target, drafter):
        for x in (target, drafter):
            use_linear_rows_kernel(use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(x))))
        assert isinstance(drafter.fc, FewRowsLinear) and isinstance(drafter.midlayer.self_attn.o_proj, FewRowsLinear)
        assert isinstance(drafter.midlayer.self_attn.qkv_proj, FewRowsLinear)  # the drafter's q/k/v (2H wide input)

    assert_transformed_engine_equals_plain(prepare, SpecConfig(3, 1, 4), [[1, 2, 3, 4], list(range(10, 15))], 8)


def test_gemv_kernel_and_its_wiring(monkeypatch):
    """layers/gemv_kernel.gemv_rows equals F.linear (float32, interpreter) for 1-4 rows and any K / N; use_gemv_kernel
    wraps the wide bias-free q/k/v, o_proj and down_proj (here "wide" lowered to the tiny model's 64), leaves
    use_linear_rows_kernel's row limit alone on them, and the engine's greedy decoding and speculation through it still
    equal plain decoding."""
    import eaglespec.engine.transforms as tr
    from eaglespec.engine.transforms import use_gemv_kernel, use_linear_rows_kernel
    from eaglespec.layers.few_rows_linear import FewRowsLinear
    from eaglespec.layers.gemv_kernel import gemv_rows

    g = torch.Generator().manual_seed(3)
    for M, N, K, cfg in [(1, 40, 300, (4, 128, 2, 2)), (3, 37, 513, (8, 256, 2, 2)), (4, 64, 1024, None)]:
        x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
        assert torch.allclose(gemv_rows(x, w, cfg), x @ w.T, atol=1e-4, rtol=1e-5)
        assert torch.allclose(gemv_rows(x, w, cfg, bias=b), F.linear(x, w, b), atol=1e-4, rtol=1e-5)
    monkeypatch.setattr(tr, "GEMV_MIN_K", 64)
    m = use_gemv_kernel(fuse_projections(tiny_llama(seed=0)))
    layer = m.model.layers[0]
    wrapped = [layer.self_attn.qkv_proj, layer.self_attn.o_proj]  # down_proj reads the 128-wide MLP: also wrapped
    assert all(isinstance(x, FewRowsLinear) and x.kernel is gemv_rows and x.max_rows == 1 for x in wrapped)
    assert isinstance(layer.mlp.down_proj, FewRowsLinear) and not isinstance(layer.mlp.gate_up_proj, FewRowsLinear)
    use_linear_rows_kernel(m, max_rows=3)
    assert layer.self_attn.o_proj.max_rows == 1  # the small-layer kernel's policy does not touch GEMV-wired layers
    assert_transformed_engine_equals_plain(lambda t, d: use_gemv_kernel(fuse_projections(t)), SpecConfig(3, 1, 4),
                                           [[5, 6, 7, 8], [9, 10]], 10)


@pytest.mark.parametrize("N,K,dtype,cfg", [(40, 1536, torch.bfloat16, (4, 512, 2, 4)),
                                           (32, 2880, torch.bfloat16, (1, 1024, 4, 3)),
                                           (300, 1024, torch.float32, (1, 1024, 8, 3)),
                                           (300, 2048, torch.bfloat16, (1, 1024, 4, 3)),
                                           (1500, 2048, torch.bfloat16, (2, 1024, 4, 3)),
                                           (2100, 1024, torch.bfloat16, (4, 1024, 2, 4)),
                                           (2100, 4096, torch.bfloat16, (2, 2048, 4, 3)),
                                           (2048, 4096, torch.bfloat16, (2, 1024, 4, 3))])
def test_gemv_tiles_by_shape(N, K, dtype, cfg):
    """`gemv_kernel.cfg_for`'s tile per branch (inputs that blocks of 1,024 pad more than blocks of 512 do, where
    gpt-oss's 2,880 pads alike; over 2,048 features and 4,096-8,192 inputs in blocks of 2,048, session 61; up to
    1,024 features, 8 warps for float32 weights; up to 2,048; wider: DEFAULT_CFG), and `gemv_rows` with its own
    choice equals the product (interpreter; past 300 features, that tile on 300 of them: each program computes its own
    features, and 1,500-2,100 features took the interpreter 5-14 s a case)."""
    from eaglespec.layers.gemv_kernel import DEFAULT_CFG, WIDE_K_CFG, cfg_for, gemv_rows

    assert cfg_for(N, K, torch.tensor([], dtype=dtype).element_size()) == cfg
    assert cfg_for(4096, 4096) == cfg_for(6144, 4096) == WIDE_K_CFG  # Llama-8B's o_proj and q/k/v
    assert cfg_for(4096, 14336) == cfg_for(5120, 2048) == DEFAULT_CFG  # its down_proj, Qwen3-30B-A3B's q/k/v
    assert cfg_for(2048, 4096) == (2, 1024, 4, 3)  # Qwen3-30B-A3B's o_proj: faster alone, slower in its step
    assert cfg_for(384, 7168) == (1, 1024, 4, 3)  # a router's gate: one feature a program
    g = torch.Generator().manual_seed(N)
    x, w = torch.randn(1, K, generator=g).to(dtype), torch.randn(min(N, 300), K, generator=g).to(dtype)
    ref = x.float() @ w.float().T
    got = gemv_rows(x, w) if N <= 300 else gemv_rows(x, w, cfg)
    assert torch.allclose(got.float(), ref, rtol=2.0**-7, atol=1e-3 * ref.abs().max())


def test_gemv_kernel_adds_the_biases_of_projections_and_routers(monkeypatch):
    """use_gemv_kernel wires the biased projections GEMV_BIASED_NAMES names (gpt-oss's o_proj; biased q/k/v keep
    cuBLAS, measured faster in a step): the same bias Parameter, added in the kernel, the engine's greedy decoding
    and speculation still plain decoding's; a biased router's (gpt-oss's) logits of few-row steps through the kernel
    with its bias choose and weigh as the matmul does; the few-row kernel of small layers refuses a bias."""
    import eaglespec.engine.transforms as tr
    from eaglespec.engine.transforms import use_gemv_kernel
    from eaglespec.layers.few_rows_linear import FewRowsLinear
    from eaglespec.layers.gemv_kernel import gemv_rows
    from eaglespec.layers.moe import MoE
    from tiny import tiny_moe

    monkeypatch.setattr(tr, "GEMV_MIN_K", 16)
    m = tiny_llama(seed=0, attention_bias=True)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g))
    m = fuse_projections(m)
    attn = m.model.layers[0].self_attn
    bias = attn.o_proj.bias
    assert tr.GEMV_BIASED_NAMES == ("o_proj",)
    use_gemv_kernel(m)
    assert isinstance(attn.o_proj, FewRowsLinear) and attn.o_proj.kernel is gemv_rows and attn.o_proj.bias is bias
    assert type(attn.qkv_proj) is torch.nn.Linear and attn.qkv_proj.bias is not None  # cuBLAS's
    x = torch.randn(1, attn.o_proj.in_features, generator=g)
    assert torch.allclose(attn.o_proj(x), F.linear(x, attn.o_proj.weight, bias), atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(tr, "GEMV_BIASED_NAMES", ("qkv_proj", "o_proj"))  # named: a biased q/k/v through it too
    use_gemv_kernel(m)
    assert isinstance(attn.qkv_proj, FewRowsLinear) and attn.qkv_proj.bias is not None
    x = torch.randn(1, 64, generator=g)
    assert torch.allclose(attn.qkv_proj(x), F.linear(x, attn.qkv_proj.weight, attn.qkv_proj.bias), atol=1e-5,
                          rtol=1e-5)
    with pytest.raises(AssertionError, match="takes no bias"):
        FewRowsLinear.wrap(torch.nn.Linear(8, 4), 4)  # the small layers' kernel (linear_rows) has no bias term
    biased = tiny_llama(seed=0, attention_bias=True)
    with torch.no_grad():
        for name, p in biased.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    assert_transformed_engine_equals_plain(lambda t, d: use_gemv_kernel(fuse_projections(t)), SpecConfig(3, 1, 4),
                                           [[5, 6, 7, 8], [9, 10]], 8, target=biased)
    router = next(x for x in tiny_moe("gpt_oss").modules() if isinstance(x, MoE)).gate
    with torch.no_grad():
        router.bias.copy_(torch.randn(router.bias.shape, generator=g))
    xs = [torch.randn(n, router.weight.shape[1], generator=g) for n in (1, 3, 4)]
    ref = [router(x) for x in xs]  # the matmul
    use_gemv_kernel(torch.nn.ModuleList([router]))
    assert router.logits_rows is gemv_rows
    calls = []
    monkeypatch.setattr(router, "logits_rows", lambda x, w, bias=None: calls.append(bias) or gemv_rows(x, w, bias=bias))
    got = [router(x) for x in xs]
    assert len(calls) == 3 and all(b is router.bias for b in calls)
    for (w_ref, i_ref), (w_got, i_got) in zip(ref, got):
        assert torch.equal(i_got, i_ref) and torch.allclose(w_got, w_ref, atol=1e-6)


@pytest.mark.parametrize("M", [1, 3, 5, 8])
@pytest.mark.parametrize("gated,norm", [(False, True), (True, True), (False, False)])
def test_row_loop_equals_the_broadcast_product(M, gated, norm):
    """The two ways the kernel multiplies (one [M, N, K] broadcast, or row by row: `_blocks`'s row_loop) give the
    same rows, float32, for every row count up to MAX_ROWS, with and without the norm, gated or not, rows past M
    masked (M = 3 and 5 pad to 4 and 8)."""
    K, N = 72, 24
    g = torch.Generator().manual_seed(M)
    h, d = torch.randn(M, K, generator=g), torch.randn(M, K, generator=g)
    nw = 1 + 0.1 * torch.randn(K, generator=g)
    w = torch.randn(2 * N if gated else N, K, generator=g) / K ** 0.5
    bm = 1 << (M - 1).bit_length()
    out = []
    for loop in (False, True):
        blocks = (bm, 1 << (N - 1).bit_length(), 128, 1, loop)  # one program: the interpreter runs them in turn
        if norm:
            out.append(add_norm_linear(h, d, nw, 1e-5, w, gated, blocks))
        else:
            out.append((h, nlk.linear_rows(h, w, blocks)))
    ref = add_norm_linear_reference(h, d if norm else None, nw, 1e-5, w, gated) if norm else (h, h @ w.T)
    for (h1, y1) in out:
        assert torch.equal(h1, ref[0]) and torch.allclose(y1, ref[1], atol=1e-5, rtol=1e-5)


def test_blocks_take_the_row_loop_at_one_row_with_pdl_only():
    """`_blocks`' policy (measured on the H200, docs/benchmarks.md "Session 12"): the row loop serves one-row steps
    launched with programmatic dependent launch; without PDL (older GPUs, EAGLESPEC_PDL=0) it was slower. Steps of
    2..5 rows take the row grid (sessions 13 and 65), 6..MAX_ROWS the tensor-core kernel (sessions 14, 24 and 65), 6..8
    rows whose tiles do not fit in shared memory the row grid again; the broadcast blocks of `_blocks` past one row
    are the fallback when ROW_GRID_ROWS is lowered."""
    assert nlk.ROW_GRID_ROWS == 8 and nlk.DOT_MIN_ROWS == 6 and MAX_ROWS == 64
    for gated, norm in ((False, True), (True, True), (False, False)):
        assert nlk._blocks(1, 960, 576, gated, norm, pdl=True)[4] is True
        assert nlk._blocks(1, 960, 576, gated, norm, pdl=False)[4] is False
        for M in range(2, nlk.ROW_GRID_ROWS + 1):
            bm, bn, bk, warps, loop = nlk._blocks(M, 960, 1536, gated, norm, pdl=True)
            assert not loop and bm >= M and bk == 2048 and bn in (2, 4) and warps in (1, 2, 4)


def test_steps_of_two_to_eight_rows_launch_one_program_per_row(monkeypatch):
    """The launch policy: one row -> `_blocks`' grid of column blocks; 2..8 rows that the tensor-core kernel does not
    take (here: none fits) -> (column blocks, rows), each program one row (ROW_GRID, BLOCK_M 1, the row loop)."""
    from eaglespec.layers import norm_linear_dot_kernel as dk

    monkeypatch.setattr(dk, "shared_limit", lambda device: 1)
    seen = []

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.append((grid, kw["ROW_GRID"], kw["BLOCK_M"], kw["ROW_LOOP"]))
            return launch

    monkeypatch.setattr(nlk, "_kernel", lambda: Spy())
    w = torch.zeros(24, 64)
    for M in (1, 2, 5, 8):
        add_norm_linear(torch.zeros(M, 64), None, torch.ones(64), 1e-5, w, False)
    grid1 = seen[0]
    assert grid1[0][1] == 1 and grid1[1] is False
    for (grid, row_grid, bm, loop), M in zip(seen[1:], (2, 5, 8)):
        assert grid[1] == M and row_grid and bm == 1 and loop


def dot_operands(M: int, K: int, N: int, gated: bool, with_delta: bool, dtype: torch.dtype, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(M, 1, K, generator=g).to(dtype)
    d = torch.randn(M, 1, K, generator=g).to(dtype) if with_delta else None
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype)
    w = (torch.randn(2 * N if gated else N, K, generator=g) / K ** 0.5).to(dtype)
    return h, d, nw, w


@pytest.mark.parametrize("M,K,N", [(9, 576, 40), (16, 80, 24), (37, 48, 50), (MAX_ROWS, 1536, 33)])
@pytest.mark.parametrize("gated,with_delta,norm", [(False, True, True), (True, True, True), (True, False, True),
                                                   (False, False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dot_kernel_matches_reference(M, K, N, gated, with_delta, norm, dtype):
    """Steps of 9..MAX_ROWS rows (layers/norm_linear_dot_kernel.py, tensor cores): rows past M masked, rows read as
    one or two chunks (576 = 512 + 64, 80 = 64 + 16, 1536 = 1024 + 512), gated or not, with or without the residual
    add and the norm; float32 to the reference's sums, bf16 within the interpreter's truncations."""
    h, d, nw, w = dot_operands(M, K, N, gated, with_delta, dtype, M + K + N)
    if norm:
        h1, y1 = add_norm_linear(h, d, nw, 1e-5, w, gated)
        h2, y2 = add_norm_linear_reference(h, d, nw, 1e-5, w, gated)
    else:
        (h1, y1), (h2, y2) = (h, nlk.linear_rows(h, w)), (h, torch.nn.functional.linear(h, w))
    assert h1.shape == h2.shape and y1.shape == y2.shape == (M, 1, N) and y1.dtype == dtype
    if dtype == torch.float32:
        assert torch.equal(h1, h2)
        assert torch.allclose(y1, y2, atol=1e-5, rtol=1e-5)
    else:  # as test_kernel_matches_reference: each rounding may be a truncation step off under the interpreter
        assert ((h1.float() - h2.float()).abs() <= 2 ** -7 * h2.float().abs()).all()
        assert ((y1.float() - y2.float()).abs() <= 2 ** -4 * (1 + y2.float().abs())).all()


@pytest.mark.parametrize("M", [5, 21])  # one block of 16 with 11 padding rows; two blocks, the second 5 rows deep
def test_dot_kernel_padding_rows_read_the_last_row_and_write_nothing(M):
    """The last block's padding rows load row M - 1 (no row mask on the loads: a mask cost up to 25% at row counts off
    the multiples of 16 on the H200) and nothing past row M - 1 is stored. The operands are the first M rows of
    larger buffers whose later rows are NaN, the outputs the first M rows of buffers of sentinels: the M rows equal
    the reference (no row took another's input), and the sentinels after them are untouched (the stores keep their
    row mask). Rows are independent in the product, so a padding row's load itself is not observable here."""
    from eaglespec.layers import norm_linear_dot_kernel as dk

    K, N, extra = 80, 24, 16
    h, d, nw, w = dot_operands(M, K, N, True, True, torch.float32, M)
    nan = torch.full((extra, K), float("nan"))
    h_buf, d_buf = torch.cat([h.view(M, K), nan]), torch.cat([d.view(M, K), nan])
    h_out = torch.full((M + extra, K), 7.0)
    y = torch.full((M + extra, N), 7.0)
    dk.launch(h_buf[:M], d_buf[:M], nw, w, h_out[:M], y[:M], 1e-5, True, True)
    h_ref, y_ref = add_norm_linear_reference(h.view(M, K), d.view(M, K), nw, 1e-5, w, True)
    assert torch.equal(h_out[:M], h_ref) and torch.allclose(y[:M], y_ref, atol=1e-5, rtol=1e-5)
    assert (h_out[M:] == 7.0).all() and (y[M:] == 7.0).all()


def test_steps_route_by_rows_and_the_dot_blocks_fit_shared_memory(monkeypatch):
    """One row -> `_blocks`' programs, 2..5 rows -> the row grid, 6.. rows (bf16; float32 with FLOAT32_DOT) -> the
    tensor-core kernel; its blocks (16 rows x 32 columns) narrow for wide inputs, so that the row and weight tiles fit
    in shared memory (the drafter's fc: 3 x 576 -> 2048 lanes)."""
    from eaglespec.layers import norm_linear_dot_kernel as dk

    seen = []
    monkeypatch.setattr(dk, "launch", lambda h2, *a: seen.append(("dot", h2.shape[0])))
    monkeypatch.setattr(nlk, "_kernel", lambda: type("Spy", (), {"__getitem__": lambda self, grid: (
        lambda *a, **kw: seen.append(("grid" if kw["ROW_GRID"] else "blocks", grid[1])))})())
    w = torch.zeros(24, 64)
    for M in (1, 2, 4, 5, 6, 8, 9, 64):
        add_norm_linear(torch.zeros(M, 64, dtype=torch.bfloat16), None, torch.ones(64, dtype=torch.bfloat16), 1e-5,
                        w.bfloat16(), False)
    assert seen == [("blocks", 1), ("grid", 2), ("grid", 4), ("grid", 5), ("dot", 6), ("dot", 8), ("dot", 9),
                    ("dot", 64)]
    seen.clear()
    monkeypatch.setattr(nlk, "FLOAT32_DOT", True)  # float32 on the tensor-core kernel too (the interpreter's tests)
    for M in (6, 64):
        add_norm_linear(torch.zeros(M, 64), None, torch.ones(64), 1e-5, w, False)
    assert seen == [("dot", 6), ("dot", 64)]
    assert dk._blocks(576, True, 2) == dk.DOT_BLOCKS == (16, 32, 4)
    assert dk._blocks(1728, False, 2) == (16, 16, 4)  # (16 + 32) x 2048 x 2 bytes > SMEM_BYTES
    assert dk._blocks(1728, False, 4) == (16, 16, 4) and dk._blocks(2048, True, 4) == (16, 16, 4)
    # FLOAT32_DOT off (the default: Triton's IEEE float32 products run as FMAs, far slower on the H200): float32 steps
    # of 6.. rows leave the tensor-core kernel as tiles over shared memory do (the row grid up to 8 rows, PyTorch past
    # it); bf16 steps keep it
    seen.clear()
    monkeypatch.setattr(nlk, "FLOAT32_DOT", False)
    for M in (6, 8):
        add_norm_linear(torch.zeros(M, 64), None, torch.ones(64), 1e-5, w, False)
        add_norm_linear(torch.zeros(M, 64, dtype=torch.bfloat16), None, torch.ones(64, dtype=torch.bfloat16), 1e-5,
                        w.bfloat16(), False)
    h9 = torch.randn(9, 64, generator=torch.Generator().manual_seed(9))
    _, y9 = add_norm_linear(h9, None, torch.ones(64), 1e-5, w + 1, False)
    assert seen == [("grid", 6), ("dot", 6), ("grid", 8), ("dot", 8)]  # 9 rows: neither kernel
    assert torch.equal(y9, add_norm_linear_reference(h9, None, torch.ones(64), 1e-5, w + 1, False)[1])


def test_tiles_over_shared_memory_take_the_pytorch_path(monkeypatch):
    """Float32 inputs over 1,024 wide need more shared memory than a block has on the H200 (a drafter's fc at 9+ rows:
    256 KB against 227 KB; a float32 engine of 8 rows crashed there in session 17): such steps of more than
    ROW_GRID_ROWS rows run the PyTorch path, with the same results and h_out, and of 5..ROW_GRID_ROWS rows the row
    grid, while every bf16 layer of up to ONE_SHOT_K fits."""
    from eaglespec.layers import norm_linear_dot_kernel as dk

    h200 = 232448  # bytes a block may opt into on the H200 (Triton's max_shared_mem)
    assert not dk.fits(1728, False, 4, h200) and dk.fits(1728, False, 2, h200)
    assert dk.fits(1536, False, 4, h200) and dk.fits(576, True, 4, h200) and dk.fits(1728, False, 4, None)
    assert all(dk.fits(k, g, 2, h200) for k in (576, 1536, 1728, nlk.ONE_SHOT_K) for g in (False, True))
    assert dk.shared_limit(torch.device("cpu")) is None
    monkeypatch.setattr(nlk, "FLOAT32_DOT", True)  # float32 steps would take the tensor-core kernel where it fits
    monkeypatch.setattr(dk, "shared_limit", lambda device: 1)  # nothing fits: every 9+ row step takes PyTorch
    monkeypatch.setattr(dk, "launch", lambda *a: pytest.fail("the tensor-core kernel was launched"))
    g = torch.Generator().manual_seed(3)
    h, d = torch.randn(12, 40, generator=g), torch.randn(12, 40, generator=g)
    nw, w = 1 + 0.1 * torch.randn(40, generator=g), torch.randn(48, 40, generator=g)
    for gated in (False, True):
        h2, y2 = add_norm_linear(h, d, nw, 1e-5, w, gated)
        ref = add_norm_linear_reference(h, d, nw, 1e-5, w, gated)
        assert torch.equal(h2, ref[0]) and torch.equal(y2, ref[1])
    assert torch.equal(nlk.linear_rows(h, w), h @ w.T)
    built, kernel = [], nlk._kernel  # 6 rows: the row grid's kernel, not PyTorch
    monkeypatch.setattr(nlk, "_kernel", lambda: built.append(1) or kernel())
    for gated in (False, True):
        h2, y2 = add_norm_linear(h[:6], d[:6], nw, 1e-5, w, gated)
        ref = add_norm_linear_reference(h[:6], d[:6], nw, 1e-5, w, gated)
        assert torch.equal(h2, ref[0]) and torch.allclose(y2, ref[1], atol=1e-5, rtol=1e-5)
    assert len(built) == 2


def test_one_row_chain_of_4_verifies_on_the_row_grid(monkeypatch):
    """The one-row greedy CUDA shape (session 65: the chain of 4, S4 K1 D5): its 5-token verify and the drafter's
    catch-ups of up to 5 rows take the row grid, never the tensor-core kernel; greedy speculation equals plain
    decoding (float32)."""
    from eaglespec.assets import default_spec
    from eaglespec.engine.transforms import use_linear_rows_kernel
    from eaglespec.layers import norm_linear_dot_kernel as dk

    spec = default_spec("cuda", 1).shape(1, greedy=True)
    assert spec == SpecConfig(4, 1, 5)
    few_programs(monkeypatch)
    monkeypatch.setattr(nlk, "FLOAT32_DOT", True)  # 5 float32 rows would go to the dot kernel if it were the policy
    dot_rows = record_rows(monkeypatch, dk, "launch")
    rows_seen = record_rows(monkeypatch, nlk, "_launch")

    def prepare(target, drafter):
        for x in (target, drafter):
            use_linear_rows_kernel(use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(x))))

    assert_transformed_engine_equals_plain(prepare, spec, [[1, 2, 3, 4]], 8)
    assert 5 in rows_seen and dot_rows == set()


def test_engine_through_the_dot_kernel_equals_plain(monkeypatch):
    """Verify steps of 2 x 6 = 12 rows (a chain of 5) and a drafter catching up 2 x 6 rows take the tensor-core
    kernel in the target and the drafter; greedy speculation still equals plain decoding (float32)."""
    from eaglespec.engine.transforms import use_linear_rows_kernel
    from eaglespec.layers import norm_linear_dot_kernel as dk

    few_programs(monkeypatch)
    monkeypatch.setattr(nlk, "FLOAT32_DOT", True)  # these tests run in float32, which the GPU keeps off the kernel
    rows_seen = record_rows(monkeypatch, dk, "launch")

    def prepare(target, drafter):
        for x in (target, drafter):
            use_linear_rows_kernel(use_norm_linear_kernel(use_rope_store_kernel(fuse_projections(x))))

    assert_transformed_engine_equals_plain(prepare, SpecConfig(5, 1, 6), [[1, 2, 3, 4], list(range(10, 15))], 8)
    assert 12 in rows_seen and min(rows_seen) >= nlk.DOT_MIN_ROWS
