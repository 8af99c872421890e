"""GGUF groups of more than 4 bits on the 4-bit CPU path (layers/kquant_groups.py, layers/kquant_kernels.py): the
K-quants and 5-bit types recovered from the loader's float32 weights as sums of 4-bit products that give the weights
back exactly (before the kernel's bf16 scales), in runs of rows where a fused projection mixes types; a tiny Llama
written as llama.cpp's Q4_K_M and Q5_K_M mixes speculates losslessly on the path; what cannot be taken is named."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_write import quantize_k, random_k_quant
from test_loading_gguf import write_tiny_gguf
from tiny import assert_speculation_equals_plain, plain_logits, tiny_drafter

from eaglespec.config import SpecConfig
from eaglespec.engine.int4_weights import use_int4_weights
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.errors import ConfigError
from eaglespec.layers import int4_linear, kquant_groups
from eaglespec.layers.int4_linear import Int4Linear
from eaglespec.layers.kquant_groups import kquant_terms
from eaglespec.loading.checkpoint import load_model
from eaglespec.loading.gguf_quants import dequantize
from eaglespec.sampling_params import SamplingParams

Q = gguf.GGMLQuantizationType
CPU = torch.device("cpu")


def stored(shape: tuple[int, int], qtype: Q, seed: int, random_blocks: bool = False) -> torch.Tensor:
    """Weights of `qtype` as the loader dequantizes them: Gaussian weights quantized (by gguf; K-quants by
    `quantize_k`), or `random_blocks` of a K-quant type (any codes and scales the format holds)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.05
    if random_blocks:
        data = random_k_quant(shape, qtype, seed)
    else:
        data = quantize_k(x, qtype) if qtype.name.endswith("_K") else gguf.quants.quantize(x, qtype)
    return dequantize(np.ascontiguousarray(data), qtype).reshape(shape)


def rebuilt(runs: list, n: int, k: int) -> torch.Tensor:
    """The weights the runs' terms stand for: the sum over terms of (codes - 8) scale + zero, per group of 32."""
    w = torch.zeros(n, k)
    for a, b, terms in runs:
        for codes, scale, zero in terms:
            g = (codes.float() - 8).view(b - a, -1, 32) * scale[..., None] + zero[..., None]
            w[a:b] += g.view(b - a, k)
    return w


@pytest.mark.parametrize("qtype,n_terms,random_blocks",
                         [(Q.Q4_K, 1, False), (Q.Q5_K, 2, False), (Q.Q6_K, 4, False), (Q.Q5_0, 2, False),
                          (Q.Q5_1, 2, False), (Q.Q4_K, 1, True), (Q.Q5_K, 2, True), (Q.Q6_K, 4, True),
                          (Q.Q3_K, 2, True)],
                         ids=["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q4_K-random", "Q5_K-random", "Q6_K-random",
                              "Q3_K-random"])
def test_groups_are_recovered_exactly_and_multiply_as_the_weights(qtype, n_terms, random_blocks):
    """Quantized Gaussian weights, and random blocks (codes that need not span a group's levels, any scales; Q3_K's
    halves of 16, q in -4..3 with scales of their own, take two products, not Q6_K's four)."""
    w = stored((256, 512), qtype, seed=3, random_blocks=random_blocks)
    runs = kquant_terms(w)  # one run: random blocks' values lie on finer grids too, which must not split the rows
    assert runs is not None and [(a, b, len(t)) for a, b, t in runs] == [(0, 256, n_terms)]
    assert all(int(c.min()) >= 0 and int(c.max()) <= 15 for _, _, t in runs for c, _, _ in t)
    assert (rebuilt(runs, 256, 512) - w).abs().max() <= 1e-6 * w.abs().max()
    lin = Int4Linear.from_weight(w)
    assert lin is not None and len(lin.terms) == n_terms and lin.runs is None
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ref = x.float() @ w.t()
    assert (lin(x).float() - ref).abs().max() <= 0.02 * ref.abs().max()  # bf16 activations, bf16 scales and zeros


@pytest.mark.parametrize("levels", [256, 128])
def test_wide_affine_groups_take_two_products_with_small_zeros(levels):
    """Groups on a grid of up to 256 levels above a minimum of their own (the widest affine form; Q5's 32 levels are
    its common case): two products, codes in 0..15, the weights exact. The high nibbles' offset is chosen per group:
    where their range leaves room (128 levels here, minima between -128 and 0 steps), the zero the kernel rounds to
    bf16 stays within 8 steps of 0, where a fixed offset would leave it up to 120 steps away."""
    g = torch.Generator().manual_seed(5)
    c = torch.randint(0, levels, (32, 8, 32), generator=g).float()
    c[:, :, 0], c[:, :, 1] = 0, levels - 1  # every group spans its levels
    s = torch.rand(32, 8, 1, generator=g) * 1e-3 + 1e-4
    lo = -s * torch.randint(0, min(levels, 129), (32, 8, 1), generator=g).float()
    w = (s * c + lo).view(32, 256)
    runs = kquant_terms(w)
    assert [(a, b, len(t)) for a, b, t in runs] == [(0, 32, 2)]
    (hc, hs, hz), (lc, ls, lz) = runs[0][2]
    assert int(hc.max()) <= 15 and int(lc.max()) <= 15 and torch.equal(hz, torch.zeros_like(hz))
    assert (rebuilt(runs, 32, 256) - w).abs().max() <= 1e-6 * w.abs().max()
    if levels == 128:
        assert bool((lz.abs() <= 8 * ls * (1 + 1e-5)).all())


def test_requantized_groups_with_sparse_codes_are_found():
    """Weights requantized from 4-bit groups (as llama.cpp's Q4_K_M of a Q4_1 file, benchmarks/smollm2_kquant.py):
    a Q8_0 group then uses one code in ~16, a Q6_K half may hold two values; their steps are found (Q8_0's closed
    form, wider divisors) and the weights come back exactly, beside Q5_0 rows of the same fused projection."""
    x = np.random.default_rng(7).standard_normal((64, 512)).astype(np.float32) * 0.05
    four = gguf.quants.dequantize(gguf.quants.quantize(x, Q.Q4_1), Q.Q4_1).reshape(x.shape).astype(np.float32)
    q8 = dequantize(np.ascontiguousarray(gguf.quants.quantize(four, Q.Q8_0)), Q.Q8_0).reshape(x.shape)
    # Q6_K: a half of two values (-0.097, 0.055) in a super-block holding a 2.19, so that its int8 scale is coarse (6:
    # the values at codes -30 and 17, neither at an extreme nor a small multiple of the smallest: found by the
    # smallest magnitude over 17; SmolLM2's layer 1 down_proj, requantized, holds such halves)
    halves = four.copy().reshape(64, 32, 16)
    halves[:, 0] = np.where(np.arange(16) % 3 == 0, -0.0969, 0.0549)
    halves[:, 1, 0] = 2.19
    q6 = dequantize(np.ascontiguousarray(quantize_k(halves.reshape(x.shape), Q.Q6_K)), Q.Q6_K).reshape(x.shape)
    q5 = dequantize(np.ascontiguousarray(gguf.quants.quantize(four, Q.Q5_0)), Q.Q5_0).reshape(x.shape)
    assert len(torch.unique(q6.view(-1, 16)[0])) == 2
    fused = torch.cat([q5, q8, q6])
    runs = kquant_terms(fused)
    assert [(a, b, len(t)) for a, b, t in runs] == [(0, 128, 2), (128, 192, 4)]
    assert (rebuilt(runs, 192, 512) - fused).abs().max() <= 1e-6 * fused.abs().max()


def test_halves_of_three_bits_take_two_products():
    """Q3_K's form (w = s q per half of 16, q in -4..3, the halves' scales unrelated, so no affine grid holds a
    group): found on each half's own grid (the first candidate, the largest magnitude over 32, fits a grid 8 times
    finer), two products, each half's codes with its scale; the weights exact."""
    g = torch.Generator().manual_seed(11)
    q = torch.randint(-4, 4, (48, 8, 2, 16), generator=g).float()
    q[..., 0], q[..., 1] = -4, 3  # every half spans its levels
    s = torch.rand(48, 8, 2, 1, generator=g) * 1e-3 + 1e-4
    w = (s * q).view(48, 256)
    runs = kquant_terms(w)
    assert [(a, b, len(t)) for a, b, t in runs] == [(0, 48, 2)]
    assert (rebuilt(runs, 48, 256) - w).abs().max() <= 1e-6 * w.abs().max()
    (c0, s0, z0), (c1, s1, z1) = runs[0][2]
    assert torch.equal(c0.view(48, 8, 2, 16)[:, :, 1], torch.full((48, 8, 16), 8, dtype=torch.uint8))  # the other half
    assert torch.equal(z0, torch.zeros_like(z0)) and torch.allclose(s0, s[:, :, 0, 0])


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=["Q4_K", "Q5_K", "Q6_K", "Q3_K",
                                                                            "Q2_K"])
def test_a_chunk_tries_first_the_form_its_first_row_takes_in_the_fewest_terms(qtype, monkeypatch):
    """`_chunk_order` stops probing once no form left could take the row in fewer terms, or tie where a tie goes to
    it (the halves): the order is the one probing every form gives (Q4_K / Q5_K whole groups first, Q6_K and Q3_K
    halves, Q3_K's whole-group fit notwithstanding; a random Q2_K row's two halves often share a grid of 256 levels,
    whole groups' two terms, else affine halves' three)."""
    w = stored((4, 512), qtype, 8, random_blocks=True)
    g1 = w.reshape(4, 16, 32)[:1]
    best, fewest = None, 5
    for f in kquant_groups._ORDER:  # every form probed
        got = kquant_groups._chunk_runs(g1, (f,))
        if got is not None and (got[0][0] < fewest or (got[0][0] == fewest and f == kquant_groups._HALVES)):
            best, fewest = f, got[0][0]
    first = {Q.Q4_K: kquant_groups._WHOLE, Q.Q5_K: kquant_groups._WHOLE, Q.Q6_K: kquant_groups._HALVES,
             Q.Q3_K: kquant_groups._HALVES}.get(qtype, best)
    assert best == first and kquant_groups._chunk_order(g1)[0] == first
    if qtype == Q.Q3_K:  # the tie: whole groups take the row in two terms too
        assert kquant_groups._chunk_runs(g1, (kquant_groups._WHOLE,))[0][0] == 2
    probes: list[tuple] = []
    runs = kquant_groups._chunk_runs
    monkeypatch.setattr(kquant_groups, "_chunk_runs", lambda g, order: probes.append(order) or runs(g, order))
    kquant_groups._chunk_order(g1)
    if qtype == Q.Q4_K:  # one term: no other form can do better, so none is searched
        assert probes == [(kquant_groups._WHOLE,)]


def test_affine_halves_take_three_products():
    """Q2_K's form (w = s q + lo per half of 16, q in 0..3, each half's step and minimum its own): three products,
    half 0's and half 1's codes with their scales and a term carrying half 0's offset; the weights exact before the
    kernel's bf16 scales and zeros, the product near float32's."""
    g = torch.Generator().manual_seed(13)
    q = torch.randint(0, 4, (48, 8, 2, 16), generator=g).float()
    q[..., 0], q[..., 1] = 0, 3
    s = torch.rand(48, 8, 2, 1, generator=g) * 1e-3 + 1e-4
    lo = -torch.rand(48, 8, 2, 1, generator=g) * 4e-3
    w = (s * q + lo).view(48, 256)
    runs = kquant_terms(w)
    assert [(a, b, len(t)) for a, b, t in runs] == [(0, 48, 3)]
    assert (rebuilt(runs, 48, 256) - w).abs().max() <= 1e-6 * w.abs().max()
    lin = Int4Linear.from_weight(w)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ref = x.float() @ w.t()
    assert (lin(x).float() - ref).abs().max() <= 0.02 * ref.abs().max()
    assert all(torch.equal(lin(x[i : i + 1]), lin(x)[i : i + 1]) for i in range(5))  # row-count invariant


def test_one_term_rows_among_two_term_rows_take_two_terms(monkeypatch):
    """Rows whose 5-bit groups happen to fit 16 levels (a Q4_1 file requantized to Q5_K_M by llama-quantize
    --allow-requantize) beside rows that do not: one run of two products, not a run (a product call a term) per row;
    a Q4_K tensor fused beside a Q5_K one keeps one product except in the recovery's chunk the two share."""
    g = torch.Generator().manual_seed(9)
    c = torch.randint(0, 32, (64, 8, 32), generator=g).float()
    c[0::2] = 2 * torch.randint(0, 16, (32, 8, 32), generator=g)  # even rows: every other level of 32
    c[:, :, 0], c[:, :, 1] = 0, 31 - (torch.arange(64) % 2 == 0).float().view(64, 1)  # groups span their levels
    s = torch.rand(64, 8, 1, generator=g) * 1e-3 + 1e-4
    w = (s * c - s * torch.randint(0, 32, (64, 8, 1), generator=g)).view(64, 256)
    runs = kquant_terms(w)
    assert [(a, b, len(t)) for a, b, t in runs] == [(0, 64, 2)]
    assert (rebuilt(runs, 64, 256) - w).abs().max() <= 1e-6 * w.abs().max()
    assert kquant_terms(w[0::2]) is not None and len(kquant_terms(w[0::2])[0][2]) == 1  # alone: one product
    lin = Int4Linear.from_weight(w)
    xs = torch.randn(3, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ref = xs.float() @ w.t()
    assert lin.runs is None and (lin(xs).float() - ref).abs().max() <= 0.02 * ref.abs().max()
    monkeypatch.setattr(int4_linear, "_CHUNK_ELEMENTS", 256 * 24)  # 24 rows a chunk: rows 48-71 hold both tensors
    fused = torch.cat([stored((64, 256), Q.Q4_K, 1), stored((32, 256), Q.Q5_K, 2)])
    runs = kquant_terms(fused)
    assert [(a, b, len(t)) for a, b, t in runs] == [(0, 48, 1), (48, 96, 2)]
    assert (rebuilt(runs, 96, 256) - fused).abs().max() <= 1e-6 * fused.abs().max()


def test_a_fused_projection_of_mixed_types_runs_by_rows(monkeypatch):
    """Q4_K_M's fused q / k / v: Q4_K q and k rows take one product, the Q6_K v rows four; each run's output equals
    the layer of its own rows bit for bit, rows are invariant to the rows beside them, and runs that cross chunks of
    the recovery are the same runs."""
    q, k, v = stored((64, 256), Q.Q4_K, 1), stored((32, 256), Q.Q4_K, 2), stored((32, 256), Q.Q6_K, 3)
    fused = torch.cat([q, k, v, q[:16]])  # a Q4_K run after the Q6_K one too
    lin = Int4Linear.from_weight(fused)
    assert [(a, b, len(t)) for a, b, t in lin.runs] == [(0, 96, 1), (96, 128, 4), (128, 144, 1)]
    assert len(lin.terms) == 6 and "in 3 runs of rows" in repr(lin)
    x = torch.randn(6, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y = lin(x)
    assert y.dtype == torch.float32 and y.shape == (6, 144)
    qk, vv = Int4Linear.from_weight(torch.cat([q, k])), Int4Linear.from_weight(v)
    assert torch.equal(y[:, :96], qk(x).float()) and torch.equal(y[:, 96:128], vv(x))
    assert torch.equal(y[:, 128:], y[:, :16])
    for m in (1, 2, 3, 5):
        assert all(torch.equal(lin(x[i : i + 1]), y[i : i + 1]) for i in range(m)), m
    whole = rebuilt(kquant_terms(fused), 144, 256)
    assert (whole - fused).abs().max() <= 1e-6 * fused.abs().max()
    monkeypatch.setattr(int4_linear, "_CHUNK_ELEMENTS", 256 * 24)  # 24 rows a chunk: runs cross chunks
    small = kquant_terms(fused)
    assert [(a, b, len(t)) for a, b, t in small] == [(0, 96, 1), (96, 128, 4), (128, 144, 1)]
    assert torch.equal(rebuilt(small, 144, 256), whole)


def test_the_searches_write_every_element_of_their_outputs():
    """The kernels are given uncleared arrays (kquant_groups.affine_groups, symmetric_halves): every element comes
    back written, for groups that fit and groups that do not (float rows: codes 0, not ok)."""
    w = torch.cat([stored((48, 512), Q.Q6_K, 5), torch.randn(8, 512, generator=torch.Generator().manual_seed(2))])
    whole, halves = w.reshape(-1, 32).numpy(), w.reshape(-1, 16).numpy()
    kernels = kquant_groups._kernels()
    codes, step, lo = (np.full(s, np.nan, np.float32) for s in (whole.shape, whole.shape[:1], whole.shape[:1]))
    ok = np.full(whole.shape[:1], 7, np.uint8)
    kernels.affine(whole, 256, codes, step, lo, ok)
    assert not np.isnan(codes).any() and not np.isnan(step).any() and not np.isnan(lo).any() and ok.max() <= 1
    assert not ok[48 * 16 :].any() and not codes[48 * 16 :].any()  # the float rows' groups
    codes, step = np.full(halves.shape, np.nan, np.float32), np.full(halves.shape[:1], np.nan, np.float32)
    ok = np.full(halves.shape[:1], 7, np.uint8)
    kernels.symmetric(halves, codes, step, ok)
    assert not np.isnan(codes).any() and not np.isnan(step).any() and ok.max() <= 1
    assert ok[: 48 * 32].all() and not ok[48 * 32 :].any() and not codes[48 * 32 :].any()  # Q6_K halves, not floats


def test_what_is_not_groups_is_not_taken(monkeypatch):
    g = torch.Generator().manual_seed(1)
    assert kquant_terms(torch.randn(32, 256, generator=g) * 0.05) is None  # float weights
    w = stored((32, 256), Q.Q4_K, 4)
    assert kquant_terms(torch.cat([w, torch.randn(1, 256, generator=g)])) is None  # one float row: none of it
    assert kquant_terms(w[:, :64]) is not None and kquant_terms(w[:, :48]) is None  # K a multiple of 32
    monkeypatch.setattr(kquant_groups, "_kernels", lambda: None)  # no numba: not taken, and the refusal says why
    assert kquant_terms(w) is None and Int4Linear.from_weight(w) is None
    with torch.no_grad():
        lin = torch.nn.Linear(256, 32, bias=False)
        lin.weight.copy_(w)
    model = torch.nn.ModuleDict({"lm_head": lin})
    with pytest.raises(ConfigError, match=r"K-quant and 5-bit groups need numba; lm_head \[32 x 256\] is none"):
        use_int4_weights(model)


# llama.cpp's mixes (its Q4_K_M / Q5_K_M: Q6_K for v, down and the embedding a tied head reads)
MIXES = {
    "Q4_K_M": {"token_embd": Q.Q6_K, "attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K, "attn_output": Q.Q4_K,
               "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K},
    "Q5_K_M": {"token_embd": Q.Q6_K, "attn_q": Q.Q5_K, "attn_k": Q.Q5_K, "attn_v": Q.Q6_K, "attn_output": Q.Q5_K,
               "ffn_gate": Q.Q5_K, "ffn_up": Q.Q5_0, "ffn_down": Q.Q6_K},
}


@pytest.mark.parametrize("use_kernels", [True, False], ids=["kernels", "modules"])
@pytest.mark.parametrize("mix", list(MIXES))
def test_a_kquant_llama_speculates_losslessly_on_the_4bit_path(tmp_path, mix, use_kernels, monkeypatch):
    """A GGUF Llama of a K-quant mix (tied head: the Q6_K embedding) on the 4-bit path: every projection converted
    (q / k / v in runs), its logits as near the float32 model's as a bf16 load's, and greedy chains and trees of one
    and two rows give plain decoding's tokens, through the numba layer steps and through the modules."""
    from eaglespec.engine import int4_step

    monkeypatch.setattr(int4_step, "USE_KERNELS", use_kernels)
    path = tmp_path / f"{mix}.gguf"
    write_tiny_gguf(path, types=MIXES[mix], hidden=256, heads=4, kv_heads=2, ffn=512, vocab=64, tied=True)
    dense = load_model(path, dtype=torch.float32).model
    target = prepare_for_inference(load_model(path, dtype=torch.float32).model, CPU, None, None, int4=True)
    assert target.int4_steps == (2 if use_kernels else 0)
    qkv = target.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, Int4Linear) and [len(t) for _, _, t in qkv.runs] == [1 if mix == "Q4_K_M" else 2, 4]
    assert len(target.lm_head.terms) == 4  # the Q6_K embedding as the tied head
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    want, got = plain_logits(dense, ids), plain_logits(target, ids).float()
    bf16 = plain_logits(load_model(path, dtype=torch.bfloat16).model, ids).float()  # the same file, dense in bf16
    assert (got - want).abs().max() <= (bf16 - want).abs().max()  # as near float32's as a bf16 load (~7% of max)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    drafter = prepare_for_inference(tiny_drafter(target, seed=1, hidden=256).to(torch.bfloat16), CPU, None, None)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompts = [[5, 17, 3, 9], [11, 2, 40, 7, 7, 1, 30]]
    for batch in ([prompts[0]], prompts):
        plain = assert_speculation_equals_plain(target, drafter, batch, params,
                                                [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)])
        assert all(len(set(p)) > 3 for p in plain)  # not a degenerate loop
