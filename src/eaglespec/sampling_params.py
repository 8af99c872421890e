"""Per-request generation parameters (frozen, validated at construction: a bad value is a `RequestError`)."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import RequestError
from .layers.logprobs import MAX_TOP_LOGPROBS
from .layers.sampling import validate_sampling


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    stop: tuple[str, ...] = ()  # stop strings (not included in the output text)
    ignore_eos: bool = False
    # False: no text while generating (no per-token detokenization on the host); the text is decoded once at the end
    # (throughput jobs such as drafter-data regeneration). Stop strings need it.
    detokenize: bool = True
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

    def __post_init__(self) -> None:
        validate_sampling(self.temperature, self.top_p, self.top_k)
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
