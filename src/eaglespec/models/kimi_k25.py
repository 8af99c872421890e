"""Kimi-K2.5 (`KimiK25ForConditionalGeneration`): MoonViT + patch-merger projector + a DeepSeek-V3 language model.

The wrapper this project exists for (REFERENCE.md §1, §2, §6):

- `vision_tower` (MoonViT, `moonvit.py`), `mm_projector` (PatchMergerMLP) and `language_model`
  (`DeepseekV3ForCausalLM`, built from the config's `text_config`);
- the EAGLE-3 target protocol (and the engine's `kv_cache_shapes` / `embed`) by delegation, declared in the class body
  (`eagle3 = delegate_eagle3("language_model")`), so it exists by construction; `forward(input_ids, ctx,
  inputs_embeds=None)` returns the language model's output (logits and aux states) unchanged;
- images: `prepare_multimodal(tokenizer, prompt, images, chat)` preprocesses each image (`loading/image.py`), puts one
  `<|media_begin|>image<|media_content|><|media_pad|><|media_end|>` per image in front of the user's text (unless
  the prompt already holds `<|media_pad|>` placeholders), and expands each image's single `<|media_pad|>`
  (`media_placeholder_token_id`, 163605) into (h/2)(w/2) copies (h, w: the image grid in patches);
  `embed_multimodal(input_ids, mm_inputs)` embeds the tokens and replaces the placeholder rows, in order, by the
  projector's output. Positions stay plain 1-D.

Checkpoint names are the release's (`language_model.model.layers.L...`, `vision_tower.encoder.blocks.B.wqkv`,
`mm_projector.proj.0`, ...). The one rename: the NVFP4 release's `language_model.layers.` ->
`language_model.model.layers.`. Ignored: what the language model ignores (MTP layers, rotary buffers), under the
`language_model.` prefix. Quantized routed experts are dequantized by the loader.

The image preprocessing settings come from `preprocessor_config.json` next to the tokenizer when there is one
(`set_image_processor` overrides), else from the vision config's patch / merge sizes and Kimi's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..config import ModelConfig
from ..errors import RequestError
from ..loading.image import ImageProcessorConfig, preprocess_image
from ..protocol import delegate_eagle3
from .base import LanguageModelWrapper
from .deepseek_v3 import DeepseekV3ForCausalLM
from .moonvit import MoonViT, MoonViTConfig, PatchMergerMLP

MEDIA_PAD = "<|media_pad|>"
IMAGE_MARKER = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"


@dataclass
class KimiImageInputs:
    """One request's preprocessed images: patches per image [h*w, 3, p, p] and grids (h, w) in patches."""

    pixel_values: list[torch.Tensor]
    grid_hws: list[tuple[int, int]]

    def num_tokens(self, merge: tuple[int, int]) -> list[int]:
        return [(h // merge[0]) * (w // merge[1]) for h, w in self.grid_hws]


def _prefixed(prefix: str, patterns: Sequence[str]) -> tuple[str, ...]:
    """Anchor each `^...` regex under `prefix` (already a regex)."""
    return tuple(f"^{prefix}(?:{p.removeprefix('^')})" for p in patterns)


class KimiK25ForConditionalGeneration(LanguageModelWrapper):
    eagle3 = delegate_eagle3("language_model")

    checkpoint_renames: tuple[tuple[str, str], ...] = (
        (r"^language_model\.layers\.", "language_model.model.layers."),  # the NVFP4 release
    )

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        raw = config.raw or {}
        self.vision_config = MoonViTConfig.from_hf(raw.get("vision_config") or {}, config.hidden_size, raw)
        self.media_placeholder_token_id = int(raw.get("media_placeholder_token_id", raw.get("image_token_id", 163605)))
        self.vision_tower = MoonViT(self.vision_config)
        self.mm_projector = PatchMergerMLP(self.vision_config)
        self.language_model = DeepseekV3ForCausalLM(config)
        self.checkpoint_ignore = _prefixed(r"language_model\.", self.language_model.checkpoint_ignore)
        self.image_processor: ImageProcessorConfig | None = None


    # --- images -------------------------------------------------------------------------------------------------
    def set_image_processor(self, cfg: ImageProcessorConfig) -> None:
        self.image_processor = cfg

    def configure_from_folder(self, folder: str) -> None:
        """Called by the loader with the checkpoint folder: read its preprocessor_config.json when present."""
        self.image_processor = ImageProcessorConfig.from_folder(folder, **self._processor_defaults())

    def _processor_defaults(self) -> dict[str, Any]:
        vc = self.vision_config
        return dict(patch_size=vc.patch_size, merge_kernel_size=vc.merge_kernel_size[0])

    def _image_processor(self, tokenizer: Any) -> ImageProcessorConfig:
        if self.image_processor is None:
            self.image_processor = ImageProcessorConfig(**self._processor_defaults())
        return self.image_processor

    def encode_images(self, images: KimiImageInputs) -> torch.Tensor:
        """-> [sum (h/2)(w/2), text hidden]: the projected image features, images in order."""
        dtype = self.mm_projector.proj[0].weight.dtype
        device = self.mm_projector.proj[0].weight.device
        pixels = torch.cat(images.pixel_values).to(device=device, dtype=dtype)
        merged = self.vision_tower(pixels, images.grid_hws)  # per image [(h/2)(w/2), 4, D]
        return self.mm_projector(torch.cat(merged))

    def embed_multimodal(self, input_ids: torch.Tensor, mm_inputs: Sequence[KimiImageInputs | None]) -> torch.Tensor:
        """input_ids [B, T] (placeholders expanded) -> inputs_embeds [B, T, H] with the image rows replaced."""
        embeds = self.language_model.embed(input_ids)
        for b, mm in enumerate(mm_inputs):
            if mm is None or not mm.pixel_values:
                continue
            rows = (input_ids[b] == self.media_placeholder_token_id).nonzero().squeeze(1)
            feats = self.encode_images(mm)
            if rows.numel() != feats.shape[0]:
                raise RequestError(
                    f"row {b} has {rows.numel()} image placeholder tokens but its images give {feats.shape[0]} "
                    "features"
                )
            embeds[b, rows] = feats.to(embeds.dtype)
        return embeds

    def prepare_multimodal(
        self, tokenizer: Any, prompt: Any, images: Sequence[Any], chat: bool = True
    ) -> tuple[list[int], KimiImageInputs]:
        """Prompt ids with each image's placeholder expanded to its feature count, and the preprocessed images."""
        proc = self._image_processor(tokenizer)
        pixel_values, grids = [], []
        for image in images:
            patches, grid = preprocess_image(image, proc)
            pixel_values.append(patches)
            grids.append(grid)
        mm = KimiImageInputs(pixel_values, grids)
        ids = self._prompt_ids(tokenizer, prompt, len(images), chat)
        return self.expand_placeholders(ids, mm.num_tokens(self.vision_config.merge_kernel_size)), mm

    def _prompt_ids(self, tokenizer: Any, prompt: Any, n_images: int, chat: bool) -> list[int]:
        if not isinstance(prompt, str) and not (prompt and isinstance(list(prompt)[0], dict)):
            return [int(t) for t in prompt]  # token ids: must hold the placeholders already
        if tokenizer is None:
            raise RequestError("this model has no tokenizer: pass token ids with one <|media_pad|> per image")
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        else:
            messages = [dict(m) for m in prompt]
        messages = [{**m, "content": _flatten_content(m.get("content"))} for m in messages]
        if not any(MEDIA_PAD in (m.get("content") or "") for m in messages):
            users = [m for m in messages if m.get("role") == "user"] or messages
            users[-1]["content"] = IMAGE_MARKER * n_images + (users[-1].get("content") or "")
        if isinstance(prompt, str) and not (chat and tokenizer.has_chat_template):
            return tokenizer.encode(messages[0]["content"])
        if not tokenizer.has_chat_template:
            raise RequestError("chat messages need a tokenizer with a chat template")
        return tokenizer.encode(tokenizer.apply_chat_template(messages))

    def expand_placeholders(self, ids: Sequence[int], counts: Sequence[int]) -> list[int]:
        """Each image's single placeholder -> counts[i] copies (ids already expanded pass through)."""
        pad = self.media_placeholder_token_id
        n = sum(1 for t in ids if t == pad)
        if n == sum(counts) and n != len(counts):
            return list(ids)
        if n != len(counts):
            raise RequestError(f"the prompt has {n} {MEDIA_PAD} placeholders but {len(counts)} images were given")
        out: list[int] = []
        k = 0
        for t in ids:
            if t == pad:
                out.extend([pad] * counts[k])
                k += 1
            else:
                out.append(t)
        return out


def _flatten_content(content: Any) -> str:
    """OpenAI-style content parts -> text, an image part becoming Kimi's image marker."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif part.get("type") in ("image", "image_url") or "image" in part or "image_url" in part:
            parts.append(IMAGE_MARKER)
        else:
            parts.append(str(part.get("text", "")))
    return "".join(parts)
