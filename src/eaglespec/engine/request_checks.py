"""What a request may ask of an engine, checked before it queues (each failure the user's error: `RequestError`, one
sentence).

Contract:
- `check_params(params, vocab, eos_ids, max_logprobs)`: log-probabilities within the engine's `max_logprobs`; every
  token id the request names (logit_bias, stop_token_ids, allowed_token_ids) inside the vocabulary; min_tokens not
  banning every token allowed_token_ids allows;
- `fit_context(params, n_prompt, context_len, headroom, note)`: an empty prompt, or one that leaves no room in the
  context (less the drafts' headroom), refused (`note` says why the context is shorter than the model's positions:
  `ModelConfig.context_limit_reason`, a sliding window or LongRoPE's original positions); otherwise `params` with max_new_tokens (and min_tokens) clipped to
  the room left.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..errors import RequestError
from ..layers.logprobs import check_asked
from ..sampling_params import SamplingParams


def check_params(params: SamplingParams, vocab: int, eos_ids: Sequence[int], max_logprobs: int | None) -> None:
    if params.logprobs is not None:
        check_asked(params.logprobs, max_logprobs)
    outside = sorted({t for t in params.token_ids() if t >= vocab})
    if outside:
        raise RequestError(f"token ids {outside} (logit_bias, stop_token_ids, allowed_token_ids) are outside the "
                           f"model's vocabulary of {vocab} tokens")
    if (params.allowed_token_ids is not None and params.bans_stops
            and set(params.allowed_token_ids) <= params.ending_ids(eos_ids)):
        raise RequestError(f"min_tokens ({params.min_tokens}) bans every token allowed_token_ids allows (they all "
                           "end the answer)")


def fit_context(params: SamplingParams, n_prompt: int, context_len: int, headroom: int,
                note: str = "") -> SamplingParams:
    if not n_prompt:
        raise RequestError("the prompt is empty")
    room = context_len - headroom
    if n_prompt >= room:
        raise RequestError(f"the prompt has {n_prompt} tokens but the model's context is {context_len} tokens{note}")
    max_new = min(params.max_new_tokens, room - n_prompt)
    if max_new != params.max_new_tokens:
        params = replace(params, max_new_tokens=max_new, min_tokens=min(params.min_tokens, max_new))
    return params
