"""Log-probabilities of committed tokens, computed inside the engine's steps and read with their tokens.

Contract:
- `token_logprobs(logits, tokens, k)`: logits [N, V] (the target's raw logits: before temperature, top-k or top-p,
  as vLLM reports them by default) and the tokens chosen from them [N] -> one packed float32 row per token
  [N, 1 + 2k]: the token's log-probability, the k highest log-probabilities of the row (best first), then those k
  tokens' ids (as float32: exact below 2^24, checked). No host synchronisation: graph steps compute it in place.
  On CUDA for up to KERNEL_MAX_ROWS rows two Triton kernels (layers/logprobs_kernel.py), otherwise PyTorch
  operations.
- `TokenLogprob`: one committed token's entry as a request keeps it: its id, log-probability and the top
  alternatives the request asked for ([(id, log-probability)], best first); `unpack(row, k)` reads one packed row
  (of an engine computing `(len(row) - 1) // 2` alternatives) into it, keeping the first k.
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
# Rows up to which CUDA takes the kernels. H200, SmolLM2 bf16, MT-bench, logprobs=5 (session 46,
# benchmarks/logprobs_check.py), tok/s lost to asking against not asking, PyTorch's path -> the kernels: 1 row
# (decode: 1 row; the chain's verify: 4) 15.9% -> 7.1% and 14.5% -> 4.8%; 32 rows of speculation (192 verify rows)
# 18.4% -> 19.9%; 32 rows of plain decoding 14.5% -> 41.9%, not understood (benchmarks/logprobs_cost.py times the
# two paths alone, not yet run on the GPU)
KERNEL_MAX_ROWS = 8


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """logits [N, V], tokens [N] int64 -> [N, 1 + 2k] float32 (module docstring)."""
    assert logits.shape[-1] <= MAX_ID, "vocabulary too large for float32 ids"
    if logits.is_cuda and logits.shape[0] <= KERNEL_MAX_ROWS and logprobs_kernel.fits(logits.shape[-1], k):
        return logprobs_kernel.packed_rows(logits, tokens, k)
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [N, 1]
    chosen = x.gather(-1, tokens[:, None]) - lse  # [N, 1]
    if k == 0:
        return chosen
    top, ids = x.topk(k, dim=-1)  # [N, k] best first
    return torch.cat((chosen, top - lse, ids.float()), dim=-1)


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
    """One packed row (a list of floats) of `token` -> its entry with the first k alternatives."""
    K = (len(row) - 1) // 2
    assert k <= K, f"{k} alternatives asked of rows holding {K}"
    return TokenLogprob(token, float(row[0]), tuple((int(row[1 + K + j]), float(row[1 + j])) for j in range(k)))
