"""What the frozen target contributes to one training batch, from a single forward.

Contract of `target_features(target, tokens, vocab)`: one cache-free causal forward of the target over the padded
batch (`ForwardContext.plain`), under `torch.no_grad()` (not `inference_mode`: the aux states feed `fc`, whose
weight gradient needs them saved). It uses only the EAGLE-3 protocol (capture must already be on, through
`set_eagle3_layers_to_capture`) and the forward's `ModelOutput(logits, aux_hidden)`, so a wrapper that delegates the
protocol works unchanged. Returns, per position i of the batch:
- `aux` [B, T, n_aux * H_target]: the captured states (target dtype);
- `probs` [B, T, Vd] float32: the target's next-token distribution at i restricted to the draft vocabulary and
  renormalised (the soft label of a drafter prediction of token i+1);
- `argmax` [B, T] int64: the draft id of the target's argmax at i over the full vocabulary, -1 when that token is
  outside the draft vocabulary (such positions carry no loss).
Padding positions hold garbage that the loss masks never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers.context import ForwardContext
from .vocab import DraftVocab


@dataclass
class TargetFeatures:
    aux: torch.Tensor  # [B, T, n_aux * Ht]
    probs: torch.Tensor  # [B, T, Vd] float32
    argmax: torch.Tensor  # [B, T] int64 draft ids, -1 outside the draft vocab


@torch.no_grad()
def target_features(target: torch.nn.Module, tokens: torch.Tensor, vocab: DraftVocab,
                    target_to_draft: torch.Tensor | None = None) -> TargetFeatures:
    """tokens [B, T] -> TargetFeatures (see the module docstring)."""
    B, T = tokens.shape
    out = target(tokens, ForwardContext.plain(B, T, tokens.device))
    if out.aux_hidden is None:
        raise RuntimeError("the target returned no aux states: call set_eagle3_layers_to_capture first")
    logits = out.logits  # [B, T, V]
    t2d_map = target_to_draft if target_to_draft is not None else vocab.target_to_draft
    argmax = t2d_map[logits.argmax(-1)]  # [B, T]
    if vocab.size == logits.shape[-1]:
        restricted = logits
    else:
        restricted = logits.index_select(-1, vocab.kept)  # [B, T, Vd]
    probs = torch.softmax(restricted.float(), dim=-1)
    return TargetFeatures(aux=out.aux_hidden, probs=probs, argmax=argmax)
