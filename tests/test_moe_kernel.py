"""The grouped MoE dispatch (layers/moe_kernel.py, engine.transforms.use_grouped_experts) under Triton's interpreter:
the expert-sorted block layout, the grouped experts against the eager per-expert loop (float32 and bf16), the
transform on Qwen3-MoE, gpt-oss and DeepSeek-V3 targets (logits, parameter names and values kept, capturable), and
the engine's static graph-path steps on a grouped MoE target: speculation gives plain greedy's tokens. gpt-oss's
experts (biases, clamped SwiGLU) through the same GEMMs' epilogues, Llama 4's routing weights on the experts' inputs
through the first GEMM's rows."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import plain_logits, tiny_drafter, tiny_moe  # noqa: E402

from eaglespec.config import EngineConfig, MoEConfig, SpecConfig  # noqa: E402
from eaglespec.engine.cuda_graphs import GraphCache, capturable  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import fuse_projections, use_grouped_experts, use_router_kernel  # noqa: E402
from eaglespec.layers.moe import MoE  # noqa: E402
from eaglespec.layers.moe_kernel import (_blocks_by_sort, block_m_for, expert_blocks, grouped_experts,  # noqa: E402
                                         max_blocks)
from eaglespec.sampling_params import SamplingParams  # noqa: E402


@pytest.mark.parametrize("N,k,E,bm", [(1, 1, 4, 16), (1, 8, 128, 16), (5, 2, 8, 16), (70, 8, 20, 32),
                                      (33, 8, 384, 16), (300, 2, 8, 64), (0, 2, 8, 16)])
def test_expert_blocks_sort_every_pair_once_into_blocks_of_one_expert(N, k, E, bm):
    g = torch.Generator().manual_seed(N * 1000 + E)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)]) if N else torch.zeros(0, k)
    if N >= 70:  # skewed routing: a few experts take most pairs (several blocks each)
        ids[: N // 2, 0] = 3
    ids = ids.long()
    pairs, block_expert = expert_blocks(ids, E, bm)
    P = N * k
    by_sort = _blocks_by_sort(ids, E, bm)  # the layout of long prefills: the same
    assert torch.equal(by_sort[0], pairs) and torch.equal(by_sort[1], block_expert)
    B = max_blocks(P, E, bm)
    assert pairs.shape == (B * bm,) and block_expert.shape == (B,)
    assert pairs.dtype == block_expert.dtype == torch.int32
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=E)
    used = int(((counts + bm - 1) // bm).sum())
    be = block_expert.tolist()
    assert be[used:] == [-1] * (B - used) and be[:used] == sorted(be[:used]) and min(be[:used], default=0) >= 0
    for e in range(E):  # expert e's blocks hold its pairs in their order (a stable sort), then padding
        slots = pairs.view(B, bm)[[b for b in range(used) if be[b] == e]].reshape(-1).tolist()
        assert len(slots) == -(-int(counts[e]) // bm) * bm
        mine = [p for p in range(P) if flat[p] == e]
        assert slots == mine + [P] * (len(slots) - len(mine))


def _moe(E: int = 8, k: int = 2, shared: int = 0, H: int = 64, I: int = 48, seed: int = 0, oss: bool = False,
         llama4: bool = False) -> MoE:
    """A random MoE; `oss`: gpt-oss's (a biased router, clamped-SwiGLU experts with biases); `llama4`: Llama 4's
    (sigmoid top-k, the weights on the experts' inputs)."""
    extra = dict(router_bias=True, expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702) if oss else {}
    if llama4:
        extra = dict(scoring_func="sigmoid", norm_topk_prob=False, weight_inputs=True)
    cfg = MoEConfig(n_routed_experts=E, num_experts_per_tok=k, n_shared_experts=shared, moe_intermediate_size=I,
                    **{"scoring_func": "softmax", "topk_method": "greedy", **extra})
    torch.manual_seed(seed)
    m = MoE(H, cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 1 / math.sqrt(p.shape[-1]))
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [1, 9, 40, 300])
@torch.no_grad()
def test_grouped_experts_equal_the_eager_loop(dtype, N):
    m = _moe().to(dtype)
    x = torch.randn(N, 64, generator=torch.Generator().manual_seed(N)).to(dtype)
    weights, ids = m.gate(x)
    ref = m._routed(x, weights, ids).float()
    w13 = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in m.experts])
    w2 = torch.stack([e.down_proj.weight for e in m.experts])
    got = grouped_experts(x, weights, ids, w13, w2)
    assert got.dtype == dtype and got.shape == x.shape
    # float32: the same products summed in another order; bf16: the eager loop rounds each expert's output to bf16
    # before weighting it, the kernel weights the float32 sums (a rounding or two apart)
    tol = 1e-5 if dtype == torch.float32 else 2.0**-6
    assert torch.allclose(got.float(), ref, rtol=tol, atol=tol * ref.abs().max())
    assert block_m_for(N * 2, 8) == (16 if N <= 40 else 64)  # N = 300 runs the largest blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [1, 9, 300])
@torch.no_grad()
def test_grouped_gpt_oss_experts_equal_the_eager_loop(dtype, N):
    """gpt-oss's experts through the grouped GEMMs' bias and clamp epilogues: the eager loop of ClampedSwiGLUMLPs'
    output, with inputs large enough that gates and ups pass the clamp (so a kernel without it would differ)."""
    m = _moe(oss=True).to(dtype)
    x = (4 * torch.randn(N, 64, generator=torch.Generator().manual_seed(N))).to(dtype)
    weights, ids = m.gate(x)
    ref = m._routed(x, weights, ids).float()
    gates = torch.stack([e.gate_proj(x) for e in m.experts])
    assert (gates > 7.0).any() and (gates < -7.0).any()  # the clamp bites both ways (up) and above (gate)
    w13 = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in m.experts])
    w2 = torch.stack([e.down_proj.weight for e in m.experts])
    b13 = torch.stack([torch.cat((e.gate_proj.bias, e.up_proj.bias)) for e in m.experts])
    b2 = torch.stack([e.down_proj.bias for e in m.experts])
    got = grouped_experts(x, weights, ids, w13, w2, None, b13, b2, m.clamp)
    assert got.dtype == dtype and got.shape == x.shape and m.clamp == (7.0, 1.702)
    # bf16: the eager module rounds each elementwise step and each expert's output, the kernel once at the end
    tol = 1e-5 if dtype == torch.float32 else 2.0**-5
    assert torch.allclose(got.float(), ref, rtol=tol, atol=tol * ref.abs().max())
    unclamped = grouped_experts(x, weights, ids, w13, w2, None, b13, b2, (1e9, 1.702)).float()
    assert not torch.allclose(unclamped, ref, rtol=tol, atol=tol * ref.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N", [1, 9, 300])
@torch.no_grad()
def test_grouped_experts_weighting_inputs_equal_the_eager_loop(dtype, N):
    """Llama 4's MoE (`weight_inputs`): the first GEMM scales each pair's row of x by its routing weight; the eager
    loop's output, and not the output-weighted experts' (SwiGLU is not linear)."""
    m = _moe(llama4=True).to(dtype)
    x = torch.randn(N, 64, generator=torch.Generator().manual_seed(N)).to(dtype)
    weights, ids = m.gate(x)
    assert 0 < weights.min() and weights.max() < 1  # sigmoids, not normalised
    ref = m._routed(x, weights, ids).float()
    w13 = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in m.experts])
    w2 = torch.stack([e.down_proj.weight for e in m.experts])
    got = grouped_experts(x, weights, ids, w13, w2, weight_inputs=True)
    # bf16: Triton's interpreter rounds float32 to bf16 toward zero (the GPU to nearest), here at five points in a row
    tol = 1e-5 if dtype == torch.float32 else 2.0**-5
    assert got.dtype == dtype and torch.allclose(got.float(), ref, rtol=tol, atol=tol * ref.abs().max())
    on_outputs = grouped_experts(x, weights, ids, w13, w2).float()
    assert not torch.allclose(on_outputs, ref, rtol=tol, atol=tol * ref.abs().max())


def test_gemm_tiles_fit_the_devices_shared_memory():
    """The default tiles shrink to a device's shared memory: a float32 gate/up GEMM of DeepSeek-V3's width at the
    bf16 tile (128, 128, 8, 3) asked an H100 for 278,528 bytes of its 232,448 (session 56) and no longer does; bf16
    tiles stay as measured; no limit (CPU, the interpreter) keeps any tile."""
    from eaglespec.layers.moe_kernel import _gemm_cfg, fit_shared

    H100 = 232448
    wide, narrow = _gemm_cfg(7168), _gemm_cfg(2048)
    assert fit_shared(wide, 16, True, 4, None) == wide == (128, 128, 8, 3)
    for bm in (16, 32, 64):
        for gated in (True, False):
            assert fit_shared(wide, bm, gated, 2, H100) == wide  # bf16: unchanged
            assert fit_shared(narrow, bm, gated, 4, H100) == narrow
            BN, BK, warps, stages = fit_shared(wide, bm, gated, 4, H100)
            assert (warps, stages) == (8, 3) and (stages - 1) * (bm + (1 + gated) * BN) * BK * 4 <= H100
        assert fit_shared(wide, bm, True, 4, H100) == (128, 64, 8, 3)  # BLOCK_K halves first
    assert fit_shared(wide, 16, True, 4, 101376) == (64, 64, 8, 3)  # ~99 KB (consumer GPUs): BLOCK_N too
    assert fit_shared(wide, 64, True, 4, 1) == (16, 16, 8, 3)  # never below 16 (tl.dot's least)
    # a narrow layer's gate/up GEMM in blocks of 16 slots (decode, verify): session 60's tile; fits an H100 either way
    assert _gemm_cfg(2880, True, 16) == (32, 256, 4, 3) and _gemm_cfg(2880, False, 16) == narrow
    assert _gemm_cfg(2880, True, 32) == narrow and _gemm_cfg(7168, True, 16) == wide
    assert fit_shared(_gemm_cfg(2048, True, 16), 16, True, 2, H100) == (32, 256, 4, 3)
    # a narrow layer's down GEMM of at most 8 pairs (a one-row decode step): five stages (session 61); more pairs, a
    # wide layer or an unknown count keep their tiles; the five-stage tile fits an H100 in bf16 and float32
    assert _gemm_cfg(2048, False, 16, 8) == (64, 128, 4, 5) and _gemm_cfg(2880, False, 16, 4) == (64, 128, 4, 5)
    assert _gemm_cfg(2048, False, 16, 9) == narrow and _gemm_cfg(2048, False, 16) == narrow
    assert _gemm_cfg(7168, False, 16, 8) == wide and _gemm_cfg(2048, True, 16, 8) == (32, 256, 4, 3)
    assert fit_shared((64, 128, 4, 5), 16, False, 4, H100) == (64, 128, 4, 5)


@torch.no_grad()
def test_fitted_tiles_compute_the_same_experts(monkeypatch):
    """With a device limit that forces the smallest tiles, the GEMMs still give the eager loop's experts."""
    from eaglespec.layers import moe_kernel

    seen = []
    fit = moe_kernel.fit_shared
    monkeypatch.setattr(moe_kernel, "shared_limit", lambda device: 1)
    monkeypatch.setattr(moe_kernel, "fit_shared", lambda *a: seen.append(fit(*a)) or seen[-1])
    m = _moe()
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(3))
    weights, ids = m.gate(x)
    w13 = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in m.experts])
    w2 = torch.stack([e.down_proj.weight for e in m.experts])
    got = grouped_experts(x, weights, ids, w13, w2)
    ref = m._routed(x, weights, ids)
    assert seen == [(16, 16, 4, 3), (16, 16, 4, 3)]  # both GEMMs took the fitted tile
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max())


def test_long_prefills_lay_out_their_blocks_by_sort(monkeypatch):
    """Past ONE_PROGRAM_MAX_PAIRS pairs the layout comes from `_blocks_by_sort`; the experts' output is unchanged."""
    from eaglespec.layers import moe_kernel

    m = _moe()
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        weights, ids = m.gate(x)
        w13 = torch.stack([torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in m.experts])
        w2 = torch.stack([e.down_proj.weight for e in m.experts])
        one_program = grouped_experts(x, weights, ids, w13, w2)
        monkeypatch.setattr(moe_kernel, "ONE_PROGRAM_MAX_PAIRS", 10)
        calls = []
        monkeypatch.setattr(moe_kernel, "_blocks_by_sort", lambda *a: calls.append(1) or _blocks_by_sort(*a))
        assert torch.equal(grouped_experts(x, weights, ids, w13, w2), one_program) and calls


_tiny_target = tiny_moe


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "llama4", "deepseek_v3"])
@torch.no_grad()
def test_use_grouped_experts_keeps_names_values_and_logits(arch, fuse):
    model = _tiny_target(arch)
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    ref = plain_logits(model, ids)
    if fuse:
        fuse_projections(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not capturable(model)
    use_grouped_experts(model)
    assert capturable(model)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    assert moes and all(m.w13 is not None for m in moes)
    for m in moes:  # the experts' parameters are views into the stacks (no second copy)
        lo, hi = m.w13.data_ptr(), m.w13.data_ptr() + m.w13.numel() * m.w13.element_size()
        for e in m.experts:
            first = getattr(e, "gate_up_proj", None) or e.up_proj  # gpt-oss's experts are never fused
            assert lo <= first.weight.data_ptr() < hi
            assert e.down_proj.weight.untyped_storage().data_ptr() == m.w2.untyped_storage().data_ptr()
            if arch == "gpt_oss":  # the biases are views into b13 / b2 as well
                assert e.up_proj.bias.untyped_storage().data_ptr() == m.b13.untyped_storage().data_ptr()
                assert e.down_proj.bias.untyped_storage().data_ptr() == m.b2.untyped_storage().data_ptr()
        assert (m.b13 is not None) == (m.b2 is not None) == (arch == "gpt_oss")
    w13 = moes[0].w13
    use_grouped_experts(model)  # idempotent
    assert moes[0].w13 is w13
    got = plain_logits(model, ids)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4 * ref.abs().max())
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@torch.no_grad()
def test_stacking_through_host_memory_gives_the_same_stacks(monkeypatch):
    """A device without room for a second copy of a layer's experts stacks them through host memory: the same
    stacks, views and logits (here the CPU plays the device; `_room_for` says no)."""
    from eaglespec.engine import transforms

    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    direct = use_grouped_experts(_tiny_target("qwen3_moe"))
    monkeypatch.setattr(transforms, "_room_for", lambda device, nbytes: False)
    staged = use_grouped_experts(_tiny_target("qwen3_moe"))
    for a, b in zip((m for m in direct.modules() if isinstance(m, MoE)), (m for m in staged.modules()
                                                                          if isinstance(m, MoE))):
        assert torch.equal(a.w13, b.w13) and torch.equal(a.w2, b.w2)
        assert b.experts[1].down_proj.weight.untyped_storage().data_ptr() == b.w2.untyped_storage().data_ptr()
    assert torch.equal(plain_logits(direct, ids), plain_logits(staged, ids))


# the long one past gpt-oss's 8-token window and Llama 4's 8-token chunks (tiny.tiny_moe); short, as every token of
# these engines' steps runs the kernels in Triton's interpreter
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 24))]


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "llama4", "deepseek_v3", "deepseek_v2"])
def test_grouped_moe_targets_on_the_static_path_speculate_as_plain(arch):
    """The graph path's bucketed all-rows steps (run eagerly here, `GraphCache(capture=False)`) on a grouped MoE target
    with fused routers:
    plain decoding and speculation (a chain and a tree) give the eager untransformed engine's greedy tokens."""
    target = _tiny_target(arch)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    cfg = EngineConfig(max_batch_size=4)
    ref = [o.token_ids for o in Engine(target, None, cfg).generate(PROMPTS, params)]
    drafter = tiny_drafter(target, seed=1, hidden=target.config.hidden_size)  # hidden = the target's (EAGLE-3)
    use_grouped_experts(target)
    use_router_kernel(target)  # the routers' selection as one kernel too, as on CUDA
    # the routers' kernel takes every router but DeepSeek-V2's group-limited softmax one (PyTorch's there)
    assert all(m.gate.fused == (arch not in ("deepseek_v2", "llama4")) for m in target.modules() if isinstance(m, MoE))
    for spec in (None, SpecConfig(steps=3, topk=1, draft_tokens=4), SpecConfig(steps=3, topk=2, draft_tokens=6)):
        eng = Engine(target, None, cfg, drafter=drafter if spec else None, spec=spec)
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
        assert [o.token_ids for o in eng.generate(PROMPTS, params)] == ref
        if spec is not None:
            assert eng.stats.verify_steps > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,k,H", [(1, 8, 300), (5, 3, 64), (2, 1, 513)])
def test_sum_pairs_sums_in_slot_order_and_adds_after_rounding(dtype, N, k, H):
    """`sum_pairs`: each token's k float32 rows summed in slot order and rounded once to dtype (bit for bit the
    sequential float32 sum); with `add` (a MoE's shared experts' output) added after that rounding and rounded again,
    as the eager `routed + shared` of two dtype tensors. H past SUM_BLOCK and not a multiple of it."""
    from eaglespec.layers.moe_kernel import sum_pairs

    g = torch.Generator().manual_seed(N * 100 + k)
    y = torch.randn(N * k, H, generator=g) * 10
    acc = y[0::k].clone()
    for j in range(1, k):
        acc = acc + y[j::k]
    routed = acc.to(dtype)
    add = torch.randn(N, H, generator=g).to(dtype)
    got, got_add = sum_pairs(y, N, k, dtype), sum_pairs(y, N, k, dtype, add)
    assert got.dtype == got_add.dtype == dtype and got.shape == got_add.shape == (N, H)
    if dtype == torch.float32:
        assert torch.equal(got, routed) and torch.equal(got_add, routed + add)
    else:  # Triton's interpreter rounds float32 to bf16 toward zero (the GPU to nearest): one bf16 step apart at most
        assert torch.allclose(got.float(), routed.float(), rtol=2.0**-7, atol=0)
        assert torch.allclose(got_add.float(), (got + add).float(), rtol=2.0**-7, atol=2.0**-7)


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_gemv_wired_moe_targets_speculate_as_plain(arch, monkeypatch):
    """`use_gemv_kernel` on MoE targets (its width threshold lowered to the tiny models'): the routers compute the
    logits of steps of up to ROUTER_GEMV_MAX_ROWS rows through the GEMV kernel (and only those), Qwen3's q/k/v and
    o_proj and DeepSeek-V3's MLA projections take it for one-row steps, and greedy decoding and speculation on the
    static path give the eager untransformed engine's tokens."""
    import eaglespec.engine.transforms as tr
    from eaglespec.layers.few_rows_linear import FewRowsLinear
    from eaglespec.layers.gemv_kernel import gemv_rows

    target = _tiny_target(arch)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    cfg = EngineConfig(max_batch_size=4)
    ref = [o.token_ids for o in Engine(target, None, cfg).generate(PROMPTS, params)]
    drafter = tiny_drafter(target, seed=1, hidden=target.config.hidden_size)
    monkeypatch.setattr(tr, "GEMV_MIN_K", 16)
    tr.use_gemv_kernel(use_router_kernel(use_grouped_experts(fuse_projections(target))))
    routers = [m.gate for m in target.modules() if isinstance(m, MoE)]
    assert routers and all(r.logits_rows is gemv_rows and r.logits_max_rows == tr.ROUTER_GEMV_MAX_ROWS
                           for r in routers)
    attn = target.model.layers[1].self_attn
    names = ("qkv_proj", "o_proj") if arch == "qwen3_moe" else ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj")
    assert all(isinstance(getattr(attn, n), FewRowsLinear) and getattr(attn, n).kernel is gemv_rows for n in names)
    router, rows_seen = routers[0], []

    def spy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows_seen.append(x.shape[0])
        return gemv_rows(x, w)

    with torch.no_grad():
        for n in (1, 4, 5):
            x = torch.randn(n, target.config.hidden_size)
            router.logits_rows = spy
            weights, ids = router(x)
            router.logits_rows = None  # the matmul
            ref_w, ref_ids = router(x)
            assert torch.equal(ids, ref_ids) and torch.allclose(weights, ref_w, atol=1e-6)
    assert rows_seen == [1, 4]  # five rows take the matmul
    router.logits_rows = gemv_rows
    for spec in (None, SpecConfig(steps=3, topk=1, draft_tokens=4), SpecConfig(steps=3, topk=2, draft_tokens=6)):
        eng = Engine(target, None, cfg, drafter=drafter if spec else None, spec=spec)
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
        assert [o.token_ids for o in eng.generate(PROMPTS, params)] == ref
