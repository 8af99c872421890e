"""The draft vocabulary: the N most frequent assistant tokens, as the `d2t` / `t2d` maps of the checkpoint format.

Contract (REFERENCE.md §3, §5):
- `count_tokens(tokens, mask, vocab)` counts the tokens where `mask` is true (assistant tokens);
- `build_draft_vocab(counts, n)` keeps the n most frequent ids (ties: lower id first; ids never seen fill the rest,
  lowest id first), sorted ascending as `kept` [n]; then `d2t[i] = kept[i] - i` (int64 [n]: target id = draft id +
  d2t[draft id]) and `t2d[v]` is true for kept ids (bool [vocab]);
- `DraftVocab.target_to_draft` [vocab] int64 maps a target id to its draft id (-1 outside the draft vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftVocab:
    d2t: torch.Tensor  # [n] int64
    t2d: torch.Tensor  # [vocab] bool

    @property
    def size(self) -> int:
        return len(self.d2t)

    @property
    def kept(self) -> torch.Tensor:
        """[n] target ids of the draft vocabulary, ascending."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    @property
    def target_to_draft(self) -> torch.Tensor:
        """[vocab] int64: draft id of each target id, -1 outside the draft vocabulary."""
        m = torch.full(self.t2d.shape, -1, dtype=torch.int64, device=self.t2d.device)
        m[self.kept] = torch.arange(self.size, device=self.t2d.device)
        return m

    def coverage(self, counts: torch.Tensor) -> float:
        """Fraction of the counted tokens that the draft vocabulary contains."""
        total = counts.sum()
        return float(counts[self.t2d.to(counts.device)].sum() / total) if total > 0 else 1.0

    def to(self, device: torch.device | str) -> "DraftVocab":
        return DraftVocab(self.d2t.to(device), self.t2d.to(device))


def count_tokens(tokens: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[vocab] int64 frequencies of the masked tokens."""
    return torch.bincount(tokens[mask].cpu(), minlength=vocab)[:vocab]


def build_draft_vocab(counts: torch.Tensor, n: int) -> DraftVocab:
    """Keep the n most frequent ids (see the module docstring)."""
    vocab = len(counts)
    if not 1 <= n <= vocab:
        raise ValueError(f"the draft vocabulary size must be between 1 and {vocab} (got {n})")
    # sort by (-count, id): argsort is stable, so equal counts keep ascending ids
    order = torch.argsort(-counts.to(torch.int64), stable=True)
    kept = order[:n].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    return DraftVocab(d2t=kept - torch.arange(n), t2d=t2d)
