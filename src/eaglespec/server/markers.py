"""Markers: texts a streamed answer must never show in part, and the special tokens its content is cleaned of.

Contract of `Markers(texts)`:
- `clean(text)` -> `text` without any occurrence of the texts (longest first, so a marker that contains another goes
  whole).
- `held(text)` -> the length of the longest tail of `text` that is a proper prefix of one of the texts: what a stream
  holds back, since the next delta may complete it (0 when none).
Tool calls (tool_calls.py: a call's opening tag, Kimi-K2's special tokens) and reasoning (reasoning.py: `<think>`,
`</think>`) both read answers through it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Markers:
    texts: tuple[str, ...] = ()

    def clean(self, text: str) -> str:
        return self._pattern.sub("", text) if self.texts else text

    def held(self, text: str) -> int:
        for n in range(min(self._longest - 1, len(text)), 0, -1):
            if text[-n:] in self._prefixes:
                return n
        return 0

    @functools.cached_property
    def _pattern(self) -> re.Pattern:
        return re.compile("|".join(re.escape(t) for t in sorted(self.texts, key=len, reverse=True)))

    @functools.cached_property
    def _prefixes(self) -> frozenset[str]:
        return frozenset(m[:n] for m in self.texts for n in range(1, len(m)))

    @functools.cached_property
    def _longest(self) -> int:
        return max((len(m) for m in self.texts), default=0)
