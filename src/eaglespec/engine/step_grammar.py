"""`StepGrammar`: the token masks of one step's structured-output requests, computed on the host and uploaded.

Contract of `StepGrammar(grammars, vocab, device)`, one per step that holds a constrained request (`grammars[i]`:
the TokenGrammar of the step's row i, in the step's row order, or None for a row without one). It computes bitmasks
on the host (int32 words, llguidance's layout; -1 words: everything allowed); the runner loads them into its
`GrammarRows` buffers (engine/grammar_rows.py), from which the step's phases (eager or graph) read them:
- `root_bits()`: [B, W], each row's mask in its current state (a prefill's first token, a decode step's, a draft's
  depth 1, a verify's root); rows without a grammar allow every token; computed once per step;
- `tree_bits(tokens, parents)`: [B, D, W] for a verify of the draft tree (host lists [B][D], node 0 the root,
  already committed): node j's mask is the grammar's state after the tokens on its draft path (depth 1 to j), so
  that each node's logits are masked as plain decoding would mask them after that path, and greedy and sampled
  verification stay lossless. A node whose path the grammar refuses can never be accepted (its parent's masked
  distribution gives its token no mass): it allows every token, which keeps its row of probabilities finite. The
  grammars are back in their state afterwards.
- `draft_paths(target_ids)`: for eager drafting below depth 1 (spec/draft.py's `DraftGuide.paths`): paths (per row,
  per node, the target ids drafted below the root) -> the draft tokens (draft vocabulary, `target_ids` [Vd] its
  target ids) each row's grammar allows after each path, [B, J, Vd] bool on the device, so that drafts stay in the
  grammar (a path it refuses allows everything; one host synchronisation per drafter level). Graph steps guide
  depth 1 only (from slot 0 of the buffers), with no host read inside the draft.
Plain decoding of a constrained request costs one mask per token; a verify of D nodes D masks, each after a
`try_consume` of the tokens that differ from the previous node's path (nodes come in tree order, parents first).
Rows are computed in parallel when at least POOL_MIN_ROWS are constrained on a host of at least that many cores (a
pool of up to GRAMMAR_THREADS threads: llguidance releases the GIL while it computes a mask, and each row's grammar
is touched by one thread only). On this project's 2-core CPU a pool of 2 saved nothing (SmolLM2's JSON masks take
~0.07 ms a row, a regex's ~0.3 ms; the pool's hand-offs cost as much), so it is kept for hosts of 4 cores or more,
where 32 constrained rows would otherwise compute their masks one after another (not measured there yet).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import torch

from ..grammar.token_grammar import TokenGrammar, mask_words
from ..layers.token_mask import allowed_tokens
from .host_upload import upload


GRAMMAR_THREADS = min(8, os.cpu_count() or 1)
POOL_MIN_ROWS = 4
_pool: ThreadPoolExecutor | None = None


def _each(fn: Callable[[int], Any], n: int) -> None:
    """fn(0..n-1), over the pool for POOL_MIN_ROWS rows or more (each call touches one row's grammar and bitmask
    rows only)."""
    global _pool
    if n < POOL_MIN_ROWS or GRAMMAR_THREADS < POOL_MIN_ROWS:
        for i in range(n):
            fn(i)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(GRAMMAR_THREADS, thread_name_prefix="eaglespec-grammar")
    inference = torch.is_inference_mode_enabled()  # thread-local: the step's mode, for the bitmasks it made

    def call(i: int) -> None:
        with torch.inference_mode(inference):
            fn(i)

    for _ in _pool.map(call, range(n)):  # re-raises a row's exception here
        pass


class StepGrammar:
    def __init__(self, grammars: Sequence[TokenGrammar | None], vocab: int, device: torch.device) -> None:
        self.grammars, self.vocab, self.device = list(grammars), vocab, device
        self.words = mask_words(vocab)
        self._root: torch.Tensor | None = None  # [B, W]: the rows' masks in their current states, computed once

    @staticmethod
    def of(grammars: Sequence[TokenGrammar | None], vocab: int, device: torch.device) -> "StepGrammar | None":
        """A step's StepGrammar, or None where no row has a grammar (the step then masks nothing)."""
        return StepGrammar(grammars, vocab, device) if any(g is not None for g in grammars) else None

    def root_bits(self) -> torch.Tensor:
        """[B, W] int32 on the host: each row's mask in its current state (all ones without a grammar), computed on
        first use: the decode's or prefill's mask, a draft's depth 1 and a verify's root share it (the grammars
        are back in that state after every walk)."""
        if self._root is None:
            bitmask = torch.full((len(self.grammars), self.words), -1, dtype=torch.int32)
            rows = self._rows()
            _each(lambda j: self.grammars[rows[j]].fill_mask(bitmask[rows[j]]), len(rows))
            self._root = bitmask
        return self._root

    def _rows(self) -> list[int]:
        return [i for i, g in enumerate(self.grammars) if g is not None]

    def has(self) -> list[bool]:
        """Per row: whether it has a grammar."""
        return [g is not None for g in self.grammars]

    def draft_paths(self, target_ids: torch.Tensor) -> Callable[[list], torch.Tensor]:
        def allowed(paths: list[list[list[int]]]) -> torch.Tensor:
            B, J = len(self.grammars), len(paths[0])
            bitmask = torch.full((B, J, self.words), -1, dtype=torch.int32)
            rows = self._rows()
            root = self.root_bits()

            def row(k: int) -> None:
                i = rows[k]
                g = self.grammars[i]
                assert g is not None
                for j, path in enumerate(paths[i]):
                    if not path:
                        bitmask[i, j] = root[i]
                        continue
                    taken = g.try_consume(path)
                    if taken == len(path):
                        g.fill_mask(bitmask[i, j])
                    g.rollback(taken)

            _each(row, len(rows))
            return allowed_tokens(upload(bitmask, self.device), self.vocab)[..., target_ids]  # [B, J, Vd]

        return allowed

    def tree_bits(self, tokens: list[list[int]], parents: list[list[int]]) -> torch.Tensor:
        B, D = len(tokens), len(tokens[0])
        bitmask = torch.full((B, D, self.words), -1, dtype=torch.int32)
        rows = self._rows()
        if rows:
            root = self.root_bits()
            _each(lambda j: self._fill_tree(self.grammars[rows[j]], tokens[rows[j]], parents[rows[j]],
                                            bitmask[rows[j]], root[rows[j]]), len(rows))
        return bitmask

    @staticmethod
    def _fill_tree(g: TokenGrammar, tokens: list[int], parents: list[int], out: torch.Tensor,
                   root: torch.Tensor) -> None:
        """out [D, W]: node j's mask after its path's tokens (node 0's: `root`, the row's current mask); nodes whose
        path the grammar refuses are left all-ones."""
        taken: list[int] = []  # the nodes whose tokens the grammar holds now, root's child first
        paths: list[list[int] | None] = [[]]  # node j's path below the root (None: refused)
        out[0] = root
        for j in range(1, len(tokens)):
            parent = paths[parents[j]]
            if parent is None:
                paths.append(None)
                continue
            path = parent + [j]
            keep = 0  # the nodes of `taken` that path shares from the start
            while keep < len(taken) and keep < len(path) and taken[keep] == path[keep]:
                keep += 1
            g.rollback(len(taken) - keep)
            del taken[keep:]
            new = path[keep:]
            got = g.try_consume([tokens[n] for n in new])
            taken.extend(new[:got])
            if got < len(new):
                paths.append(None)
                continue
            paths.append(path)
            g.fill_mask(out[j])
        g.rollback(len(taken))
