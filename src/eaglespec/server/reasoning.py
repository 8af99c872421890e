"""Reasoning: a thinking model's `<think>...</think>` text read apart from its answer, as `reasoning_content`.

Kimi-K2.5 (and DeepSeek-R1-style models) think before they answer, between `<think>` and `</think>`, which their
tokenizers hold as special tokens: decoded as usual (special tokens skipped), the thinking ran into the answer's
content with nothing to tell them apart. The server reads the syntax off its tokenizer (`reasoning_syntax`: both
markers among its special tokens) and then decodes chat answers with their special tokens, splitting each into the
reasoning and the content (vLLM's and DeepSeek's `reasoning_content` field), both cleaned of special tokens.

Contract:
- `reasoning_syntax(special_texts)` -> a `ReasoningSyntax`, or None for a tokenizer without both markers.
- `ReasoningSyntax.opened(prompt_ids, token_to_id)`: whether the prompt ends inside a reasoning block (a template
  that writes `<think>` into the generation prompt, as Kimi-K2.5's thinking mode and DeepSeek-R1's do): its last
  `<think>` comes after its last `</think>`. The answer then starts as reasoning.
- `ReasoningSyntax.split(text, inside)` -> (reasoning or None, the rest): the text of every block (from `<think>`, or
  from the start when `inside`, to `</think>` or the end) is reasoning, the rest is the answer, still holding its
  special tokens (the tool-call reader needs Kimi's; `clean` drops them). None: no reasoning block at all.
- `ReasoningSyntax.tokens(output_ids, inside, token_to_id)`: how many of an answer's tokens are reasoning (each
  block's, its markers included): the usage's `completion_tokens_details.reasoning_tokens`.
- `ReasoningSyntax.stream(inside)` -> a `ReasoningStream`: `feed(delta)` -> (reasoning, rest) that may go out now (a
  tail that may still become a marker or a special token is held back), `finish()` -> what was held back, split the
  same way; the pieces joined are `split`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .markers import Markers

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningSyntax:
    special: tuple[str, ...] = ()  # the tokenizer's special tokens' texts, cleaned from both parts
    open: str = THINK_OPEN
    close: str = THINK_CLOSE

    def opened(self, prompt_ids: Sequence[int], token_to_id: Callable[[str], int | None]) -> bool:
        o, c = token_to_id(self.open), token_to_id(self.close)
        for t in reversed(prompt_ids):  # the last marker decides (a template writes it near the end)
            if t == o or t == c:
                return t == o
        return False

    def tokens(self, output_ids: Sequence[int], inside: bool, token_to_id: Callable[[str], int | None]) -> int:
        o, c = token_to_id(self.open), token_to_id(self.close)
        count = 0
        for t in output_ids:
            if not inside and t == o:
                inside = True
            if inside:
                count += 1
                inside = t != c
        return count

    def clean(self, text: str) -> str:
        return self._special.clean(text)

    def split(self, text: str, inside: bool = False) -> tuple[str | None, str]:
        stream = self.stream(inside)
        r1, c1 = stream.feed(text)
        r2, c2 = stream.finish()
        return (r1 + r2 if stream.seen else None), c1 + c2

    def stream(self, inside: bool = False) -> "ReasoningStream":
        return ReasoningStream(self, inside, seen=inside)

    @functools.cached_property
    def _special(self) -> Markers:
        return Markers(self.special)

    @functools.cached_property
    def markers(self) -> Markers:
        """What a stream holds back: the markers' and the special tokens' beginnings."""
        return Markers((self.open, self.close, *self.special))


@dataclass
class ReasoningStream:
    syntax: ReasoningSyntax
    inside: bool  # within a reasoning block
    seen: bool = False  # a block began (the answer has reasoning)
    pending: str = field(default="")  # text held back: it may still become a marker

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning, rest) of the text so far that may go out now; reasoning cleaned of special tokens."""
        text = self.pending + delta
        keep = self.syntax.markers.held(text)
        self.pending = text[len(text) - keep:] if keep else ""
        return self._route(text[: len(text) - keep])

    def finish(self) -> tuple[str, str]:
        text, self.pending = self.pending, ""
        return self._route(text)

    def _route(self, text: str) -> tuple[str, str]:
        """Split whole text (no marker cut) at the markers, switching state at each."""
        reasoning, rest = [], []
        while text:
            marker = self.syntax.close if self.inside else self.syntax.open
            at = text.find(marker)
            piece, text = (text, "") if at < 0 else (text[:at], text[at + len(marker):])
            (reasoning if self.inside else rest).append(piece)
            if at >= 0:
                self.inside = not self.inside
                self.seen = True
        return self.syntax.clean("".join(reasoning)), "".join(rest)


def reasoning_syntax(special_texts: Sequence[str]) -> ReasoningSyntax | None:
    """The reasoning syntax of a tokenizer whose special tokens include both markers, else None."""
    texts = tuple(special_texts)
    return ReasoningSyntax(texts) if THINK_OPEN in texts and THINK_CLOSE in texts else None
