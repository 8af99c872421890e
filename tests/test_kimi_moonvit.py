"""MoonViT pieces against straightforward references written here: 2-D RoPE (explicit per-patch rotation), the
position-embedding interpolation (identity at the native size, PyTorch's bicubic kernel by hand elsewhere), the patch
embedding (a convolution), per-image attention, the 2 x 2 merger, the projector, the config keys, and the image
preprocessing. (Whole-model parity with transformers' Kimi-K2.5, vision included, is in test_kimi_k25.py.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from eaglespec.errors import ConfigError
from eaglespec.layers.rotary import apply_rotary
from eaglespec.loading.image import ImageProcessorConfig, navit_resize, preprocess_image
from eaglespec.models.moonvit import (
    Learnable2DInterpPosEmb,
    MoonViT,
    MoonViTConfig,
    MoonVisionPatchEmbed,
    PatchMergerMLP,
    Rope2DPosEmb,
    tpool_patch_merger,
)

CFG = MoonViTConfig(patch_size=14, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48,
                    pos_emb_height=8, pos_emb_width=8, text_hidden_size=64)


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def _randomize(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))


def test_rope_2d_matches_explicit_rotation():
    hd, theta = 8, 10000.0
    rope = Rope2DPosEmb(hd, theta)
    grid = [(3, 5), (2, 4)]
    cos, sin = rope(grid, torch.device("cpu"))
    x = torch.randn(sum(h * w for h, w in grid), 2, hd, generator=torch.Generator().manual_seed(0))
    got = apply_rotary(x[None], cos[None], sin[None], interleaved=True)[0]
    ref = torch.empty_like(x)
    k = 0
    for h, w in grid:
        for r in range(h):
            for c in range(w):
                for j in range(hd // 2):  # pair j = elements (2j, 2j+1): even pairs turn with the column
                    pos = c if j % 2 == 0 else r
                    a = pos * theta ** (-4 * (j // 2) / hd)
                    rot = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
                    ref[k, :, 2 * j : 2 * j + 2] = x[k, :, 2 * j : 2 * j + 2] @ rot.T
                k += 1
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_rope_2d_scores_depend_on_offsets_only():
    hd = 8
    rope = Rope2DPosEmb(hd)
    cos, sin = rope([(6, 7)], torch.device("cpu"))
    q, k = torch.randn(2, 1, 1, hd, generator=torch.Generator().manual_seed(1)).unbind(0)

    def score(a: tuple[int, int], b: tuple[int, int]) -> float:
        ia, ib = a[0] * 7 + a[1], b[0] * 7 + b[1]
        qa = apply_rotary(q[None], cos[None, ia : ia + 1], sin[None, ia : ia + 1], interleaved=True)
        kb = apply_rotary(k[None], cos[None, ib : ib + 1], sin[None, ib : ib + 1], interleaved=True)
        return float((qa * kb).sum())

    assert score((0, 1), (2, 4)) == pytest.approx(score((3, 2), (5, 5)), abs=1e-5)
    assert score((0, 1), (2, 4)) != pytest.approx(score((0, 1), (4, 2)), abs=1e-3)  # rows and columns differ


def _bicubic_reference(grid: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """PyTorch's bicubic (align_corners=False, A = -0.75, borders clamped), one output pixel at a time."""
    A = -0.75

    def weights(t: float) -> list[float]:
        def near(x):  # |x| <= 1
            return ((A + 2) * x - (A + 3)) * x * x + 1

        def far(x):  # 1 < |x| < 2
            return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

        return [far(t + 1), near(t), near(1 - t), far(2 - t)]

    H, W, D = grid.shape
    out = np.zeros((out_h, out_w, D))
    for oy in range(out_h):
        sy = (oy + 0.5) * H / out_h - 0.5
        y0, ty = math.floor(sy), sy - math.floor(sy)
        for ox in range(out_w):
            sx = (ox + 0.5) * W / out_w - 0.5
            x0, tx = math.floor(sx), sx - math.floor(sx)
            for i, wy in enumerate(weights(ty)):
                for j, wx in enumerate(weights(tx)):
                    yy = min(max(y0 - 1 + i, 0), H - 1)
                    xx = min(max(x0 - 1 + j, 0), W - 1)
                    out[oy, ox] += wy * wx * grid[yy, xx]
    return out


def test_position_embedding_interpolation():
    pe = Learnable2DInterpPosEmb(4, 4, 3)
    with torch.no_grad():
        pe.weight.copy_(torch.randn(4, 4, 3, generator=torch.Generator().manual_seed(2)))
    assert torch.equal(pe.grid(4, 4), pe.weight.flatten(0, 1))  # native size: the table itself, row-major
    for h, w in ((3, 5), (6, 2), (8, 8)):
        got = pe.grid(h, w)
        assert got.shape == (h * w, 3)
        ref = _bicubic_reference(pe.weight.detach().numpy().astype(np.float64), h, w).reshape(h * w, 3)
        np.testing.assert_allclose(got.detach().numpy(), ref, rtol=1e-5, atol=1e-5)
    x = torch.zeros(15 + 16, 3)
    out = pe(x, [(3, 5), (4, 4)])
    torch.testing.assert_close(out, torch.cat([pe.grid(3, 5), pe.grid(4, 4)]))


def test_patch_embed_is_the_convolution():
    pe = MoonVisionPatchEmbed(CFG)
    _randomize(pe)
    with torch.no_grad():
        pe.pos_emb.weight.zero_()
        pixels = torch.randn(12, 3, 14, 14, generator=torch.Generator().manual_seed(3))
        ref = pe.proj(pixels).view(12, -1)
        torch.testing.assert_close(pe(pixels, [(3, 4)]), ref, rtol=1e-5, atol=1e-5)


def test_attention_stays_within_each_image():
    vit = MoonViT(CFG).eval()
    _randomize(vit, 4)
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(24, 3, 14, 14, generator=g), torch.randn(16, 3, 14, 14, generator=g)
    with torch.no_grad():
        joint = vit(torch.cat([a, b]), [(4, 6), (4, 4)])
        alone = vit(a, [(4, 6)]) + vit(b, [(4, 4)])
    assert [t.shape for t in joint] == [(6, 4, 32), (4, 4, 32)]
    for j, s in zip(joint, alone):
        torch.testing.assert_close(j, s, rtol=1e-5, atol=1e-5)


def test_encoder_layer_matches_explicit_reference():
    vit = MoonViT(CFG).eval()
    _randomize(vit, 6)
    block = vit.encoder.blocks[0]
    h, w = 2, 3
    x = torch.randn(h * w, 32, generator=torch.Generator().manual_seed(7))
    cos, sin = vit.encoder.rope_2d([(h, w)], x.device)
    with torch.no_grad():
        got = block(x, cos, sin, [h * w])
        y = block.norm0(x)
        q, k, v = block.wqkv(y).view(h * w, 3, 4, 8).unbind(1)
        q = apply_rotary(q[None], cos[None], sin[None], True)[0]
        k = apply_rotary(k[None], cos[None], sin[None], True)[0]
        att = torch.softmax(torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(8), -1)  # full, not causal
        o = torch.einsum("hij,jhd->ihd", att, v).reshape(h * w, 32)
        r = x + block.wo(o)
        ref = r + block.mlp.fc1(F.gelu(block.mlp.fc0(block.norm1(r)), approximate="tanh"))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_patch_merger_groups_2x2_blocks():
    h, w, D = 4, 6, 3
    x = torch.arange(h * w * D, dtype=torch.float32).view(h * w, D)
    (merged,) = tpool_patch_merger(x, [(h, w)])
    assert merged.shape == ((h // 2) * (w // 2), 4, D)
    for i in range(h // 2):
        for j in range(w // 2):
            patches = [(2 * i, 2 * j), (2 * i, 2 * j + 1), (2 * i + 1, 2 * j), (2 * i + 1, 2 * j + 1)]
            ref = torch.stack([x[r * w + c] for r, c in patches])
            assert torch.equal(merged[i * (w // 2) + j], ref)
    with pytest.raises(ValueError, match="2 x 2"):
        tpool_patch_merger(x[:15], [(3, 5)])


def test_projector():
    proj = PatchMergerMLP(CFG)
    _randomize(proj, 8)
    assert proj.proj[0].weight.shape == (128, 128) and proj.proj[2].weight.shape == (64, 128)
    x = torch.randn(5, 4, 32, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        got = proj(x)
        ln = F.layer_norm(x, (32,), proj.pre_norm.weight, proj.pre_norm.bias, 1e-5)  # per patch, then concatenated
        ref = proj.proj[2](F.gelu(proj.proj[0](ln.reshape(5, 128))))
    assert got.shape == (5, 64)
    torch.testing.assert_close(got, ref)


def test_config_reads_both_key_spellings():
    release = dict(patch_size=14, init_pos_emb_height=64, init_pos_emb_width=64, vt_num_attention_heads=16,
                   vt_num_hidden_layers=27, vt_hidden_size=1152, vt_intermediate_size=4304, merge_kernel_size=[2, 2],
                   merge_type="sd2_tpool", mm_projector_type="patchmerger", mm_hidden_size=1152,
                   projector_hidden_act="gelu", projector_ln_eps=1e-5, text_hidden_size=7168)
    canonical = dict(patch_size=14, pos_emb_height=64, pos_emb_width=64, num_attention_heads=16, num_hidden_layers=27,
                     hidden_size=1152, intermediate_size=4304, merge_kernel_size=[2, 2])
    a, b = MoonViTConfig.from_hf(release, 7168), MoonViTConfig.from_hf(canonical, 7168)
    assert a == b == MoonViTConfig()
    assert a.head_dim == 72
    with pytest.raises(ConfigError, match="text_hidden_size"):
        MoonViTConfig.from_hf(release, 4096)
    with pytest.raises(ConfigError, match="merge_type"):
        MoonViTConfig.from_hf({**release, "merge_type": "sd2"}, 7168)


def test_navit_resize():
    cfg = ImageProcessorConfig()
    assert navit_resize(90, 60, cfg) == (90, 60, 22, 24)  # no scaling; pad to 112 x 84
    assert navit_resize(1000, 800, cfg) == (1000, 800, 8, 12)
    # the patch budget: 4000 x 3000 has 285 * 214 patches > 16384, scaled by sqrt(16384 / (285 * 214))
    s = math.sqrt(16384 / (285 * 214))
    assert navit_resize(4000, 3000, cfg)[:2] == (int(4000 * s), int(3000 * s))
    # the per-side limit: 512 patches = 7168 pixels
    w, h, pw, ph = navit_resize(20000, 100, cfg)
    assert w == 7168 and h == int(100 * 7168 / 20000) and (w + pw) % 28 == 0 and (h + ph) % 28 == 0
    small = ImageProcessorConfig(in_patch_limit=64)
    w, h, _, _ = navit_resize(280, 280, small)
    assert (w // 14) * (h // 14) <= 64


def test_preprocess_image_layout_and_normalisation(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    patches, (h, w) = preprocess_image(Image.fromarray(arr))
    assert (h, w) == (4, 4) and patches.shape == (16, 3, 14, 14)  # 40 x 30 pads to 56 x 56
    canvas = np.zeros((56, 56, 3))
    canvas[:30, :40] = arr
    ref = (canvas / 255.0 - 0.5) / 0.5  # padding is black: -1 after normalisation
    for k in range(16):
        r, c = divmod(k, w)
        block = ref[14 * r : 14 * r + 14, 14 * c : 14 * c + 14].transpose(2, 0, 1)
        np.testing.assert_allclose(patches[k].numpy(), block, atol=1e-6)
    # a path and a preprocessor_config.json with other statistics
    Image.fromarray(arr).save(tmp_path / "a.png")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"media_proc_cfg": {"image_mean": [0, 0, 0], "image_std": [1, 1, 1], "in_patch_limit": 4096,
                            "patch_size": 14, "merge_kernel_size": 2, "patch_limit_on_one_side": 512}}))
    cfg = ImageProcessorConfig.from_folder(tmp_path)
    assert cfg.in_patch_limit == 4096 and cfg.image_mean == (0.0, 0.0, 0.0)
    p2, _ = preprocess_image(tmp_path / "a.png", cfg)
    np.testing.assert_allclose(p2[0].numpy(), (canvas / 255.0)[:14, :14].transpose(2, 0, 1), atol=1e-6)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": {"fixed_output_tokens": 64}}))
    with pytest.raises(ConfigError, match="fixed_output_tokens"):
        ImageProcessorConfig.from_folder(tmp_path)
