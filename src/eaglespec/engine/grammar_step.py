"""The structured-output plumbing of `ModelRunner` (runner.py), in a file of its own: a mixin of the runner's methods
that move a step's grammar masks (engine/step_grammar.py computes them on the host) into the device buffers its
phases read (engine/grammar_rows.py), at the points where the host's work overlaps the GPU's.

- `load_grammar_root(rows)`: the rows' masks in their current states into slot 0 (a prefill's first token, a
  decode's, a draft's depth 1, a verify's root);
- `grammar_buffers()`: the buffers, allocated on first use with the drafter's depth-1 logits table (before any
  capture of a constrained graph);
- `_grammar_hooks(kind, rows)`: what a constrained graph step loads between its phases (`GraphCache.run(after=)`):
  a decode's current masks once its forward is enqueued; a speculative step's current masks before its draft, its
  tree copied to the host once the draft is enqueued, and its tree's node masks once its verify's forward is
  enqueued (computed while that forward runs);
- `_tree_to_host(rows, tree, by_row)` / `_load_tree_masks(rows, pending)`: those two halves (also the eager
  steps', back to back).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..spec.tree import DraftTree
from .grammar_rows import GrammarRows
from .host_upload import upload


class GrammarStep:
    def load_grammar_root(self, rows: Sequence[int]) -> None:
        """For a step holding structured outputs (`constraint`), before the phase that chooses from them: each row's
        mask in its current state into slot 0 of `grammar_rows`, allocated at the first such step with the
        drafter's depth-1 logits table (graphs read both by address, so neither is made inside a capture)."""
        assert self.constraint is not None and self.step_extras.constrained
        self.grammar_buffers().load(rows, self.constraint.root_bits()[:, None], self.constraint.has())

    def grammar_buffers(self) -> GrammarRows:
        """`grammar_rows`, allocated now if needed, with the drafter's depth-1 logits table (what a constrained step
        reads: before any capture of one)."""
        if self.grammar_rows is None:
            depth = self.spec.draft_tokens if self.spec is not None else 1
            self.grammar_rows = GrammarRows(self.rows, depth, self.target.config.vocab_size, self.device)
        if self.spec is not None:
            self.draft.keep_logits(True)
        return self.grammar_rows

    def _tree_to_host(self, rows: Sequence[int], tree: DraftTree, *,
                      by_row: bool) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """The step's rows' draft tokens and parents, [2, n, D], on their way to the host: a pinned copy enqueued
        behind the draft, and the event that marks it done (None off CUDA: already there). `by_row`: the tree covers
        cache rows 0..B-1 (a graph's), not the step's rows."""
        tok, par = tree.tokens, tree.parents
        if by_row:
            index = upload(rows, self.device, torch.int64)
            tok, par = tok[index], par[index]
        both = torch.stack((tok, par))
        if self.device.type != "cuda":
            return both, None
        host = torch.empty(both.shape, dtype=both.dtype, pin_memory=True)
        host.copy_(both, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event

    def _load_tree_masks(self, rows: Sequence[int], pending: tuple[torch.Tensor, torch.cuda.Event | None]) -> None:
        """A verify's node masks (`StepGrammar.tree_bits`) into `grammar_rows`, from `_tree_to_host`'s copy (waiting
        for it: the draft's end, not the verify forward enqueued since)."""
        host, event = pending
        if event is not None:
            event.synchronize()
        tokens, parents = host.tolist()
        assert self.constraint is not None and self.grammar_rows is not None
        self.grammar_rows.load(rows, self.constraint.tree_bits(tokens, parents))

    def _grammar_hooks(self, kind: str, rows: Sequence[int]) -> dict[str, Callable[[object], None]]:
        """The loads of a constrained graph step of `kind` over `rows`, by the phase after which each runs (module
        docstring); a speculative step's current masks are loaded now."""
        if kind == "decode":
            return {"decode": lambda _: self.load_grammar_root(rows)}
        self.load_grammar_root(rows)
        pending: list = []
        return {"draft": lambda tree: pending.append(self._tree_to_host(rows, tree, by_row=True)),
                "verify": lambda _: self._load_tree_masks(rows, pending.pop())}
