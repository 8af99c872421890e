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
    qt, nb, per, nsplit = mk.plan(B, T, H, K, 64 if dtype == torch.bfloat16 else 32)
    assert qt == -(-T * H // mk.BLOCK_Q) and per * nsplit >= nb and (nsplit == 1 or target > 1)


def test_the_plan_fills_the_chip_with_splits_of_several_blocks():
    """A one-token step of 64 heads over 4,096 positions is spread over splits of >= MIN_SPLIT_BLOCKS blocks; a short
    context stays one split; a step of many query tiles takes fewer splits."""
    assert mk.plan(1, 1, 64, 4096, 64) == (4, 64, 4, 16)  # 4 tiles x 16 splits of 4 blocks
    assert mk.plan(1, 1, 64, 200, 64) == (4, 4, 4, 1)
    assert mk.plan(1, 8, 64, 4096, 64) == (32, 64, 16, 4)  # 32 tiles: 5 splits wanted, of 16 blocks (a power of 2)
    assert mk.plan(1, 1, 4, 1 << 20, 64)[3] == mk.MAX_SPLITS
    assert mk.fits(1, 64, 512, 64, torch.bfloat16) and mk.fits(64, 64, 512, 64, torch.float32)
    assert not mk.fits(65, 64, 512, 64, torch.bfloat16)  # longer steps keep SDPA
    assert not mk.fits(1, 16, 16, 8, torch.bfloat16) and not mk.fits(1, 16, 48, 16, torch.bfloat16)  # not powers of 2


def test_blocks_fit_the_devices_shared_memory(monkeypatch):
    """The block of cached positions by the device's shared memory: as measured on an H100 (64 bf16, 32 float32),
    smaller on smaller GPUs, and a step the device cannot hold keeps the eager path (`fits` says no)."""
    H100, A100, SMALL = 232448, 166912, 101376
    assert [mk.block_kv(512, 64, 2, lim) for lim in (None, H100, A100, SMALL)] == [64, 64, 64, 32]
    assert [mk.block_kv(512, 64, 4, lim) for lim in (None, H100, A100, SMALL)] == [32, 32, 16, None]
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
