"""The committed tokens' packed log-probability rows on the device, as the runner's steps write them.

Contract of `LogprobBuffer(rows, width, max_logprobs, device)`: `buf` [rows, width, W] float32, W = 1 + 2
max_logprobs (`columns`), width the most tokens a step commits per row (S+1; 1 for a plain engine). A step run with
lp = k (k <= max_logprobs) writes each committed token's packed row (layers/logprobs.py: its log-probability under
the target's raw logits, then k (log-probability, id) pairs) into the first `columns(k)` = 1 + 2k columns; the rest
keep whatever a wider step left (a narrower row is a prefix of a wider one, so readers take the first 1 + 2k).
- `store(r, logits, tokens, k, width)`: logits [B * width, V] and the tokens chosen from them -> buf[r, :width];
- `gather(index, k, first)`: rows `index` [n] (first `first` tokens each) -> [n, first or width, 1 + 2k] on the
  device (a new tensor: launched prefills copy it to the host);
- `head(n)`: rows 0..n-1 [n, width, W], a contiguous view (a launched step's results copy from it).
"""

from __future__ import annotations

from typing import Union

import torch

from ..layers.logprobs import token_logprobs

Rows = Union[torch.Tensor, slice]


def columns(k: int | None) -> int | None:
    """The columns of a packed row of k alternatives (None: none asked)."""
    return None if k is None else 1 + 2 * k


class LogprobBuffer:
    def __init__(self, rows: int, width: int, max_logprobs: int, device: torch.device) -> None:
        self.max_logprobs = max_logprobs
        self.width = columns(max_logprobs)  # W
        self.buf = torch.zeros(rows, width, self.width, dtype=torch.float32, device=device)

    def store(self, r: Rows, logits: torch.Tensor, tokens: torch.Tensor, k: int, width: int = 1) -> None:
        """r: the step's B rows (an index tensor, or slice(0, B) in graph phases); logits [B * width, V]; tokens
        [B * width]."""
        assert k <= self.max_logprobs, (k, self.max_logprobs)
        B = tokens.shape[0] // width
        self.buf[r, :width, : columns(k)] = token_logprobs(logits, tokens, k).view(B, width, -1)

    def gather(self, index: torch.Tensor, k: int, first: int | None = None) -> torch.Tensor:
        return self.buf.index_select(0, index)[:, :first, : columns(k)]

    def head(self, n: int) -> torch.Tensor:
        return self.buf[:n]
