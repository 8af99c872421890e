"""Mistral Small 3.1 / 3.2 (`Mistral3ForConditionalGeneration`): a Pixtral vision tower and projector around a
Mistral (Llama-layout) language model, run here for text: the language model only.

- `language_model`: models/llama.py's `LlamaForCausalLM` built from the config's `text_config` (Mistral's: GQA, an
  explicit `head_dim`, RoPE; a sliding window, if the config has one, windows the layers as `ModelConfig.layer_windows`
  says);
- the EAGLE-3 target protocol (and the engine's `kv_cache_shapes` / `embed`) by delegation (`delegate_eagle3`), and
  `forward(input_ids, ctx, inputs_embeds=None)` returns the language model's output unchanged
  (`base.LanguageModelWrapper`);
- images are not taken (no `prepare_multimodal`: the engine refuses a request with images, naming the class): the
  vision tower and projector's weights (`vision_tower.*`, `multi_modal_projector.*`, under `model.` in transformers
  5's layout) are skipped, not loaded.

Checkpoint names: the releases' `language_model.model.layers.L...` and `language_model.lm_head.weight` as they are;
transformers 5's `model.language_model.*` renamed onto them (`base.VisionLanguageForText`, shared with Gemma 3).
"""

from __future__ import annotations

from .base import VisionLanguageForText
from .llama import LlamaForCausalLM


class Mistral3ForConditionalGeneration(VisionLanguageForText):
    language_model_class = LlamaForCausalLM
