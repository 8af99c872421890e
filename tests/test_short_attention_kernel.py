"""The split-K short-query attention Triton kernels, run by Triton's interpreter on the CPU, against SDPA."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402

from eaglespec.layers.attention import sdpa  # noqa: E402
from eaglespec.layers.short_attention_kernel import BLOCK_KV, fits, short_attention  # noqa: E402


def _case(B, T, H, Hkv, D, K, seed):
    g = torch.Generator().manual_seed(seed)
    Bc, S = B + 2, K + 16
    q = torch.randn(B, T, H, D, generator=g)
    kc, vc = torch.randn(Bc, S, Hkv, D, generator=g), torch.randn(Bc, S, Hkv, D, generator=g)
    rows = torch.randperm(Bc, generator=g)[:B]
    lens = torch.randint(1, K - T + 1, (B,), generator=g)
    # a prefix of lens[b] positions, then T new tokens in a random tree-like pattern (each sees itself)
    mask = torch.zeros(B, T, K, dtype=torch.bool)
    for b in range(B):
        mask[b, :, : lens[b]] = True
        tail = torch.rand(T, T, generator=g) < 0.5
        tail = tail.tril() | torch.eye(T, dtype=torch.bool)
        mask[b, :, lens[b] : lens[b] + T] = tail
    return q, kc, vc, rows, mask


def _reference(q, kc, vc, rows, mask, scale=None):
    K = mask.shape[-1]
    return sdpa(q, kc[rows, :K], vc[rows, :K], mask, scale)


@pytest.mark.parametrize("B,T,H,Hkv,D,K", [(1, 1, 9, 3, 64, 200), (2, 4, 9, 3, 64, 3 * BLOCK_KV), (3, 5, 4, 1, 16, 70),
                                           (1, 16, 8, 2, 32, 130)])
def test_matches_sdpa(B, T, H, Hkv, D, K):
    q, kc, vc, rows, mask = _case(B, T, H, Hkv, D, K, seed=B * 100 + T)
    assert fits(B, T, H, Hkv, D)
    out = short_attention(q, kc, vc, rows, mask)
    assert out.shape == q.shape
    assert torch.allclose(out, _reference(q, kc, vc, rows, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("B,T,H,Hkv,D,K", [(1, 1, 4, 2, 16, 100), (2, 3, 4, 2, 16, 3 * BLOCK_KV),
                                           (1, 40, 4, 1, 16, 3 * BLOCK_KV), (2, 40, 4, 1, 16, 90)])
@pytest.mark.parametrize("sinks,softcap", [(True, None), (False, 2.0), (True, 2.0)])
def test_sinks_and_soft_caps_match_the_written_out_attention(B, T, H, Hkv, D, K, sinks, softcap):
    """gpt-oss's per-head sink logits and Gemma 2's soft-capped scores in the kernels (one split that stores the
    output, several merged by the combine, a one-row step of 160 query rows in query tiles, and the prompt kernel):
    `attention.sdpa_written_out`'s output, with a row that sees nothing giving 0; the cap small enough to bite (scores
    of std 2 capped at 2), the sinks large enough to take much of the probability."""
    from eaglespec.layers.attention import sdpa_written_out

    q, kc, vc, rows, mask = _case(B, T, H, Hkv, D, K, seed=T * 10 + K)  # scores of std 2 at scale 0.5
    sink = 6 + torch.randn(H, generator=torch.Generator().manual_seed(K)) if sinks else None
    out = short_attention(q, kc, vc, rows, mask, 0.5, sinks=sink, softcap=softcap)
    want = sdpa_written_out(q, kc[rows, :K], vc[rows, :K], mask, 0.5, sink, softcap)
    assert torch.allclose(out, want, atol=2e-5, rtol=2e-5)
    plain = short_attention(q, kc, vc, rows, mask, 0.5)
    assert not torch.allclose(out, plain, atol=1e-3, rtol=1e-3)  # the terms matter here


def test_one_token_rows_past_the_batch_limit():
    """Decode steps of more rows than MAX_BATCH (regeneration's): rows of very different lengths in one step, some
    seeing a single block of a long cache (the skipped blocks), in rows taken out of order."""
    from eaglespec.layers.short_attention_kernel import MAX_BATCH

    B = MAX_BATCH + 8
    q, kc, vc, rows, mask = _case(B, 1, 9, 3, 16, 3 * BLOCK_KV, seed=11)
    mask[: B // 2, :, BLOCK_KV:] = False  # half the rows see the first block only
    assert fits(B, 1, 9, 3, 16)
    out = short_attention(q, kc, vc, rows, mask)
    assert torch.allclose(out, _reference(q, kc, vc, rows, mask), atol=1e-5, rtol=1e-5)


def test_scale_and_skipped_blocks():
    """A custom scale, and cache blocks that no query sees (only the first and the last block are visible)."""
    q, kc, vc, rows, mask = _case(1, 2, 4, 2, 16, 4 * BLOCK_KV, seed=7)
    mask[:] = False
    mask[..., :5] = True
    mask[0, 1, -3:] = True
    out = short_attention(q, kc, vc, rows, mask, scale=0.3)
    assert torch.allclose(out, _reference(q, kc, vc, rows, mask, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_kv,skip_min_rows,unroll_max,K", [(64, 1, 0, 320), (128, 2, 16, 320), (128, 3, 0, 320),
                                                                (128, 2, 16, 100), (128, 3, 16, 100)])
def test_split_settings_match_sdpa(monkeypatch, block_kv, skip_min_rows, unroll_max, K):
    """Blocks of 64 / 128 positions; blocks no query sees skipped (2 rows >= SKIP_MIN_ROWS) or read beside their mask
    (the cache holds finite values: hidden scores are -inf); the combine's loop unrolled or not; one split that writes
    the output itself (K <= BLOCK_KV: no combine). Each equals SDPA, with row 0 shorter than the bucket."""
    from eaglespec.layers import short_attention_kernel as sak

    monkeypatch.setattr(sak, "BLOCK_KV", block_kv)
    monkeypatch.setattr(sak, "SKIP_MIN_ROWS", skip_min_rows)
    monkeypatch.setattr(sak, "UNROLL_MAX_SPLITS", unroll_max)
    B, T, H, Hkv, D = 2, 3, 4, 2, 16
    q, kc, vc, rows, mask = _case(B, T, H, Hkv, D, K, seed=block_kv + skip_min_rows + K)
    mask[0, :, K // 3 :] = False  # row 0 sees its first third only (and its tree inside it)
    mask[0, :, K // 3 - T : K // 3] = torch.ones(T, T, dtype=torch.bool).tril()
    out = short_attention(q, kc, vc, rows, mask)
    assert torch.allclose(out, _reference(q, kc, vc, rows, mask), atol=1e-5, rtol=1e-5)


def _launches(monkeypatch) -> list[str]:
    """The names of the kernels `short_attention` launches from now on, in order."""
    from eaglespec.layers import short_attention_kernel as sak

    built, names = sak._kernels(), []

    class Spy:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            names.append(self.name)
            return self.kernel[grid]

    spies = tuple(Spy(n, k) for n, k in zip(("split", "combine", "prompt"), built))
    monkeypatch.setattr(sak, "_kernels", lambda: spies)
    return names


@pytest.mark.parametrize("B,T,H,Hkv,D,K", [(1, 90, 9, 3, 64, 90), (2, 40, 9, 3, 64, 3 * BLOCK_KV + 5),
                                           (1, 70, 4, 1, 16, 200)])
def test_prompts_match_sdpa(monkeypatch, B, T, H, Hkv, D, K):
    """Prompts (T * G > 64 query rows in a step of several rows, > 256 in a one-row step): tiles of 64 rows, each
    looping over the cache with an online softmax; a prompt right-padded in its bucket (causal over the bucket, as
    prefill graphs run), or appended after a cached prefix in a tree-like pattern."""
    q, kc, vc, rows, mask = _case(B, T, H, Hkv, D, max(K, T + 1), seed=T)
    assert fits(B, T, H, Hkv, D) and T * (H // Hkv) > 64
    if K == T:  # a causal prompt from position 0
        mask = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T).contiguous()
    launched = _launches(monkeypatch)
    out = short_attention(q, kc, vc, rows, mask)
    assert launched == ["prompt"]
    assert torch.allclose(out, _reference(q, kc, vc, rows, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T,H,Hkv,D,K,kernels", [(48, 9, 3, 64, 3 * BLOCK_KV - 7, ["split", "combine"]),
                                                 (30, 8, 2, 16, 100, ["split"]),
                                                 (64, 9, 3, 32, 64, ["split"])])
def test_one_row_steps_of_many_query_rows_take_the_split_kernels_in_tiles(monkeypatch, T, H, Hkv, D, K, kernels):
    """A one-row step of 65-256 query rows (a tree's verify: S6 K8 D48 is 144 rows for SmolLM2) runs the split
    kernels over query tiles of 64 rows: every tile of every kv head against each block, the last tile part
    padding, merged by the combine where the cache spans several blocks, else stored directly; a causal prompt of
    192 rows too. Each equals SDPA."""
    q, kc, vc, rows, mask = _case(1, T, H, Hkv, D, max(K, T + 1), seed=T + K)
    if K == T:
        mask = torch.ones(T, T, dtype=torch.bool).tril()[None].contiguous()
    assert 64 < T * (H // Hkv) <= 256
    launched = _launches(monkeypatch)
    out = short_attention(q, kc, vc, rows, mask)
    assert launched == kernels
    assert torch.allclose(out, _reference(q, kc, vc, rows, mask), atol=1e-5, rtol=1e-5)


def test_sdpa_with_repeated_kv_heads_equals_gqa(monkeypatch):
    """Eager CUDA calls of `sdpa` repeat each KV head for its query heads (SDPA's GQA with a mask would take the math
    backend there): forced here on the CPU, the result equals SDPA's own GQA."""
    from eaglespec.layers import attention

    q, kc, vc, rows, mask = _case(3, 4, 9, 3, 16, 40, seed=5)
    want = _reference(q, kc, vc, rows, mask)
    monkeypatch.setattr(attention, "_repeat_kv_heads", lambda q: True)
    got = _reference(q, kc, vc, rows, mask)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-6)


def test_limits(monkeypatch):
    from eaglespec.layers import short_attention_kernel as sak

    assert fits(1, 32, 9, 3, 64) and fits(1, 512, 9, 3, 64)  # 96 query rows: a prompt
    assert not fits(1, 513, 9, 3, 64)  # longer prompts keep SDPA
    # float32 steps of more than 16 query rows keep SDPA (the kernels' IEEE float32 tiles spill past them on the
    # H200); bf16 and a float32 chain's verify of 4 tokens (12 query rows) do not
    assert fits(1, 48, 9, 3, 64, torch.bfloat16) and fits(1, 8, 9, 3, 64, torch.bfloat16)
    assert fits(1, 5, 9, 3, 64, torch.float32) and not fits(1, 6, 9, 3, 64, torch.float32)
    assert not fits(1, 48, 9, 3, 64, torch.float32) and fits(1, 48, 9, 3, 64)
    monkeypatch.setattr(sak, "FLOAT32_MAX_QUERY_ROWS", None)
    assert fits(1, 48, 9, 3, 64, torch.float32) and fits(1, 8, 9, 3, 64, torch.float32)
    assert fits(32, 2, 9, 3, 64) and not fits(33, 2, 9, 3, 64)  # batch, for several query tokens
    assert fits(33, 1, 9, 3, 64) and fits(1024, 1, 9, 3, 64)  # one query token: any batch
    assert not fits(1, 1, 9, 3, 48)  # head dim not a power of two


def _engine_through_the_kernel_equals_plain(monkeypatch, record, target, prompts, max_new_tokens,
                                            drafter_too: bool, drafter_kw: dict | None = None,
                                            spec: tuple[int, int, int] = (3, 1, 4)) -> None:
    """`target` (and, `drafter_too`, its drafter) with the fused RoPE + KV-store and short-query kernels, every call of
    the kernel passed to `record(q, kwargs)` first, float32 steps taking it as bf16 ones do: greedy speculation (`spec`,
    default the chain 3,1,4) and plain decoding equal the eager engine's plain decoding."""
    from tiny import assert_transformed_engine_equals_plain

    from eaglespec.config import SpecConfig
    from eaglespec.engine.transforms import fuse_projections, use_rope_store_kernel, use_short_attention_kernel
    from eaglespec.layers import short_attention_kernel as sak
    from eaglespec.layers.attention import AttentionKernel

    monkeypatch.setattr(sak, "FLOAT32_MAX_QUERY_ROWS", None)  # float32 as bf16 (the GPU gives wider steps SDPA)

    def counted(q, *a, **kw):
        record(q, kw)
        return sak.short_attention(q, *a, **kw)

    def prepare(target, drafter):
        for m in (target, drafter) if drafter_too else (target,):
            use_short_attention_kernel(use_rope_store_kernel(fuse_projections(m)))
            for mod in m.modules():
                if getattr(mod, "attn_kernel", None) is not None:
                    mod.attn_kernel = AttentionKernel(counted, sak.fits)

    assert_transformed_engine_equals_plain(prepare, SpecConfig(*spec), prompts, max_new_tokens,
                                           drafter_kw=drafter_kw, target=target)


def test_one_row_tree_verify_in_query_tiles_through_the_engine(monkeypatch):
    """A one-row engine speculating with a tree of 40 tokens (80 query rows on a tiny model: 2 query heads per kv
    head) verifies through the split kernels in query tiles, and its greedy tokens equal plain decoding's."""
    from tiny import tiny_llama

    launched, steps = _launches(monkeypatch), []

    def record(q, kw):
        steps.append((q.shape[0], q.shape[1], len(launched)))

    _engine_through_the_kernel_equals_plain(monkeypatch, record, tiny_llama(seed=0, layers=2), [[3, 1, 4, 1, 5]], 6,
                                            drafter_too=False, spec=(5, 8, 40))
    verify = [i for i, (B, T, _) in enumerate(steps) if (B, T) == (1, 40)]
    assert verify  # the verify's calls, then what each launched
    ends = [n for _, _, n in steps[1:]] + [len(launched)]
    assert all(launched[steps[i][2]:ends[i]] in (["split"], ["split", "combine"]) for i in verify)


@pytest.mark.parametrize("family", ["gpt_oss", "softcap"])
def test_engines_with_sinks_or_soft_caps_in_the_kernel_equal_plain(monkeypatch, family):
    """gpt-oss's sinks (with its windows) and soft-capped scores (a tiny Llama's layers given Gemma 2's cap) through
    the fused RoPE + KV-store and short-query kernels in the whole engine (float32): decode and verify steps take the
    kernel with the layer's terms, and greedy speculation equals the eager engine's plain decoding."""
    from tiny import tiny_llama, tiny_moe

    terms = []
    target = tiny_moe("gpt_oss") if family == "gpt_oss" else tiny_llama(seed=0, layers=3)  # 3 layers: interpreted
    if family == "softcap":
        for layer in target.model.layers:
            layer.self_attn.softcap = 1.5
    _engine_through_the_kernel_equals_plain(
        monkeypatch, lambda q, kw: terms.append((kw["sinks"] is not None, kw["softcap"])), target,
        [[1, 2, 3, 4], list(range(10, 15)), list(range(20, 40))], 12, drafter_too=False,
        drafter_kw={"hidden": target.config.hidden_size})
    assert terms and set(terms) == ({(True, None)} if family == "gpt_oss" else {(False, 1.5)})


def test_engine_with_the_kernel_equals_plain(monkeypatch):
    """The kernels in the target's and the drafter's attention (with the fused RoPE + KV-store kernel) through the
    whole engine (float32): decode, verify and drafter steps take them; greedy speculation equals plain decoding."""
    from tiny import tiny_llama

    calls = []
    # three layers, not tiny_llama's six: every step runs the kernels in Triton's interpreter
    _engine_through_the_kernel_equals_plain(monkeypatch, lambda q, kw: calls.append(q.shape[1]),
                                            tiny_llama(seed=0, layers=3),
                                            [[1, 2, 3, 4], list(range(10, 15)), list(range(20, 54))], 8,
                                            drafter_too=True)
    # decode / draft steps (1 token), verify (4 tokens), and prompts: 34 tokens take the prompt kernel (tiny models
    # have 2 query heads per kv head: 68 query rows), in the target's prefill and the drafter's catch-up
    assert {1, 4, 34} <= set(calls)
