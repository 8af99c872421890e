"""`GrammarCompiler`: a `StructuredOutput` -> a `TokenGrammar` over the engine's tokenizer, through llguidance
(the grammar engine vLLM, SGLang and llama.cpp use: JSON schemas, regular expressions, Lark and GBNF grammars,
token masks computed lazily over the tokenizer's trie).

Contract:
- `GrammarCompiler(tokenizer, vocab, eos_ids)`: the tokenizer is converted once, on the first structured request or
  by `warm()` (~0.2 s for SmolLM2's 49K tokens); `vocab` is the model's (the logits' width), `eos_ids` the tokens that end an
  answer (a complete grammar allows exactly these);
- `compile(output)`: a fresh `TokenGrammar` at the grammar's start; each distinct output's grammar text is built
  once (a small cache) and its matcher per request. A schema, regex or grammar that does not compile raises
  `RequestError` with llguidance's reason.
llguidance is imported here only, on first use: an engine that never sees a structured request never loads it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..errors import RequestError
from .output_format import StructuredOutput
from .token_grammar import TokenGrammar

if TYPE_CHECKING:
    from ..loading.tokenizer import BaseTokenizer

GRAMMAR_CACHE = 64  # distinct grammars kept compiled (a server's requests often repeat one schema)
# JSON as OpenAI's and vLLM's structured outputs write it: ", " and ": " between items, no other whitespace (llguidance's
# flexible whitespace lets a small model pad an object with newlines until max_tokens)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class _MatcherGrammar(TokenGrammar):
    """A TokenGrammar over an llguidance `LLMatcher`."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill_mask(self, out: torch.Tensor) -> None:
        assert out.dtype == torch.int32 and out.is_contiguous() and not out.is_cuda
        self.matcher.unsafe_compute_mask_ptr(out.data_ptr(), out.numel() * 4)

    def try_consume(self, tokens: Sequence[int]) -> int:
        return self.matcher.try_consume_tokens(list(tokens)) if len(tokens) else 0

    def rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)


class GrammarCompiler:
    def __init__(self, tokenizer: "BaseTokenizer", vocab: int, eos_ids: Sequence[int]) -> None:
        self.tokenizer, self.vocab, self.eos_ids = tokenizer, vocab, list(eos_ids)
        self._ll_tokenizer: Any = None
        self._grammars: OrderedDict[StructuredOutput, str] = OrderedDict()
        self._lock = threading.Lock()  # compile() runs on a server's HTTP threads too (Engine.compile_grammar)

    def ll_tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = _ll_tokenizer(self.tokenizer, self.vocab, self.eos_ids)
            return self._ll_tokenizer

    def warm(self) -> None:
        """Convert the tokenizer now (a server at start); one llguidance cannot read is left to refuse the requests
        that ask for a structured output, each with the reason."""
        try:
            self.ll_tokenizer()
        except RequestError:
            pass

    def compile(self, output: StructuredOutput) -> TokenGrammar:
        import llguidance

        text = self._grammar_text(output)
        matcher = llguidance.LLMatcher(self.ll_tokenizer(), text, log_level=0)
        if matcher.is_error():
            with self._lock:
                self._grammars.pop(output, None)
            raise RequestError(f"the structured output's {output.kind.replace('_', ' ')} does not compile: "
                               f"{_first_line(matcher.get_error())}")
        return _MatcherGrammar(matcher)

    def _grammar_text(self, output: StructuredOutput) -> str:
        with self._lock:
            text = self._grammars.get(output)
            if text is not None:
                self._grammars.move_to_end(output)
                return text
        text = _grammar_text(output)
        with self._lock:
            self._grammars[output] = text
            if len(self._grammars) > GRAMMAR_CACHE:
                self._grammars.popitem(last=False)
        return text


def _grammar_text(output: StructuredOutput) -> str:
    """llguidance's grammar text for an output (errors llguidance raises here become the user's sentence)."""
    from llguidance import LLMatcher, grammar_from

    try:
        if output.kind == "json_schema":
            return LLMatcher.grammar_from_json_schema(output.spec, defaults=JSON_OPTIONS)
        if output.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if output.kind == "regex":
            return LLMatcher.grammar_from_regex(output.spec)
        if output.kind == "choice":
            return grammar_from("choice", output.spec)
        return grammar_from("grammar", output.spec)  # Lark, or GBNF converted to Lark
    except ValueError as e:
        raise RequestError(f"the structured output's {output.kind.replace('_', ' ')} does not compile: "
                           f"{_first_line(str(e))}") from None


def _first_line(message: str, limit: int = 300) -> str:
    """llguidance's message on one line (its regex errors span several), cut at `limit` characters."""
    line = " ".join(part.strip() for part in message.strip().splitlines() if part.strip()) or "unknown error"
    return (line if len(line) <= limit else line[: limit - 3] + "...").rstrip(".")


def _ll_tokenizer(tokenizer: "BaseTokenizer", vocab: int, eos_ids: list[int]) -> Any:
    """llguidance's view of our tokenizer: a `tokenizers` one through its JSON, Kimi's tiktoken one through its
    encoding."""
    import llguidance

    n = tokenizer.vocab_size
    if n > vocab:
        raise RequestError(f"structured outputs need a tokenizer within the model's vocabulary (the tokenizer has "
                           f"{n} tokens, the model {vocab})")
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "to_str"):
        return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab, eos_token=eos_ids)
    encoding = getattr(tokenizer, "model", None)
    if encoding is not None and hasattr(encoding, "_mergeable_ranks"):
        from llguidance.tiktoken import lltokenizer_from_encoding

        return lltokenizer_from_encoding(encoding, n_vocab=vocab, eos_token=eos_ids)
    raise RequestError(f"structured outputs are not available for a {type(tokenizer).__name__} tokenizer")
