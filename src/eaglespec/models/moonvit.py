"""MoonViT, Kimi-K2.5's vision tower, and its patch-merger projector (`PatchMergerMLP`), for still images.

Contract (REFERENCE.md §6; facts from Moonshot's public `modeling_kimi_k25.py`, module names kept so that checkpoint
names need no table):

- `patch_embed.proj` (Conv2d 3 -> D, kernel = stride = patch 14, with bias) embeds each pre-cut patch
  [L, 3, 14, 14] -> [L, D]; `patch_embed.pos_emb.weight` [64, 64, D] is a learnable grid added to the patches: used as
  is when the image grid is 64 x 64, else resized to (h, w) with `F.interpolate(mode="bicubic", align_corners=False)`
  (computed in float32).
- `encoder.blocks.B`: pre-LN blocks, `x += wo(attn(norm0(x)))`, `x += mlp.fc1(gelu_tanh(mlp.fc0(norm1(x))))`;
  fused `wqkv` (bias) -> q, k, v of `heads` heads (rows ordered [3, heads, head_dim]); 2-D RoPE on q and k; full
  (non-causal) attention within one image, softmax scale head_dim^-0.5; LayerNorms eps 1e-5.
- 2-D RoPE (`Rope2DPosEmb`, theta 10000): head_dim/2 complex pairs (adjacent elements 2j, 2j+1); with
  f_i = theta^(-4i / head_dim), i < head_dim/4, pair 2i turns by col * f_i and pair 2i+1 by row * f_i, where
  (row, col) is the patch's place in its image grid (the original's `x_pos` is the column).
- `encoder.final_layernorm`, then the `sd2_tpool` merger: the grid is cut into 2 x 2 blocks, block-major, each block's
  4 patches in row-major order -> [(h/2)(w/2), 4, D] (the temporal mean is the identity for one frame).
- `PatchMergerMLP` (`mm_projector`): `pre_norm` LayerNorm(D, projector_ln_eps) per patch, view [N, 4D],
  `proj.0` Linear(4D, 4D), exact GELU, `proj.2` Linear(4D, text hidden).

Config keys are read from `vision_config` under either spelling (`vt_hidden_size` / `hidden_size`,
`init_pos_emb_height` / `pos_emb_height`, ...). Videos (several frames per clip, the sinusoidal time embedding) are
not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..layers.attention import scaled_dot_product_attention
from ..layers.rotary import apply_rotary


def _first(d: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return default


@dataclass(frozen=True)
class MoonViTConfig:
    patch_size: int = 14
    hidden_size: int = 1152
    num_attention_heads: int = 16
    num_hidden_layers: int = 27
    intermediate_size: int = 4304
    pos_emb_height: int = 64
    pos_emb_width: int = 64
    merge_kernel_size: tuple[int, int] = (2, 2)
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    text_hidden_size: int = 7168
    projector_ln_eps: float = 1e-5
    projector_hidden_act: str = "gelu"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @staticmethod
    def from_hf(vc: Mapping[str, Any], text_hidden_size: int, top: Mapping[str, Any] | None = None) -> "MoonViTConfig":
        """`vision_config` of a Kimi-K2.5 config.json (both key spellings); `top` is the whole config dict."""
        top = top or {}
        d = MoonViTConfig()
        merge = tuple(int(x) for x in _first(vc, "merge_kernel_size", default=d.merge_kernel_size))
        rope = vc.get("rope_parameters") or {}
        cfg = MoonViTConfig(
            patch_size=int(_first(vc, "patch_size", default=d.patch_size)),
            hidden_size=int(_first(vc, "hidden_size", "vt_hidden_size", default=d.hidden_size)),
            num_attention_heads=int(_first(vc, "num_attention_heads", "vt_num_attention_heads",
                                           default=d.num_attention_heads)),
            num_hidden_layers=int(_first(vc, "num_hidden_layers", "vt_num_hidden_layers",
                                         default=d.num_hidden_layers)),
            intermediate_size=int(_first(vc, "intermediate_size", "vt_intermediate_size", default=d.intermediate_size)),
            pos_emb_height=int(_first(vc, "init_pos_emb_height", "pos_emb_height", default=d.pos_emb_height)),
            pos_emb_width=int(_first(vc, "init_pos_emb_width", "pos_emb_width", default=d.pos_emb_width)),
            merge_kernel_size=(merge[0], merge[1]) if len(merge) == 2 else (merge[0], merge[0]),
            hidden_act=str(_first(vc, "hidden_act", default=d.hidden_act)),
            rope_theta=float(_first(rope, "rope_theta", default=_first(vc, "rope_theta", default=d.rope_theta))),
            text_hidden_size=int(_first(vc, "text_hidden_size", default=text_hidden_size)),
            projector_ln_eps=float(_first(vc, "projector_ln_eps", default=_first(top, "projection_layer_norm_eps",
                                                                                 default=d.projector_ln_eps))),
            projector_hidden_act=str(_first(vc, "projector_hidden_act", default=d.projector_hidden_act)),
        )
        merge_type = vc.get("merge_type", "sd2_tpool")
        if merge_type != "sd2_tpool":
            raise ConfigError(f"vision_config merge_type {merge_type!r} is not supported (supported: sd2_tpool)")
        proj_type = vc.get("mm_projector_type", "patchmerger")
        if proj_type != "patchmerger":
            raise ConfigError(f"vision_config mm_projector_type {proj_type!r} is not supported (supported: patchmerger)")
        if cfg.hidden_size % cfg.num_attention_heads or cfg.head_dim % 4:
            raise ConfigError(
                f"MoonViT needs a head dim divisible by 4 (hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads)"
            )
        if cfg.text_hidden_size != text_hidden_size:
            raise ConfigError(
                f"vision_config text_hidden_size {cfg.text_hidden_size} differs from the text model's hidden size "
                f"{text_hidden_size}"
            )
        return cfg


_ACTS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}


def _act(name: str):  # type: ignore[no-untyped-def]
    if name not in _ACTS:
        raise ConfigError(f"activation {name!r} is not supported (supported: {', '.join(_ACTS)})")
    return _ACTS[name]


class Learnable2DInterpPosEmb(nn.Module):
    """Checkpoint name `pos_emb.weight` [H0, W0, D]; forward adds it, resized to each image's grid."""

    def __init__(self, height: int, width: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(height, width, dim))
        nn.init.normal_(self.weight)

    def grid(self, h: int, w: int) -> torch.Tensor:
        """[h * w, D] in row-major patch order."""
        if (h, w) == tuple(self.weight.shape[:2]):
            return self.weight.flatten(0, 1)
        grid = self.weight.float().permute(2, 0, 1)[None]  # [1, D, H0, W0]
        out = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
        return out[0].permute(1, 2, 0).flatten(0, 1).to(self.weight.dtype)

    def forward(self, x: torch.Tensor, grid_hws: Sequence[tuple[int, int]]) -> torch.Tensor:
        return x + torch.cat([self.grid(h, w) for h, w in grid_hws]).to(x.dtype)


class MoonVisionPatchEmbed(nn.Module):
    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        p = cfg.patch_size
        self.proj = nn.Conv2d(3, cfg.hidden_size, kernel_size=(p, p), stride=(p, p))
        self.pos_emb = Learnable2DInterpPosEmb(cfg.pos_emb_height, cfg.pos_emb_width, cfg.hidden_size)

    def forward(self, pixels: torch.Tensor, grid_hws: Sequence[tuple[int, int]]) -> torch.Tensor:
        """pixels [L, 3, p, p] -> [L, D]. A kernel the size of its input is one matmul over the flat patch."""
        x = F.linear(pixels.flatten(1).to(self.proj.weight.dtype), self.proj.weight.flatten(1), self.proj.bias)
        return self.pos_emb(x, grid_hws)


class Rope2DPosEmb(nn.Module):
    """2-D rotary angles per patch: (cos, sin) [L, head_dim/2] for the interleaved-pair layout."""

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 4:
            raise ConfigError(f"2-D RoPE needs a head dim divisible by 4 (got {head_dim})")
        self.head_dim, self.theta = head_dim, theta

    def forward(self, grid_hws: Sequence[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = self.theta ** -(torch.arange(0, self.head_dim, 4, device=device, dtype=torch.float32) / self.head_dim)
        angles = []
        for h, w in grid_hws:
            row = torch.arange(h, device=device, dtype=torch.float32).repeat_interleave(w)  # [h*w]
            col = torch.arange(w, device=device, dtype=torch.float32).repeat(h)
            # pair 2i: col * f_i, pair 2i+1: row * f_i
            angles.append(torch.stack((col[:, None] * freqs, row[:, None] * freqs), dim=-1).flatten(1))
        a = torch.cat(angles)  # [L, head_dim/2]
        return a.cos(), a.sin()


class MLP2(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.fc0 = nn.Linear(dim, hidden)
        self.fc1 = nn.Linear(hidden, dim)
        self.act = _act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(self.act(self.fc0(x)))


class MoonViTEncoderLayer(nn.Module):
    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.norm0 = nn.LayerNorm(D, eps=1e-5)
        self.norm1 = nn.LayerNorm(D, eps=1e-5)
        self.wqkv = nn.Linear(D, 3 * D)
        self.wo = nn.Linear(D, D)
        self.mlp = MLP2(D, cfg.intermediate_size, cfg.hidden_act)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        L = x.shape[0]
        q, k, v = self.wqkv(x).view(L, 3, self.num_heads, self.head_dim).unbind(1)  # [L, heads, hd] each
        q = apply_rotary(q[None], cos[None], sin[None], interleaved=True)[0]
        k = apply_rotary(k[None], cos[None], sin[None], interleaved=True)[0]
        outs = []
        for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths)):  # full attention per image
            # eager, one shape per image size: without cuDNN's per-shape plan on CUDA (layers/attention.py)
            o = scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1))
            outs.append(o.transpose(0, 1))
        return self.wo(torch.cat(outs).reshape(L, -1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        x = x + self.attention(self.norm0(x), cos, sin, lengths)
        return x + self.mlp(self.norm1(x))


class MoonViTEncoder(nn.Module):
    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        self.rope_2d = Rope2DPosEmb(cfg.head_dim, cfg.rope_theta)
        self.blocks = nn.ModuleList(MoonViTEncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.final_layernorm = nn.LayerNorm(cfg.hidden_size, eps=1e-5)

    def forward(self, x: torch.Tensor, grid_hws: Sequence[tuple[int, int]]) -> torch.Tensor:
        cos, sin = self.rope_2d(grid_hws, x.device)
        lengths = [h * w for h, w in grid_hws]
        for block in self.blocks:
            x = block(x, cos, sin, lengths)
        return self.final_layernorm(x)


def tpool_patch_merger(
    x: torch.Tensor, grid_hws: Sequence[tuple[int, int]], merge_kernel_size: tuple[int, int] = (2, 2)
) -> list[torch.Tensor]:
    """[sum h*w, D] -> per image [(h/kh)(w/kw), kh*kw, D]: kh x kw blocks, block-major, patches row-major inside."""
    kh, kw = merge_kernel_size
    out, start = [], 0
    for h, w in grid_hws:
        if h % kh or w % kw:
            raise ValueError(f"an image grid of {h} x {w} patches does not split into {kh} x {kw} blocks")
        seq = x[start : start + h * w].view(h // kh, kh, w // kw, kw, -1)
        out.append(seq.permute(0, 2, 1, 3, 4).reshape((h // kh) * (w // kw), kh * kw, -1))
        start += h * w
    return out


class MoonViT(nn.Module):
    """Checkpoint prefix `vision_tower`: pixels of several images -> merged patch groups per image."""

    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.patch_embed = MoonVisionPatchEmbed(cfg)
        self.encoder = MoonViTEncoder(cfg)

    def forward(self, pixel_values: torch.Tensor, grid_hws: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
        """pixel_values [sum h*w, 3, p, p] (images concatenated) -> per image [(h/2)(w/2), 4, D]."""
        x = self.patch_embed(pixel_values, grid_hws)
        x = self.encoder(x, grid_hws)
        return tpool_patch_merger(x, grid_hws, self.config.merge_kernel_size)


class PatchMergerMLP(nn.Module):
    """Checkpoint prefix `mm_projector`: [N, 4, D] -> [N, text hidden]."""

    def __init__(self, cfg: MoonViTConfig) -> None:
        super().__init__()
        kh, kw = cfg.merge_kernel_size
        self.hidden_size = cfg.hidden_size * kh * kw
        self.pre_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.projector_ln_eps)
        self.proj = nn.Sequential(
            nn.Linear(self.hidden_size, self.hidden_size),
            nn.GELU() if cfg.projector_hidden_act == "gelu" else _Act(cfg.projector_hidden_act),
            nn.Linear(self.hidden_size, cfg.text_hidden_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.pre_norm(x).view(x.shape[0], self.hidden_size))


class _Act(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.fn = _act(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)
