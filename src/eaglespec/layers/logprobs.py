"""Log-probabilities of committed tokens, computed inside the engine's steps and read with their tokens.

Contract:
- `token_logprobs(logits, tokens, k)`: logits [N, V] (the target's raw logits: before temperature, top-k or top-p,
  as vLLM reports them by default) and the tokens chosen from them [N] -> one packed float32 row per token
  [N, 1 + 2k]: the token's log-probability, then the k most likely tokens of the row, best first, as pairs
  (log-probability, id; the id as float32: exact below 2^24, checked). The first 1 + 2j entries of a row are the row
  of j alternatives, so a buffer sized for the engine's most holds a step's fewer. No host synchronisation: graph
  steps compute it in place. On CUDA two Triton kernels (layers/logprobs_kernel.py), otherwise PyTorch operations.
- `step_alternatives(asked, max_logprobs)`: the alternatives a step computes for requests asking up to `asked`: the
  kernels' time grows with k (H200, one row: 5.6 us at k = 5, 15.6 at 20), so steps whose requests ask for at most
  SMALL_TOP compute that many, others the engine's most; graphs are keyed by it (two sets at most).
- `TokenLogprob`: one committed token's entry as a request keeps it: its id, log-probability and the top
  alternatives the request asked for ([(id, log-probability)], best first); `unpack(row, token, k)` reads one packed
  row (at least 1 + 2k entries valid) into it, keeping the first k.
- `check_asked(k, max_logprobs)`: a request's (or a prompt score's) k against what an engine computes.
Log-softmax runs in float32 whatever the logits' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import RequestError
from . import logprobs_kernel

MAX_ID = 1 << 24  # ids travel as float32 in the packed rows
MAX_TOP_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's top_logprobs limit)
# Alternatives a step computes when none of its requests asks for more (`step_alternatives`). OpenAI's clients and
# evaluation harnesses mostly ask for 0-5; lm-evaluation-harness's log-likelihood requests ask for 1.
SMALL_TOP = 5


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """logits [N, V], tokens [N] int64 -> [N, 1 + 2k] float32 (module docstring)."""
    assert logits.shape[-1] <= MAX_ID, "vocabulary too large for float32 ids"
    # the kernels beat PyTorch's path at every size measured (H200, session 47, in CUDA graphs, k = 20: 15.6 against
    # 79.5 us at 1 row, 35.1 / 109.6 at 32, 147.5 / 298.9 at 192; session 46 had limited them to 8 rows on whole runs
    # that full garbage collections had slowed, engine/gc_heap.py)
    if logits.is_cuda and logprobs_kernel.fits(logits.shape[-1], k):
        return logprobs_kernel.packed_rows(logits, tokens, k)
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [N, 1]
    chosen = x.gather(-1, tokens[:, None]) - lse  # [N, 1]
    if k == 0:
        return chosen
    top, ids = x.topk(k, dim=-1)  # [N, k] best first
    return torch.cat((chosen, torch.stack((top - lse, ids.float()), dim=-1).flatten(1)), dim=-1)  # pairs


@dataclass(frozen=True, slots=True)  # slots: one object for the garbage collector to track per entry, not two
class TokenLogprob:
    token: int
    logprob: float | None  # None: a prompt's first token, which nothing predicts (Engine.score)
    top: tuple[tuple[int, float], ...] = ()  # (id, log-probability), best first

    def to_dict(self) -> dict:
        return {"token": self.token, "logprob": self.logprob, "top": [list(t) for t in self.top]}


def check_asked(k: int, max_logprobs: int | None) -> None:
    """Raise the user's error when k alternatives are more than an engine computing `max_logprobs` gives (None: it
    computes none)."""
    if max_logprobs is None or k > max_logprobs:
        raise RequestError(f"logprobs={k}: this engine computes "
                           + ("no log-probabilities" if max_logprobs is None
                              else f"at most {max_logprobs} alternatives per token")
                           + " (EngineConfig.max_logprobs; eaglespec serve --max-logprobs)")


def unpack(row: Sequence[float], token: int, k: int) -> TokenLogprob:
    """One packed row (a list of floats) of `token` -> its entry with the first k alternatives (the row's first
    1 + 2k entries; the rest may be a wider buffer's stale columns)."""
    assert 1 + 2 * k <= len(row), f"{k} alternatives asked of a row of {len(row)} entries"
    return TokenLogprob(token, float(row[0]), tuple((int(row[2 + 2 * j]), float(row[1 + 2 * j])) for j in range(k)))


def step_alternatives(asked: int, max_logprobs: int) -> int:
    """The alternatives a step computes when its requests ask for at most `asked` (<= max_logprobs)."""
    return min(SMALL_TOP, max_logprobs) if asked <= SMALL_TOP else max_logprobs
