"""Prompt scoring: each prompt token's log-probability given the tokens before it (`Engine.score`, a server's echo).

Contract of `score_prompt(target, ids, k, device, context_len, max_logprobs)`: one cache-free forward of the target
(no row, no cache: an engine's running requests are untouched; eager, between steps), then the packed rows of
layers/logprobs.py over SCORE_CHUNK positions at a time ([chunk, V] float32, not [T, V]); the first token's entry
has logprob None (nothing predicts it); raw logits, as generated tokens' entries. An empty prompt, one longer than
the context, or k beyond `max_logprobs` is the user's error.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import RequestError
from ..layers.context import ForwardContext
from ..layers.logprobs import TokenLogprob, check_asked, token_logprobs, unpack

SCORE_CHUNK = 512  # positions per log-softmax pass


@torch.inference_mode()
def score_prompt(target: torch.nn.Module, ids: Sequence[int], k: int, device: torch.device, context_len: int,
                 max_logprobs: int | None) -> list[TokenLogprob]:
    check_asked(k, max_logprobs)
    if not ids:
        raise RequestError("the prompt is empty")
    if len(ids) > context_len:
        raise RequestError(f"the prompt has {len(ids)} tokens but the model's context is {context_len}")
    t = torch.tensor([list(ids)], dtype=torch.int64, device=device)
    n = t.shape[1]
    logits = target(t, ForwardContext.plain(1, n, device)).logits[0]  # [n, V]
    out: list[TokenLogprob] = [TokenLogprob(int(ids[0]), None)]
    for a in range(0, n - 1, SCORE_CHUNK):  # position j's logits score token j + 1
        b = min(a + SCORE_CHUNK, n - 1)
        rows = token_logprobs(logits[a:b], t[0, a + 1: b + 1], k).tolist()
        out += [unpack(r, tok, k) for r, tok in zip(rows, ids[a + 1: b + 1])]
    return out
