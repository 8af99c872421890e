"""Per-row logit adjustments before a token is chosen, as tensor functions (no host synchronisation, CUDA-graph
friendly): what `SamplingParams`' penalties, logit_bias, min_tokens and min_p do to the target's logits.

`adjust_logits(logits, counts, seen, bias, ban, rep, freq, pres, min_p, temperature)`: logits [..., V] -> float32
[..., V] (the other arguments broadcast against logits [..., V] and its rows [...]: a verify step passes [B, D, V]
logits with each row's [B, 1, V] tables and [B, 1] parameters), in vLLM's order:
 1. `+ bias` (OpenAI's logit_bias; -inf outside vLLM's allowed_token_ids);
 2. -inf where `ban` (a stop token before min_tokens);
 3. the repetition penalty (HF's and vLLM's): a token of the prompt (`seen`) or the output (`counts > 0`) has its
    logit l divided by rep where l > 0, multiplied by it otherwise;
 4. `- freq * counts - pres * (counts > 0)` (OpenAI's frequency and presence penalties, over the output only);
 5. min-p (sampled rows): -inf where softmax(l / T) < min_p * its maximum, that is l < max(l) + T ln(min_p). A
    greedy row (T = 0) is left alone: its argmax is never dropped.
Temperature, top-k and top-p then act on what is left (layers/sampling.py), as vLLM's sampler does after min-p.
A row with neutral parameters (bias 0, no ban, rep 1, freq 0, pres 0, min_p 0) gets its logits back unchanged.

`path_counts(tokens, ancestors, V)`: tokens [B, D] of a draft tree, ancestors [B, D, D] (ancestor-or-self) ->
[B, D, V] int32: how often each token lies on node n's path from below the root to n itself. A verify step adds it to
a row's output counts at node n: the target's logits there follow exactly those tokens, so an adjusted position sees
the counts plain decoding would have had there, and speculation stays lossless.
"""

from __future__ import annotations

import torch


def adjust_logits(logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, bias: torch.Tensor,
                  ban: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor, min_p: torch.Tensor,
                  temperature: torch.Tensor) -> torch.Tensor:
    """logits [N, V]; counts [N, V] int (output tokens); seen [N, V] bool (prompt tokens); bias [N, V] float;
    ban [N, V] bool; rep, freq, pres, min_p, temperature [N] -> adjusted float32 logits [N, V] (or broadcasting
    shapes: module docstring)."""
    out = logits.float() + bias
    out = out.masked_fill(ban, float("-inf"))
    occurs = counts > 0
    repeated = seen | occurs
    r = rep.float()[..., None]
    out = torch.where(repeated, torch.where(out > 0, out / r, out * r), out)
    out = out - freq.float()[..., None] * counts - pres.float()[..., None] * occurs
    # min-p as a threshold on the logits: p(x) < min_p p_max <=> l(x) < l_max + T ln(min_p); -inf where off or greedy
    t = temperature.float()
    shift = torch.where((min_p > 0) & (t > 0), t * torch.log(min_p.float().clamp_min(1e-30)),
                        torch.full_like(t, float("-inf")))
    floor = out.amax(-1, keepdim=True) + shift[..., None]
    return out.masked_fill(out < floor, float("-inf"))


def path_counts(tokens: torch.Tensor, ancestors: torch.Tensor, V: int) -> torch.Tensor:
    """tokens [B, D] (node 0 the root: committed, so not counted), ancestors [B, D, D] -> [B, D, V] int32 (module
    docstring)."""
    B, D = tokens.shape
    below_root = (torch.arange(D, device=tokens.device) > 0).to(torch.int32)  # [D]: the root was counted
    on_path = ancestors.to(torch.int32) * below_root  # [B, D, D]
    out = torch.zeros(B, D, V, dtype=torch.int32, device=tokens.device)
    return out.scatter_add_(2, tokens[:, None, :].expand(B, D, D), on_path)
