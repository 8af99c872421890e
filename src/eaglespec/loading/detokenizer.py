"""Streaming detokenization: token ids in, text deltas out.

Contract: feed ids with `add(ids)` (one or a few at a time) and get the new text; call `finish()` at the end.
The concatenation of every delta (finish included) equals `tokenizer.decode(all ids, skip_special_tokens)`.
A delta never ends in half a UTF-8 character: while the decoded tail ends with U+FFFD (an incomplete byte
sequence), the text is held back until the next ids complete it (or `finish()` flushes it).

How: decode a short window `ids[prefix:]` and subtract the text of `ids[prefix:read]`, the already emitted part of
that window. Decoding a window rather than single tokens keeps decoders that look at neighbours (sentencepiece's
leading-space rule, byte-level pieces) correct, and keeps each step O(window) instead of O(sequence).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .tokenizer import BaseTokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: "BaseTokenizer", skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: ids before it are fully emitted and never decoded again
        self._read = 0  # ids[prefix:read] are emitted; ids[read:] are not yet
        self.text = ""  # everything emitted so far

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, ids: int | Iterable[int]) -> str:
        """Append ids; return the newly completed text (possibly empty)."""
        self.ids.extend([ids] if isinstance(ids, int) else (int(i) for i in ids))
        return self._advance(final=False)

    def finish(self) -> str:
        """Flush whatever is held back (an incomplete character decodes to U+FFFD, as `decode` does)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self.ids):
            return ""
        emitted = self._decode(self.ids[self._prefix : self._read])
        window = self._decode(self.ids[self._prefix :])
        if not final and window.endswith(_REPLACEMENT):
            return ""
        if not window.startswith(emitted):
            # A decoder whose output for a prefix is not a prefix of its output for more ids (rare cleanup
            # rules): fall back to decoding everything and diffing against what was emitted.
            full = self._decode(self.ids)
            delta = full[len(self.text) :] if full.startswith(self.text) else ""
        else:
            delta = window[len(emitted) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta
