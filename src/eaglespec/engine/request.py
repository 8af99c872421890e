"""A generation request and its host-side bookkeeping: output tokens, streamed text, stop handling; and
`GenerationOutput`, a finished request as `Engine.generate` returns it (`Request.output()`).

`Request.append(tokens, logprob_rows)` takes the tokens one step committed (one for plain decoding, up to S+1 for
speculation), with their packed log-probability rows (layers/logprobs.py) when the step computed them; a request
that asked (`params.logprobs`) keeps its output tokens' entries with the alternatives it asked for in `logprobs`,
beside `output_ids` (`take_logprobs` gives those added since its last call), and
stops at exactly the right token: EOS (unless ignored) or one of `params.stop_token_ids` (`stop_ids`; neither is
part of the output), the token budget, the token that completes a stop string (the text is cut before the stop
string, or after it with `params.include_stop_str_in_output`; with `params.min_tokens` only a stop string that ends
after the first min_tokens tokens: the engine bans the stop tokens before, layers/logit_adjust.py), or, with
`params.stop_loop` N, the first token deeper than N tokens into a repetition loop (not part of the output;
repetition.py). Tokens after that
point are dropped. `finish_reason`: "stop" (EOS or stop string), "length" or "loop"; "abort" once `abort_requested`
was set (`Engine.abort`): the next `append` takes none of its tokens and finishes the request, as an EOS would, so an
aborted request leaves its row by the same path as one that ends by itself.
The text grows as tokens come when someone may read it meanwhile (`stream`, the default: `take_delta`, a server) or
stop strings must be matched in it; a step's tokens are then detokenized in one call, and token by token only with
stop strings (a stop string must end the output at the exact token that completes it). Otherwise
(`stream=False`: `Engine.generate`, whose caller reads the text at the end; or `params.detokenize` false) the text
is decoded once, when the request finishes: the same text, without ~10 us of host time per token (SmolLM2's
tokenizer on a 2-core CPU, one token per call; 32 rows of a speculative step commit ~80 tokens), which can exceed a
small model's device step.
The text skips special tokens unless `params.skip_special_tokens` is false.
A structured-output request carries its grammar state (`grammar`, grammar/token_grammar.py), which takes every
output token as it is appended (the engine masks each step's logits by it: engine/step_grammar.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ..layers.logprobs import TokenLogprob, unpack
from ..loading.detokenizer import IncrementalDetokenizer
from ..repetition import LoopTracker
from ..sampling_params import SamplingParams
from ..spec.stats import SpecStats

if TYPE_CHECKING:
    from ..grammar.token_grammar import TokenGrammar
    from ..loading.tokenizer import BaseTokenizer


@dataclass
class GenerationOutput:
    """A finished request as `Engine.generate` returns it (`Request.output`)."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    seconds: float
    stats: SpecStats
    logprobs: list[TokenLogprob] | None = None  # one per output token, when the request asked (params.logprobs)
    cached_tokens: int = 0  # prompt tokens whose cache entries were reused, not prefilled (scheduler.py)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "tokens": len(self.token_ids),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "seconds": round(self.seconds, 4),
            **(self.stats.to_dict() if self.stats.verify_steps else {}),
            **({"logprobs": [e.to_dict() for e in self.logprobs]} if self.logprobs is not None else {}),
        }


@dataclass
class Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: tuple[int, ...]
    tokenizer: "BaseTokenizer | None" = None
    mm_inputs: object | None = None  # a multimodal target's prepared images (see Engine.add_request)
    stream: bool = True  # the text may be read while the request runs (module docstring)
    grammar: "TokenGrammar | None" = None  # params.structured's state (Engine._enqueue compiles it)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # beside output_ids, when params.logprobs is set
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS or stop string), "length", "loop" (params.stop_loop), "abort"
    abort_requested: bool = False  # Engine.abort: finish at the next append
    stats: SpecStats = field(default_factory=SpecStats)
    slot: int | None = None
    reused: int = 0  # prompt positions whose cache entries its row already held (scheduler.py: prefix reuse)
    t_start: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    t_end: float | None = None
    _detok: IncrementalDetokenizer | None = None
    _emitted: int = 0  # characters of `text` already returned by take_delta
    _lp_emitted: int = 0  # entries of `logprobs` already returned by take_logprobs
    _loops: LoopTracker | None = None  # the output's loop runs, with params.stop_loop
    stop_ids: frozenset[int] = field(init=False, default=frozenset())  # set from params and eos_ids (__post_init__)

    def __post_init__(self) -> None:
        self.stop_ids = self.params.ending_ids(self.eos_ids)
        if self.tokenizer is not None and self.params.detokenize and (self.stream or self.params.stop):
            self._detok = IncrementalDetokenizer(self.tokenizer, self.params.skip_special_tokens)
        if self.params.stop_loop:
            self._loops = LoopTracker()
        if self.params.logprobs is not None:
            self.logprobs = []

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, tokens: Sequence[int], logprob_rows: Sequence[Sequence[float]] | None = None) -> int:
        """Commit tokens in order until the request finishes; returns how many were taken. `logprob_rows`: the
        tokens' packed rows (one each, or more: the rest are a step's padding), read when the request asked."""
        if self.abort_requested and not self.finished:
            self.finish_reason = "abort"
            self.t_end = time.perf_counter()
            return 0
        if self.t_first is None:
            self.t_first = time.perf_counter()
        taken = 0
        per_token = self._detok is not None and bool(self.params.stop)
        start = len(self.output_ids)
        for tok in tokens:
            if self.finished:
                break
            taken += 1
            if tok in self.stop_ids:
                self.finish_reason = "stop"
                break
            if self._loops is not None and self._loops.add(tok) > self.params.stop_loop:
                self.finish_reason = "loop"
                break
            self.output_ids.append(tok)
            if self.logprobs is not None:
                assert logprob_rows is not None, "a request that asked for log-probabilities got tokens without them"
                self.logprobs.append(unpack(logprob_rows[taken - 1], tok, self.params.logprobs))
            if per_token:
                old_len = len(self.text)
                self.text += self._detok.add([tok])
                if len(self.output_ids) >= self.params.min_tokens and self._cut_at_stop(old_len):
                    self.finish_reason = "stop"
                    break
            if len(self.output_ids) >= self.params.max_new_tokens:
                self.finish_reason = "length"
        if self.grammar is not None and len(self.output_ids) > start:
            self.grammar.commit(self.output_ids[start:])
        if self._detok is not None and not per_token and len(self.output_ids) > start:
            self.text += self._detok.add(self.output_ids[start:])  # the step's tokens in one call
        if self.finished:
            self.t_end = time.perf_counter()
            if self._detok is not None and not (self.params.stop and self.finish_reason == "stop"):
                self.text += self._detok.finish()
            elif self._detok is None and self.tokenizer is not None:
                self.text = self.tokenizer.decode(self.output_ids, skip_special_tokens=self.params.skip_special_tokens)
        return taken

    def _cut_at_stop(self, old_len: int) -> bool:
        # the text before old_len held no stop string, so a new one ends after old_len
        start = max(0, old_len - max(len(s) for s in self.params.stop) + 1)
        hits = [(i, -len(s)) for s in self.params.stop if (i := self.text.find(s, start)) >= 0]
        if not hits:
            return False
        i, neg_len = min(hits)  # the first to start (of those starting there, the longest)
        self.text = self.text[: i - neg_len if self.params.include_stop_str_in_output else i]
        return True

    def output(self) -> GenerationOutput:
        return GenerationOutput(text=self.text, token_ids=self.output_ids, prompt_tokens=len(self.prompt_ids),
                                finish_reason=self.finish_reason or "length",
                                seconds=(self.t_end or time.perf_counter()) - self.t_start, stats=self.stats,
                                logprobs=self.logprobs, cached_tokens=self.reused)

    def take_logprobs(self) -> list[TokenLogprob]:
        """The log-probability entries added since the last call (empty when the request asked for none)."""
        if self.logprobs is None:
            return []
        out = self.logprobs[self._lp_emitted:]
        self._lp_emitted = len(self.logprobs)
        return out

    def take_delta(self) -> str:
        """Text produced since the last call. While a stop string may still be forming, its possible prefix is held
        back so that streamed text never shows part of a stop string."""
        hold = 0
        if self.params.stop and not self.finished:
            for s in self.params.stop:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        hold = max(hold, k)
                        break
        end = max(self._emitted, len(self.text) - hold)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta
