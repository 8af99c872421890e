"""`GrammarRows`: the device buffers from which a step holding structured outputs reads its token masks, so that such
steps replay CUDA graphs like any other (graphs keyed `StepExtras.constrained`), with the host writing the masks
between phases.

Contract of `GrammarRows(rows, depth, vocab, device)`, allocated by the runner at its first constrained step (graphs
read the buffers by address: they are never reallocated while the runner's caches live):
- `bits` [rows, depth, W] int32, W = ceil(vocab / 32), llguidance's layout (bit t % 32 of word t // 32 for token t):
  slot 0 holds a row's mask in its current state (a prefill's or decode's next token, a draft's depth 1, a verify's
  root), slot j >= 1 its mask after verify node j's draft path (StepGrammar.tree_bits);
- `has` [rows] bool: rows whose request has a grammar (a tree re-chooses its depth-1 drafts in those only);
- `load(rows, bits, has)`: the host's bitmasks [n, d, W] (step row order; -1 words: everything allowed) into cache
  rows `rows` at slots 0..d-1, and `has` (n bools) where given; copies enqueued from pinned memory on CUDA (no
  synchronisation), before the phase that reads them runs or replays;
- `allowed(r, slots)` -> bool [B, V] (an int slot) or [B, d, V] (a slice of slots) on the device: what the phases
  read, for the step's rows r (an index tensor, or slice(0, B) in graph phases: views).
Slots a step does not write keep older masks: only rows the step covers are read, and a graph's inert rows (no
request) may read stale masks, whose choices are discarded.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

from ..grammar.token_grammar import mask_words
from ..layers.token_mask import allowed_tokens
from .host_upload import upload

Rows = Union[torch.Tensor, slice]


class GrammarRows:
    def __init__(self, rows: int, depth: int, vocab: int, device: torch.device) -> None:
        self.vocab, self.device = vocab, device
        # normal tensors, though made mid-step (under inference mode): the host writes them in later steps; rows that
        # move (joins, compaction) need no copy, since every constrained step loads its rows' masks afresh
        with torch.inference_mode(False):
            self.bits = torch.full((rows, depth, mask_words(vocab)), -1, dtype=torch.int32, device=device)
            self.has = torch.zeros(rows, dtype=torch.bool, device=device)

    def load(self, rows: Sequence[int], bits: torch.Tensor, has: Sequence[bool] | None = None) -> None:
        index = upload(rows, self.device, torch.int64)
        self.bits[:, : bits.shape[1]].index_copy_(0, index, upload(bits, self.device))  # bits [n, d, W]
        if has is not None:
            self.has.index_copy_(0, index, upload(has, self.device, torch.bool))

    def allowed(self, r: Rows, slots: int | slice) -> torch.Tensor:
        return allowed_tokens(self.bits[r, slots], self.vocab)
