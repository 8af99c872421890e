"""Per-request generation parameters (frozen, validated at construction: a bad value is a `RequestError`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .errors import RequestError
from .grammar.output_format import StructuredOutput
from .layers.logprobs import MAX_TOP_LOGPROBS
from .layers.sampling import validate_sampling


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    stop: tuple[str, ...] = ()  # stop strings (not included in the output text unless include_stop_str_in_output)
    include_stop_str_in_output: bool = False  # vLLM's: the text ends with the stop string that ended it
    ignore_eos: bool = False
    # False: no text while generating (no per-token detokenization on the host); the text is decoded once at the end
    # (throughput jobs such as drafter-data regeneration). Stop strings need it.
    detokenize: bool = True
    # vLLM's: False keeps special tokens (<|im_start|>, a model's tool-call markers) in the text
    skip_special_tokens: bool = True
    # > 0: finish (reason "loop") before the first output token that lies deeper than this many tokens into a
    # repetition loop (repetition.py: each token completing an 8-gram already in the output); regeneration for drafter
    # training (`--regen-stop-loop`), whose loss skips such tokens anyway (`--loop-keep`). 0: off
    stop_loop: int = 0
    # None: no log-probabilities; k >= 0: each output token's log-probability under the target's raw logits, with its
    # k most likely alternatives (at most MAX_TOP_LOGPROBS, and the engine's EngineConfig.max_logprobs)
    logprobs: int | None = None
    # A sampled request's own random stream: its draws depend on the seed and its own progress only, not on the
    # engine's seed or the requests batched with it (layers/row_draws.py), so the same seed gives the same answer
    # (float32; in bf16 up to the rounding its batch-mates move). None: the engine's stream. Greedy requests ignore it.
    seed: int | None = None
    # Logit adjustments (layers/logit_adjust.py, vLLM's order: bias, min_tokens' ban, penalties, then min-p after the
    # temperature). Speculation stays lossless under them: a verified position is adjusted for the tokens on its own
    # draft path (engine/row_adjust.py).
    # OpenAI's: subtract frequency_penalty x (the token's count in the output) and presence_penalty if it occurs there
    frequency_penalty: float = 0.0  # in [-2, 2]; 0 = off
    presence_penalty: float = 0.0  # in [-2, 2]; 0 = off
    # HF's and vLLM's: a token of the prompt or the output has its logit divided by it (multiplied when negative)
    repetition_penalty: float = 1.0  # > 0; 1 = off
    # OpenAI's: (token id, bias in [-100, 100]) pairs added to the logits (a dict is accepted and sorted)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # sampled rows: drop tokens less likely than min_p x the most likely one (after the temperature); 0 = off
    min_p: float = 0.0
    # no EOS (unless ignore_eos) nor stop_token_ids before this many output tokens, and no stop string ends earlier
    min_tokens: int = 0
    # tokens that end the answer as EOS does (not part of the output), beside the model's EOS
    stop_token_ids: tuple[int, ...] = ()
    # vLLM's: the only tokens the answer may hold (None: any); EOS is not among them unless listed
    allowed_token_ids: tuple[int, ...] | None = None
    # the shape the answer must take: a JSON schema, any JSON object, a regex, one of some strings, or a grammar
    # (grammar/output_format.py). Each step masks the logits to the tokens the grammar allows after the answer so far
    # (in a verify, after each node's draft path: lossless), and the answer ends with EOS once the grammar is complete
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        validate_sampling(self.temperature, self.top_p, self.top_k)
        self._check_adjustments()
        if self.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if self.stop_loop < 0:
            raise RequestError(f"stop_loop must be >= 0 (got {self.stop_loop})")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got {self.logprobs})")
        if self.seed is not None and not 0 <= self.seed < 1 << 63:
            raise RequestError(f"seed must be between 0 and 2**63 - 1 (got {self.seed})")
        if self.stop and not self.detokenize:
            raise RequestError("stop strings need detokenize=True (they are matched in the text as it is produced)")
        if self.structured is not None:
            self._check_structured()

    def _check_adjustments(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise RequestError(f"{name} must be between -2 and 2 (got {getattr(self, name)})")
        if not self.repetition_penalty > 0:
            raise RequestError(f"repetition_penalty must be > 0 (got {self.repetition_penalty}); 1 turns it off")
        if not 0 <= self.min_p <= 1:
            raise RequestError(f"min_p must be between 0 and 1 (got {self.min_p})")
        if self.min_tokens < 0:
            raise RequestError(f"min_tokens must be >= 0 (got {self.min_tokens})")
        if self.min_tokens > self.max_new_tokens:
            raise RequestError(f"min_tokens ({self.min_tokens}) must not exceed max_new_tokens "
                               f"({self.max_new_tokens})")
        bias = self.logit_bias
        pairs = tuple(sorted((int(t), float(b)) for t, b in (bias.items() if isinstance(bias, dict) else bias)))
        object.__setattr__(self, "logit_bias", pairs)
        for t, b in pairs:
            if t < 0:
                raise RequestError(f"logit_bias names token {t}: token ids are >= 0")
            if not -100 <= b <= 100:
                raise RequestError(f"logit_bias of token {t} must be between -100 and 100 (got {b})")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if any(t < 0 for t in self.stop_token_ids):
            raise RequestError(f"stop_token_ids must be token ids >= 0 (got {list(self.stop_token_ids)})")
        if self.allowed_token_ids is not None:
            allowed = tuple(sorted({int(t) for t in self.allowed_token_ids}))
            object.__setattr__(self, "allowed_token_ids", allowed)
            if not allowed or allowed[0] < 0:
                raise RequestError(f"allowed_token_ids must be a non-empty list of token ids >= 0 (got "
                                   f"{list(allowed)})")

    def _check_structured(self) -> None:
        if not isinstance(self.structured, StructuredOutput):
            raise RequestError("structured must be a StructuredOutput (eaglespec.grammar)")
        # each of these decides where the answer ends or which tokens it holds, against the grammar's own choice
        clashes = {"ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens > 0,
                   "allowed_token_ids": self.allowed_token_ids is not None}
        for name, clash in clashes.items():
            if clash:
                raise RequestError(f"{name} cannot be combined with a structured output (the grammar decides which "
                                   "tokens the answer holds and where it ends)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether a count penalty (frequency, presence, repetition) adjusts the request's logits: its steps take a
        speculation schedule's `penalized` entries (spec_schedule.SpecSchedule)."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1)

    @property
    def adjusts_logits(self) -> bool:
        """Whether the request's logits are adjusted before it samples (layers/logit_adjust.py): its steps then run
        the adjustment (graphs keyed by it), and a step without such a request runs none."""
        return bool(self.penalized or self.logit_bias or self.allowed_token_ids is not None or self.bans_stops
                    or (self.min_p and not self.greedy))

    @property
    def bans_stops(self) -> bool:
        """Whether min_tokens bans a token: EOS (unless ignored) or a stop token, until the answer has min_tokens."""
        return self.min_tokens > 0 and (not self.ignore_eos or bool(self.stop_token_ids))

    def ending_ids(self, eos_ids: Iterable[int]) -> frozenset[int]:
        """The tokens that end the answer (not part of it): the stop tokens, and EOS unless ignored. min_tokens bans
        them before it."""
        return frozenset(self.stop_token_ids) | frozenset(() if self.ignore_eos else eos_ids)

    def token_ids(self) -> list[int]:
        """The token ids the request names (logit_bias, stop_token_ids, allowed_token_ids), which the engine checks
        against the vocabulary."""
        return [t for t, _ in self.logit_bias] + list(self.stop_token_ids) + list(self.allowed_token_ids or ())
