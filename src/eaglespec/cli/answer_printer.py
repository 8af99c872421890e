"""How `generate` and `chat` print an answer as it streams: its text to stdout, and a thinking model's reasoning (its
`<think>` blocks, read as the server reads them: server/reasoning.py) to stderr, so that stdout holds the answer
alone and a conversation's history keeps the answer without the thinking (as such a model's chat template expects).

Contract of `AnswerPrinter(tokenizer, prompt_ids, params)`:
- `params`: what the request should run with: decoded with its special tokens (for the markers) where it splits,
  that is for a tokenizer holding `<think>` and `</think>` as special tokens, unless the request keeps its special
  tokens itself or is held to a structured output (then it prints as it comes);
- `write(delta)`: prints what may go now (a tail that may still become a marker waits); `finish()` prints the rest
  and returns the answer's text without its reasoning, cleaned of special tokens (what `chat` keeps in its history).
The reasoning goes to stderr as it comes, followed by a blank line once the answer starts; a prompt that ends inside
a block (a template that opens `<think>`) starts the answer as reasoning.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Sequence

from ..sampling_params import SamplingParams
from ..server.reasoning import ReasoningStream, reasoning_syntax


class AnswerPrinter:
    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        syntax = reasoning_syntax(tokenizer.special_texts()) if tokenizer is not None else None
        if syntax is None or not params.skip_special_tokens or params.structured is not None:
            syntax = None
        self.syntax = syntax
        self.split: ReasoningStream | None = (syntax.stream(syntax.opened(prompt_ids, tokenizer.token_to_id))
                                              if syntax is not None else None)
        self.params = replace(params, skip_special_tokens=False) if syntax is not None else params
        self.content: list[str] = []
        self.thinking = False  # reasoning went to stderr and the answer has not started yet

    def write(self, delta: str) -> None:
        if self.split is None:
            self._answer(delta)
        else:
            self._route(*self.split.feed(delta))

    def finish(self) -> str:
        if self.split is not None:
            self._route(*self.split.finish())
        if self.thinking:
            self._end_thinking()
        return "".join(self.content)

    def _route(self, reasoning: str, rest: str) -> None:
        assert self.syntax is not None
        if reasoning:
            sys.stderr.write(reasoning)
            sys.stderr.flush()
            self.thinking = True
        rest = self.syntax.clean(rest)
        if rest:
            if self.thinking:
                self._end_thinking()
            self._answer(rest)

    def _end_thinking(self) -> None:
        sys.stderr.write("\n\n")
        sys.stderr.flush()
        self.thinking = False

    def _answer(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        self.content.append(text)
