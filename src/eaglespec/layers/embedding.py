"""`embedding(num, dim)`: an `nn.Embedding` that skips its random init when built on the meta device.

Models are built on the meta device and then loaded (loading/checkpoint.py). `nn.Embedding` fills its weight with
`normal_` even there, and that op on a meta tensor goes through PyTorch's reference decompositions, which import
torch._dynamo: 0.8-1.5 s of `eaglespec generate`'s start-up on a 2-core CPU, which otherwise never needs it
(docs/benchmarks.md, "Session 33"). Built on a real device (the tests' tiny models) it is a plain `nn.Embedding`.
`ScaledEmbedding` multiplies its rows by a constant (Gemma's sqrt(hidden_size), rounded to the weight's dtype as
transformers rounds it); its `weight` is the checkpoint's, unscaled (what the EAGLE-3 protocol hands a drafter).
"""

from __future__ import annotations

import torch
from torch import nn


def _meta_weight(num: int, dim: int) -> torch.Tensor | None:
    """An uninitialised weight when building on the meta device (the checkpoint fills it), else None (nn.Embedding's
    own init)."""
    return torch.empty(num, dim) if torch.get_default_device().type == "meta" else None


def embedding(num: int, dim: int) -> nn.Embedding:
    return nn.Embedding(num, dim, _weight=_meta_weight(num, dim))


class ScaledEmbedding(nn.Embedding):
    def __init__(self, num: int, dim: int, scale: float) -> None:
        super().__init__(num, dim, _weight=_meta_weight(num, dim))
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # the scale rounded to the weight's dtype (a host value: nothing for a CUDA graph to read back)
        return super().forward(input_ids) * torch.tensor(self.scale, dtype=self.weight.dtype).item()
