"""`TokenGrammar`: one request's grammar state over token ids, as the engine reads it.

Contract (every method runs on the host, between steps or between a step's draft and its verify):
- `fill_mask(out)`: out [W] int32 (W = ceil(V / 32), V the model's vocabulary), bit t % 32 of word t // 32 set where
  token t may come next in the current state (llguidance's bitmask layout); the state is not changed;
- `try_consume(tokens)`: advance through the tokens while the grammar allows them; returns how many it took (the
  first refused one and those after it are not taken, and the state stays usable);
- `rollback(n)`: undo the last n tokens taken;
- `commit(tokens)`: the request's committed tokens, for good (each was allowed: the step masked the logits that
  chose it).
Once the grammar is complete only the end-of-sequence tokens are allowed, so a constrained answer ends with EOS.
Speculative steps walk each draft path with try_consume / fill_mask / rollback (engine/step_grammar.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch


class TokenGrammar(ABC):
    @abstractmethod
    def fill_mask(self, out: torch.Tensor) -> None: ...

    @abstractmethod
    def try_consume(self, tokens: Sequence[int]) -> int: ...

    @abstractmethod
    def rollback(self, n: int) -> None: ...

    def commit(self, tokens: Sequence[int]) -> None:
        taken = self.try_consume(tokens)
        if taken != len(tokens):
            raise AssertionError(f"a committed token ({tokens[taken]}) was refused by the request's grammar")


def mask_words(vocab: int) -> int:
    """int32 words of a token bitmask over `vocab` tokens."""
    return (vocab + 31) // 32
