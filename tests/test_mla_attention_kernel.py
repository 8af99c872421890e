"""MLA's absorbed attention over the latent cache as Triton kernels (layers/mla_attention_kernel.py,
engine.transforms.use_mla_kernel) under Triton's interpreter: the kernels against a float32 softmax reference
(splits, skipped blocks, rows that see nothing), an MLAttention with the kernel against its eager paths, and a
DeepSeek-V3 target whose MLA layers take the kernel: plain decoding and speculation on the static path give the
untransformed engine's greedy tokens."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny import tiny_drafter, tiny_moe  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.cuda_graphs import GraphCache  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import use_mla_kernel  # noqa: E402
from eaglespec.layers import mla_attention_kernel as mk  # noqa: E402
from eaglespec.layers.attention import AttentionKernel  # noqa: E402
from eaglespec.layers.mla import MLAttention  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402


def _reference(q_lat, q_pe, cache, rows, mask, scale) -> torch.Tensor:
    """Softmax attention in float32 over each row's cache prefix: keys [c, k_pe], values c; 0 where nothing is seen."""
    R, K = q_lat.shape[-1], mask.shape[-1]
    lat = cache[rows, :K].float()  # [B, K, R + P]
    s = torch.einsum("bthd,bkd->bthk", torch.cat([q_lat, q_pe], -1).float(), lat) * scale
    p = torch.softmax(s.masked_fill(~mask[:, :, None], float("-inf")), -1)
    return torch.nan_to_num(torch.einsum("bthk,bkr->bthr", p, lat[..., :R]), nan=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,T,H,K,target", [(1, 1, 4, 5, 132), (2, 3, 8, 150, 132), (2, 3, 8, 150, 1),
                                            (3, 2, 4, 300, 132), (1, 1, 16, 200, 132)])
def test_the_kernels_compute_softmax_attention_over_the_latents(dtype, B, T, H, K, target, monkeypatch):
    """Against the float32 reference: one split and several (TARGET_PROGRAMS 1 keeps one), cache rows out of order,
    blocks nobody sees (a row masked whole gives 0), head-major queries read in place, float32 to rounding, bf16 to
    its output's rounding."""
    monkeypatch.setattr(mk, "TARGET_PROGRAMS", target)
    R, P = 32, 16
    g = torch.Generator().manual_seed(B * 1000 + K)
    cache = torch.randn(5, K + 10, R + P, generator=g).to(dtype)
    rows = torch.tensor([4, 1, 2][:B])
    q_lat = torch.randn(H, B, T, R, generator=g).to(dtype).permute(1, 2, 0, 3)  # head-major, as einsum's of T > 1
    q_pe = torch.randn(B, T, H, P, generator=g).to(dtype)
    mask = torch.rand(B, T, K, generator=g) < 0.7
    mask[-1, -1] = False  # this query sees nothing
    if K > 128:
        mask[0, :, 64:128] = False  # a whole block no query of row 0 sees
    out = mk.mla_attention(q_lat, q_pe, cache, rows, mask, 0.3)
    ref = _reference(q_lat, q_pe, cache, rows, mask, 0.3)
    assert out.dtype == dtype and out.shape == (B, T, H, R)
    assert torch.equal(out[-1, -1], torch.zeros_like(out[-1, -1]))
    if dtype == torch.float32:
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
    else:  # probabilities enter the output product in bf16, and the output is rounded once
        assert torch.allclose(out.float(), ref, rtol=2.0**-6, atol=2.0**-6)
    bq = mk.query_tile(T, H, K)[0]
    qt, nb, per, nsplit = mk.plan(B, T, H, K, 64 if dtype == torch.bfloat16 else 32, bq)
    assert qt == -(-T * H // bq) and per * nsplit >= nb and (nsplit == 1 or target > 1)


def test_the_plan_fills_the_chip_with_splits_of_several_blocks():
    """A one-token step of 64 heads over 4,096 positions is spread over splits of >= MIN_SPLIT_BLOCKS blocks; a short
    context stays one split; a step of many query tiles takes fewer splits."""
    assert mk.plan(1, 1, 64, 4096, 64, 16) == (4, 64, 4, 16)  # 4 tiles x 16 splits of 4 blocks
    assert mk.plan(1, 1, 64, 200, 64, 16) == (4, 4, 4, 1)
    assert mk.plan(1, 8, 64, 4096, 64, 16) == (32, 64, 16, 4)  # 32 tiles: 5 splits wanted, of 16 blocks (a power of 2)
    assert mk.plan(1, 8, 64, 4096, 64, 64) == (8, 64, 4, 16)  # 8 tiles of 64 rows: 16 splits
    assert mk.plan(1, 1, 4, 1 << 20, 64, 16)[3] == mk.MAX_SPLITS
    assert mk.fits(1, 64, 512, 64, torch.bfloat16) and mk.fits(64, 64, 512, 64, torch.float32)
    assert not mk.fits(65, 64, 512, 64, torch.bfloat16)  # longer steps keep SDPA
    assert not mk.fits(1, 16, 16, 8, torch.bfloat16) and not mk.fits(1, 16, 48, 16, torch.bfloat16)  # not powers of 2


def test_query_tiles_grow_with_the_steps_work(monkeypatch):
    """The tile of query rows by T * H * K, as session 59 measured on an H100 (64 heads): 16 rows for a decode step
    and short verifies, 32 for an 8-token verify over 2,048 positions, 64 for 8 tokens over 4,096 and 48 over 1,024;
    `BLOCK_Q` set overrides it (the benchmarks' A/B)."""
    assert [mk.query_tile(T, 64, K) for T, K in ((1, 4096), (4, 1024), (8, 1024), (16, 256))] == [(16, 4)] * 4
    assert [mk.query_tile(T, 64, K) for T, K in ((4, 4096), (8, 2048), (16, 1024), (48, 256))] == [(32, 8)] * 4
    assert [mk.query_tile(T, 64, K) for T, K in ((8, 4096), (16, 4096), (48, 1024))] == [(64, 8)] * 3
    monkeypatch.setattr(mk, "BLOCK_Q", 32)
    assert mk.query_tile(1, 64, 256) == (32, 4)


@pytest.mark.parametrize("tile", [16, 32, 64])
def test_every_query_tile_gives_the_same_attention(monkeypatch, tile):
    """One step through each tile (`BLOCK_Q` forced): the float32 reference's output, tiles past the query rows
    masked (T * H = 40 rows)."""
    monkeypatch.setattr(mk, "BLOCK_Q", tile)
    R, P, B, T, H, K = 32, 16, 2, 5, 8, 150
    g = torch.Generator().manual_seed(tile)
    cache = torch.randn(3, K + 4, R + P, generator=g)
    rows, mask = torch.tensor([2, 0]), torch.rand(B, T, K, generator=g) < 0.6
    q_lat, q_pe = torch.randn(B, T, H, R, generator=g), torch.randn(B, T, H, P, generator=g)
    out = mk.mla_attention(q_lat, q_pe, cache, rows, mask, 0.2)
    assert torch.allclose(out, _reference(q_lat, q_pe, cache, rows, mask, 0.2), rtol=1e-5, atol=1e-5)


def test_a_tile_past_the_shared_memory_falls_back_to_the_least(monkeypatch):
    """Where the chosen tile's block would not fit the device (a small GPU, a large tile), the step takes the least
    tile, which `fits` checked, and still attends right."""
    monkeypatch.setattr(mk, "QUERY_TILES", ((0, 16, 4), (None, 64, 8)))  # every step asks for 64 rows
    monkeypatch.setattr(mk, "shared_limit", lambda device: 15000)  # R 32, P 16, float32: 16 rows fit, 64 do not
    tiles = []
    plan = mk.plan
    monkeypatch.setattr(mk, "plan", lambda *a: tiles.append(a[-1]) or plan(*a))
    g = torch.Generator().manual_seed(7)
    cache, rows, mask = torch.randn(1, 40, 48, generator=g), torch.tensor([0]), torch.ones(1, 2, 40, dtype=torch.bool)
    q_lat, q_pe = torch.randn(1, 2, 4, 32, generator=g), torch.randn(1, 2, 4, 16, generator=g)
    out = mk.mla_attention(q_lat, q_pe, cache, rows, mask, 0.2)
    assert tiles == [16] and mk.block_kv(32, 16, 4, 15000, 64) is None
    assert torch.allclose(out, _reference(q_lat, q_pe, cache, rows, mask, 0.2), rtol=1e-5, atol=1e-5)


def test_blocks_fit_the_devices_shared_memory(monkeypatch):
    """The block of cached positions by the device's shared memory: as measured on an H100 (64 bf16, 32 float32),
    smaller on smaller GPUs, and a step the device cannot hold keeps the eager path (`fits` says no)."""
    H100, A100, SMALL = 232448, 166912, 101376
    assert [mk.block_kv(512, 64, 2, lim) for lim in (None, H100, A100, SMALL)] == [64, 64, 64, 32]
    assert [mk.block_kv(512, 64, 4, lim) for lim in (None, H100, A100, SMALL)] == [32, 32, 16, None]
    assert [mk.block_kv(512, 64, 2, H100, bq) for bq in (16, 32, 64)] == [64, 64, 64]  # every tile, bf16, an H100
    assert mk.block_kv(512, 64, 2, SMALL, 32) == 16 and mk.block_kv(512, 64, 2, SMALL, 64) is None
    monkeypatch.setattr(mk, "shared_limit", lambda device: SMALL)
    cuda = torch.device("cuda")
    assert mk.fits(1, 64, 512, 64, torch.bfloat16, cuda) and not mk.fits(1, 64, 512, 64, torch.float32, cuda)
    assert mk.fits(1, 64, 512, 64, torch.float32)  # no device: the shape alone


def _deepseek(seed: int = 0) -> torch.nn.Module:
    """A tiny DeepSeek-V3 whose MLA has a latent rank and rope dim the kernel takes (32, 16)."""
    return tiny_moe("deepseek_v3", seed, num_hidden_layers=2, kv_lora_rank=32, qk_rope_head_dim=16)


PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40))]


def test_mla_targets_with_the_kernel_speculate_as_plain(monkeypatch):
    """`use_mla_kernel` on a DeepSeek-V3 target: decode, chain verify and tree verify steps take the kernel (the spy
    sees 1, 4 and 6 query tokens; prefills keep the eager path), and greedy decoding and speculation on the static
    path give the untransformed engine's tokens."""
    target = _deepseek()
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    cfg = EngineConfig(max_batch_size=4)
    ref = [o.token_ids for o in Engine(target, None, cfg).generate(PROMPTS, params)]
    drafter = tiny_drafter(target, seed=1, hidden=target.config.hidden_size)
    use_mla_kernel(target)
    attn = [m for m in target.modules() if isinstance(m, MLAttention)]
    assert attn and all(m.attn_kernel.run is mk.mla_attention and m.attn_kernel.fits is mk.fits for m in attn)
    tokens_seen: set[int] = set()

    def spy(q_lat, *args):
        tokens_seen.add(q_lat.shape[1])
        return mk.mla_attention(q_lat, *args)

    for m in attn:
        m.attn_kernel = AttentionKernel(spy, mk.fits)
    for spec in (None, SpecConfig(steps=3, topk=1, draft_tokens=4), SpecConfig(steps=3, topk=2, draft_tokens=6)):
        eng = Engine(target, None, cfg, drafter=drafter if spec else None, spec=spec)
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
        assert [o.token_ids for o in eng.generate(PROMPTS, params)] == ref
    assert {1, 4, 6} <= tokens_seen and max(tokens_seen) <= mk.MAX_QUERY_TOKENS


@torch.no_grad()
def test_an_mla_layer_with_the_kernel_equals_its_eager_paths(monkeypatch):
    """One layer's forward over a cache: the kernel path gives the eager absorbed and plain paths' output (float32)."""
    from eaglespec.layers.context import ForwardContext

    target = _deepseek(seed=3)
    attn = target.model.layers[0].self_attn
    B, T, S = 2, 3, 40
    x = torch.randn(B, T, 32, generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([20, 7])
    positions = lens[:, None] + torch.arange(T)[None, :]
    K = int(lens.max()) + T
    mask = torch.arange(K)[None, None, :] <= positions[:, :, None]  # each row's prefix and its own causal tokens
    cos, sin = target.model.rotary(positions)
    outs = []
    for kernel, absorb in ((None, True), (None, False), (mk.mla_attention, None)):
        cache = torch.randn(4, S, 48, generator=torch.Generator().manual_seed(1))  # the prefixes' entries
        ctx = ForwardContext(positions=positions, write_index=positions, attn_mask=mask, rows=torch.tensor([3, 0]))
        attn.attn_kernel, attn.absorb = AttentionKernel(kernel, mk.fits) if kernel else None, absorb
        outs.append(attn(x, cos, sin, ctx, [cache]))
    assert torch.allclose(outs[2], outs[0], rtol=1e-5, atol=1e-5) and torch.allclose(outs[2], outs[1], atol=1e-4)
