"""Token masks of structured outputs on the device: the host's bitmasks (grammar/token_grammar.py's layout, int32
words, bit t % 32 of word t // 32 for token t) expanded to booleans, and logits masked by them.

- `allowed_tokens(bitmask, vocab)`: bitmask [..., W] int32 -> allowed [..., vocab] bool;
- `mask_logits(logits, allowed)`: logits [..., V] with the tokens not allowed at -inf (a new tensor).
The host uploads W = V / 32 words per position (1,536 for a 49K vocabulary) rather than V booleans.
"""

from __future__ import annotations

import torch


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # (an arithmetic shift: bit 31 reads as 1)
    return ((bitmask.unsqueeze(-1) >> bits) & 1).flatten(-2)[..., :vocab].bool()


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~allowed, float("-inf"))
