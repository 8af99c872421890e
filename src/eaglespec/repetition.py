"""Repetition loops in a token stream: the degenerate loops of a small target's greedy answers.

A token continues a loop when the LOOP_NGRAM-gram it completes (it and the LOOP_NGRAM - 1 tokens before it) occurred
earlier in the same stream; a loop run is a maximal stretch of such tokens. `LoopTracker.add(token)` takes the
stream one token at a time and returns the current run's length (0: this token repeats nothing; the first
LOOP_NGRAM - 1 tokens complete no gram). Training's loss mask (`train/dataset.mask_loops`, `--loop-keep`) and the
engine's `SamplingParams.stop_loop` (`engine/request.py`, regeneration's `--regen-stop-loop`) both count loops with
it, so an answer the engine stops N tokens into a loop ends where `--loop-keep N` would take its loss away.
"""

from __future__ import annotations

from collections import deque

LOOP_NGRAM = 8


class LoopTracker:
    """Incremental loop-run length over a token stream (module docstring); O(1) per token, the grams seen kept."""

    __slots__ = ("_window", "_seen", "run")

    def __init__(self, n: int = LOOP_NGRAM) -> None:
        self._window: deque[int] = deque(maxlen=n)
        self._seen: set[tuple[int, ...]] = set()
        self.run = 0

    def add(self, token: int) -> int:
        w = self._window
        w.append(token)
        if len(w) < w.maxlen:
            return 0
        gram = tuple(w)
        if gram in self._seen:
            self.run += 1
        else:
            self.run = 0
            self._seen.add(gram)
        return self.run
