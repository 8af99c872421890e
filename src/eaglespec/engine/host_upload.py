"""`upload(values, device, dtype)`: a host list (or a CPU tensor) on the device without synchronising the stream: on
CUDA the copy goes from pinned memory and is enqueued (`torch.tensor(..., device="cuda")` copies from pageable
memory, which waits for the work already enqueued); elsewhere the tensor itself. What the engine's mid-step host
inputs take (rows' indices, grammar masks, logit adjustments), so that the host never waits for the GPU there.
PyTorch's caching host allocator keeps a pinned block until the copy that reads it has run.
"""

from __future__ import annotations

from typing import Sequence

import torch


def upload(values: Sequence | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    t = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=dtype)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)
