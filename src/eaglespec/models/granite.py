"""IBM Granite 3 (`GraniteForCausalLM`: granite-3.0 / 3.1 / 3.2 / 3.3, 2B and 8B): Llama's layers with four scalar
multipliers.

- `embedding_multiplier`: the token embedding times it (`layers.embedding.ScaledEmbedding`; the tied head keeps the
  checkpoint's weight);
- `attention_multiplier`: the softmax scale, in place of 1 / sqrt(head_dim) (`GQAAttention.scale`);
- `residual_multiplier`: each sublayer's output times it before the residual add; folded into o_proj's and
  down_proj's weights at load (`transform_checkpoint`: W <- r W, the same function up to float rounding), so the
  layers stay Llama's and take every fused kernel;
- `logits_scaling`: the logits divided by it (`DecoderOnlyLM.logits_divisor`).
Checkpoint names are Llama's.
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..config import ModelConfig
from ..layers.embedding import ScaledEmbedding
from .llama import LlamaForCausalLM


class GraniteForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        text = config.text
        self.residual_multiplier = float(text.get("residual_multiplier", 1.0))
        self.logits_divisor = float(text.get("logits_scaling", 1.0))
        scale = float(text.get("embedding_multiplier", 1.0))
        embed = ScaledEmbedding(config.vocab_size, config.hidden_size, scale)
        self.model.embed_tokens = embed
        if config.tie_word_embeddings:
            self.lm_head.weight = embed.weight
        attention_scale = text.get("attention_multiplier")
        for layer in self.model.layers:
            layer.self_attn.scale = float(attention_scale) if attention_scale is not None else None

    def transform_checkpoint(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """o_proj's and down_proj's weights (and biases) times `residual_multiplier`."""
        if ".self_attn.o_proj." in name or ".mlp.down_proj." in name:
            tensor = (tensor.float() * self.residual_multiplier).to(tensor.dtype)
        yield name, tensor
