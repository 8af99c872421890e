"""Image preprocessing for MoonViT (Kimi-K2.5), with Pillow: load, resize, pad, normalise, cut into patches.

Contract (the `navit_resize_image` of Moonshot's public `media_utils.py`, also transformers' `Kimi_K25ImageProcessor`):

1. `load_image(x)`: a PIL image, a path, or raw bytes -> an RGB PIL image.
2. Size: with w x h pixels and p = patch_size, scale = min(1, sqrt(in_patch_limit / (max(1, w//p) * max(1, h//p))),
   side * p / w, side * p / h) (side = patch_limit_on_one_side): the image is never upscaled, its patch count stays
   within the budget and no side exceeds `side` patches. New size max(1, int(w * scale)) x max(1, int(h * scale))
   (clamped to side * p), resized with bicubic resampling.
3. Pad right and bottom with black (pixel value 0) to multiples of merge_kernel_size * p (28 for Kimi), so the patch
   grid h x w (in patches) is even in both directions.
4. Normalise: (pixel / 255 - mean) / std per channel (Kimi: mean = std = 0.5, so values in [-1, 1]).
5. Patches in row-major grid order: [h * w, 3, p, p] float32, and the grid (h, w). The model turns them into
   (h / 2) * (w / 2) feature tokens.

`ImageProcessorConfig.from_folder(path)` reads `preprocessor_config.json` (Kimi's nested `media_proc_cfg`, or the
transformers keys `max_patches`, `size.max_height`, `merge_size`, `image_mean`, `image_std`); every field defaults to
Kimi-K2.5's value. `fixed_output_tokens` (a fixed token count per image) is not supported and refused.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import ConfigError, RequestError


@dataclass(frozen=True)
class ImageProcessorConfig:
    patch_size: int = 14
    merge_kernel_size: int = 2
    in_patch_limit: int = 16384
    patch_limit_on_one_side: int = 512
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "ImageProcessorConfig":
        """Kimi's `media_proc_cfg` keys or transformers' image-processor keys (either level of nesting)."""
        cfg = dict(d.get("media_proc_cfg") or d)
        if cfg.get("fixed_output_tokens") is not None:
            raise ConfigError("preprocessor_config.json sets fixed_output_tokens, which is not supported")
        merge = cfg.get("merge_kernel_size", cfg.get("merge_size", 2))
        merge = merge[0] if isinstance(merge, (list, tuple)) else merge
        size = cfg.get("size") if isinstance(cfg.get("size"), Mapping) else {}
        d0 = ImageProcessorConfig()
        return ImageProcessorConfig(
            patch_size=int(cfg.get("patch_size", d0.patch_size)),
            merge_kernel_size=int(merge),
            in_patch_limit=int(cfg.get("in_patch_limit", cfg.get("max_patches", d0.in_patch_limit))),
            patch_limit_on_one_side=int(
                cfg.get("patch_limit_on_one_side", size.get("max_height", d0.patch_limit_on_one_side))
            ),
            image_mean=tuple(float(x) for x in cfg.get("image_mean", d0.image_mean)),  # type: ignore[arg-type]
            image_std=tuple(float(x) for x in cfg.get("image_std", d0.image_std)),  # type: ignore[arg-type]
        )

    @staticmethod
    def from_folder(folder: str | Path, **defaults: Any) -> "ImageProcessorConfig":
        """The folder's preprocessor_config.json, else the defaults (keyword overrides, e.g. the model's patch size)."""
        path = Path(folder) / "preprocessor_config.json"
        if not path.is_file():
            return ImageProcessorConfig(**defaults)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path} is not valid JSON ({e})") from None
        return ImageProcessorConfig.from_dict({**defaults, **(d.get("media_proc_cfg") or d)})


def load_image(image: Any) -> Any:
    """A PIL image, a path (str / Path) or encoded bytes -> an RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    try:
        if isinstance(image, (bytes, bytearray)):
            return Image.open(io.BytesIO(image)).convert("RGB")
        if isinstance(image, (str, Path)):
            with Image.open(image) as im:
                return im.convert("RGB")
    except FileNotFoundError:
        raise RequestError(f"image file {image} does not exist") from None
    except (UnidentifiedImageError, OSError) as e:
        raise RequestError(f"cannot read the image {str(image)[:100]} ({e})") from None
    raise RequestError(f"an image must be a PIL image, a path or bytes (got {type(image).__name__})")


def navit_resize(width: int, height: int, cfg: ImageProcessorConfig) -> tuple[int, int, int, int]:
    """(new_width, new_height, pad_width, pad_height) for an image of width x height pixels (steps 2-3 above)."""
    p, side = cfg.patch_size, cfg.patch_limit_on_one_side
    s_total = math.sqrt(cfg.in_patch_limit / (max(1.0, width // p) * max(1.0, height // p)))
    scale = min(1.0, s_total, side * p / width, side * p / height)
    new_w = min(max(1, int(width * scale)), side * p)
    new_h = min(max(1, int(height * scale)), side * p)
    factor = cfg.merge_kernel_size * p
    return new_w, new_h, (factor - new_w % factor) % factor, (factor - new_h % factor) % factor


def preprocess_image(
    image: Any, cfg: ImageProcessorConfig = ImageProcessorConfig()
) -> tuple[torch.Tensor, tuple[int, int]]:
    """-> (patches [h*w, 3, p, p] float32 in row-major grid order, (h, w) the grid in patches)."""
    import numpy as np
    from PIL import Image

    img = load_image(image)
    new_w, new_h, pad_w, pad_h = navit_resize(img.width, img.height, cfg)
    if (new_w, new_h) != img.size:
        img = img.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    pixels = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy())  # [H, W, 3]
    pixels = torch.nn.functional.pad(pixels.permute(2, 0, 1), (0, pad_w, 0, pad_h))  # [3, H', W'], black pad
    mean = torch.tensor(cfg.image_mean, dtype=torch.float32)[:, None, None]
    std = torch.tensor(cfg.image_std, dtype=torch.float32)[:, None, None]
    x = (pixels.float() / 255.0 - mean) / std
    p = cfg.patch_size
    h, w = x.shape[1] // p, x.shape[2] // p
    patches = x.view(3, h, p, w, p).permute(1, 3, 0, 2, 4).reshape(h * w, 3, p, p)
    return patches.contiguous(), (h, w)
