"""Per-row logit adjustments before a token is chosen, as tensor functions (no host synchronisation, CUDA-graph
friendly): what `SamplingParams`' penalties, logit_bias, min_tokens and min_p do to the target's logits.

The adjustment of a logit x of token v, in vLLM's order:
 1. y = x + bias[v] (OpenAI's logit_bias; -inf outside vLLM's allowed_token_ids);
 2. the repetition penalty (HF's and vLLM's): where v is in the prompt (`seen`) or the output (count > 0),
    y / rep where y > 0, y * rep otherwise;
 3. minus freq * count + pres * (count > 0) (OpenAI's frequency and presence penalties, over the output only), or
    minus infinity where the row bans v (a stop token before min_tokens);
 4. min-p (sampled rows): -inf where softmax(l / T) < min_p * its maximum, that is l < max(l) + T ln(min_p). A
    greedy row (T = 0) is left alone: its argmax is never dropped.
Temperature, top-k and top-p then act on what is left (layers/sampling.py), as vLLM's sampler does after min-p.
A row with neutral parameters (bias 0, nothing banned, rep 1, freq 0, pres 0, min_p 0) gets its logits back.

Steps 2-3 depend on the row and the token only, so they are tables: `row_terms(counts, seen, stops, rep, freq, pres)`
-> `Terms` (reff: the repetition divisor, 1 where v has not occurred; sub and sub_banned: what step 3 subtracts),
[..., V] like counts. `apply_terms(logits, bias, terms, banned)` applies steps 1-3 to logits [..., V] (the tables
broadcast against it; `banned` [...] bool: whether the position's row bans its stop tokens), and `min_p_cut(out,
min_p, temperature)` step 4. Every path (a decode's rows, a verify's nodes, the drafter's positions) goes through
these same operations, so a token's adjusted logit is computed alike wherever it is computed: greedy speculation
chooses what plain decoding would.

`tree_logits(logits, tree, counts, seen, stops, bias, rep, freq, pres, banned, min_p, temperature)`: a verify step's
[B, D, V] logits, node n adjusted as plain decoding would after n's path: the row's tables (its counts so far) applied
to every node, then the entries of the tokens on n's path (at most S per node) recomputed with their counts raised by
their occurrences on the path, and min-p last. That is ~10 passes over [B, D, V] rather than a [B, D, V] table of
counts and ~20 passes.
`adjust_logits(logits, counts, seen, stops, bias, rep, freq, pres, banned, min_p, temperature)`: the one-position
form (rows [N, V], or any broadcasting shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..spec.tree import DraftTree


@dataclass
class Terms:
    reff: torch.Tensor  # [..., V] float32: the repetition penalty where the token occurred, else 1
    sub: torch.Tensor  # [..., V] float32: freq * count + pres * (count > 0)
    sub_banned: torch.Tensor  # [..., V] float32: sub, +inf where the row's stop tokens are banned


def row_terms(counts: torch.Tensor, seen: torch.Tensor, stops: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor,
              pres: torch.Tensor) -> Terms:
    """counts [..., V] int (output tokens), seen / stops [..., V] bool; rep, freq, pres [...] (per row) -> Terms."""
    occurs = counts > 0
    reff = torch.where(seen | occurs, rep.float()[..., None], 1.0)
    sub = freq.float()[..., None] * counts + pres.float()[..., None] * occurs
    return Terms(reff, sub, sub.masked_fill(stops, float("inf")))


def apply_terms(logits: torch.Tensor, bias: torch.Tensor, terms: Terms, banned: torch.Tensor) -> torch.Tensor:
    """Steps 1-3: logits [..., V] (any float dtype), bias and terms broadcasting against it, banned [...] bool ->
    float32 [..., V]."""
    y = logits + bias  # float32 (bias is)
    y = torch.where(y > 0, y / terms.reff, y * terms.reff)
    return y - torch.where(banned[..., None], terms.sub_banned, terms.sub)


def min_p_cut(out: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Step 4 on out [..., V]; min_p, temperature [...] (per position, or broadcasting)."""
    t = temperature.float()
    shift = torch.where((min_p > 0) & (t > 0), t * torch.log(min_p.float().clamp_min(1e-30)),
                        torch.full_like(t, float("-inf")))  # ln(min_p) scaled; -inf: off (or greedy)
    return out.masked_fill(out < out.amax(-1, keepdim=True) + shift[..., None], float("-inf"))


def adjust_logits(logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, stops: torch.Tensor,
                  bias: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor,
                  banned: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [N, V]; counts [N, V] int; seen, stops [N, V] bool; bias [N, V] float; rep, freq, pres, banned,
    min_p, temperature [N] -> float32 [N, V] (or broadcasting shapes: module docstring)."""
    out = apply_terms(logits, bias, row_terms(counts, seen, stops, rep, freq, pres), banned)
    return min_p_cut(out, min_p, temperature)


def tree_logits(logits: torch.Tensor, tree: "DraftTree", counts: torch.Tensor, seen: torch.Tensor,
                stops: torch.Tensor, bias: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor,
                banned: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [B, D, V]; the rows' counts [B, V] int, seen / stops [B, V] bool, bias [B, V]; rep, freq, pres, min_p,
    temperature [B]; banned [B, D] (node n's row bans its stop tokens there) -> float32 [B, D, V]."""
    per_row = [t[:, None] for t in (rep, freq, pres)]  # [B, 1]: against the nodes
    terms = row_terms(counts[:, None], seen[:, None], stops[:, None], *per_row)  # [B, 1, V]
    out = apply_terms(logits, bias[:, None], terms, banned)  # [B, D, V], as if no draft token had occurred
    # the tokens on node n's path below the root: path[b, n, j] the node at depth j + 1 (-1 past n's depth)
    path = tree.paths[..., 1:]  # [B, D, S]
    valid = path >= 0
    ids = torch.gather(tree.tokens[:, None, :].expand(path.shape[0], path.shape[1], -1), 2, path.clamp(min=0))
    # invalid slots repeat slot 0's token, so that every write of an entry carries the same value (slot 0 is valid
    # below the root; at the root nothing is valid and slot 0 rewrites the entry's own value)
    ids = torch.where(valid, ids, ids[..., :1])  # [B, D, S]
    extra = ((ids[..., :, None] == ids[..., None, :]) & valid[..., None, :]).sum(-1)  # [B, D, S]: on-path count
    B, D, S = ids.shape
    flat = ids.reshape(B, D * S)

    def take(t: torch.Tensor) -> torch.Tensor:  # a row table [B, V] at the entries -> [B, D, S]
        return torch.gather(t, 1, flat).view(B, D, S)

    entry_terms = row_terms(take(counts) + extra, take(seen), take(stops), *per_row)
    fixed = apply_terms(torch.gather(logits, 2, ids), take(bias), entry_terms, banned)
    out = out.scatter(2, ids, fixed)
    return min_p_cut(out, min_p[:, None], temperature[:, None])
