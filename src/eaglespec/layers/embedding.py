"""`embedding(num, dim)`: an `nn.Embedding` that skips its random init when built on the meta device.

Models are built on the meta device and then loaded (loading/checkpoint.py). `nn.Embedding` fills its weight with
`normal_` even there, and that op on a meta tensor goes through PyTorch's reference decompositions, which import
torch._dynamo: 0.8-1.5 s of `eaglespec generate`'s start-up on a 2-core CPU, which otherwise never needs it
(docs/benchmarks.md, "Session 33"). Built on a real device (the tests' tiny models) it is a plain `nn.Embedding`.
"""

from __future__ import annotations

import torch
from torch import nn


def embedding(num: int, dim: int) -> nn.Embedding:
    if torch.get_default_device().type == "meta":
        return nn.Embedding(num, dim, _weight=torch.empty(num, dim))  # no init: the checkpoint fills it
    return nn.Embedding(num, dim)
