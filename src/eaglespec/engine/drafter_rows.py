"""Each cache row's drafter state on the device, as the last catch-up left it, and the drafter's vocabulary maps.

Contract of `DrafterRows(drafter, shapes, rows, vocab, dtype, device)` (K: the shapes' envelope top-K):
- top_ids [rows, K] int64: the best depth-1 draft ids, best first (a shape of smaller K reads the first K);
- top_logp [rows, K] float32 (trees score their depth-1 candidates), None where K = 1 (chains take the argmax and keep
  no log-probabilities);
- hidden [rows, H] (the drafter's dtype): the last committed entry's output hidden;
- logits [rows, Vd] (the drafter's dtype) where a shape is a chain: its depth-1 logits, from which sampled rows draw
  their drafts (and structured outputs' guided drafts); for trees allocated by the first step holding a structured
  output (`keep_logits(constrained=True)`, or the runner's `grammar_buffers()` before a capture), whose catch-ups
  then keep them for its guided depth 1; None otherwise;
- target_ids [Vd]: each draft id's target id (drafts map through one lookup: the drafter's own map is two kernels);
- draft_index [vocab]: the way back, target id -> draft id, -1 outside the draft vocabulary (sampled chains'
  verification).
`state(r, K, sampled)` is a step's `DraftState` for shape top-K (views in graph phases, r = slice(0, B));
`store(rows, st)` writes a catch-up's state into rows [B] (one kernel on CUDA: layers/commit_kernel.py);
`tensors()` are what a step mutates (snapshotted around graph warm-ups, moved with a row).
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

from ..config import SpecConfig
from ..layers.commit_kernel import store_draft_rows
from ..spec.draft import DraftState

Rows = Union[torch.Tensor, slice]


class DrafterRows:
    def __init__(self, drafter: torch.nn.Module, shapes: Sequence[SpecConfig], rows: int, vocab: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        K = max(s.topk for s in shapes)
        H = drafter.config.hidden_size
        self.top_ids = torch.zeros(rows, K, dtype=torch.int64, device=device)
        self.top_logp = torch.zeros(rows, K, dtype=torch.float32, device=device) if K > 1 else None
        self.hidden = torch.zeros(rows, H, dtype=dtype, device=device)
        # in the drafter's dtype, as it writes them (the log-softmax reads them as float32)
        Vd = drafter.config.eagle.draft_vocab_size or drafter.config.vocab_size
        self.chains = any(s.topk == 1 for s in shapes)
        self._logits_shape = (rows, Vd, dtype, device)
        self.logits = torch.zeros(rows, Vd, dtype=dtype, device=device) if self.chains else None
        self.target_ids = drafter.to_target_ids(torch.arange(Vd, device=device))
        self.draft_index = torch.full((vocab,), -1, dtype=torch.int64, device=device).index_copy_(
            0, self.target_ids, torch.arange(Vd, device=device))

    def keep_logits(self, constrained: bool) -> bool:
        """Whether a catch-up keeps its depth-1 logits: always with a chain shape; else in steps holding a structured
        output (graphs keyed `constrained` store them; others do not), allocating the table on first use (before a
        capture: `ModelRunner.grammar_buffers`)."""
        if self.chains:
            return True
        if constrained and self.logits is None:
            rows, Vd, dtype, device = self._logits_shape
            with torch.inference_mode(False):  # mid-step: a normal tensor, which row moves may copy into later
                self.logits = torch.zeros(rows, Vd, dtype=dtype, device=device)
        return constrained

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.top_ids, self.top_logp, self.hidden, self.logits) if t is not None]

    def state(self, r: Rows, K: int, sampled: bool) -> DraftState:
        """The drafter's state of rows r for a shape of top-K (`sampled`: a chain drawing sampled rows' drafts, which
        reads the depth-1 logits)."""
        top_logp = self.top_logp[r][:, :K] if K > 1 else None
        return DraftState(self.top_ids[r][:, :K], top_logp, self.hidden[r], self.logits[r] if sampled else None)

    def store(self, rows: torch.Tensor, st: DraftState) -> None:
        """A catch-up's state (a module without weights, the bench's oracle, writes float32 logits) into rows [B]."""
        store_draft_rows(rows, st.top_ids, st.top_logp, st.hidden, st.logits, self.top_ids, self.top_logp,
                         self.hidden, self.logits)
