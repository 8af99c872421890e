"""The oracle drafter: a test and benchmark double that proposes the target's own greedy continuation.

Given, per cache row, the reference sequence (prompt + the target's greedy output), the drafter entry at position p
predicts `reference[p + 2]` with certainty, whatever its inputs. On the reference path every draft is accepted, so
greedy speculation reaches the maximum acceptance length (S+1 for a chain): that checks the engine's accounting, and
its tok/s is the upper bound of the engine's own overhead. It speaks the drafter interface the runner uses
(`config`, `n_aux`, `kv_cache_shapes`, `set_embed_and_head`, `to_target_ids`, forward).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..config import Eagle3Config, ModelConfig
from ..layers.context import ForwardContext


class OracleDrafter(nn.Module):
    def __init__(self, target_config: ModelConfig, references: Sequence[Sequence[int]],
                 capacity: int | None = None) -> None:
        super().__init__()
        V = target_config.vocab_size
        self.config = ModelConfig(
            architecture="OracleDrafter", model_type="oracle", vocab_size=V, hidden_size=1, intermediate_size=1,
            num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=1,
            eagle=Eagle3Config(draft_vocab_size=None, target_hidden_size=target_config.hidden_size,
                               aux_layer_ids=None),
        )
        self.n_aux = 3
        # [rows, capacity]: fixed once built, so that captured CUDA graphs keep reading the same buffer
        n = max(capacity or 0, max(len(r) for r in references) + 2)
        self.register_buffer("reference", torch.full((len(references), n), -1, dtype=torch.int64))
        self.set_references(references)
        self._anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

    def set_references(self, references: Sequence[Sequence[int]]) -> None:
        """Replace the references in place (at most as many rows, each shorter than the capacity)."""
        rows, cap = self.reference.shape
        if len(references) > rows or max(len(r) for r in references) + 2 > cap:
            raise ValueError(f"the oracle holds {rows} references of up to {cap - 2} tokens")
        table = torch.full((rows, cap), -1, dtype=torch.int64)
        for i, r in enumerate(references):
            table[i, : len(r)] = torch.tensor(list(r), dtype=torch.int64)
        self.reference.copy_(table)

    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor | None) -> None:
        self.reference = self.reference.to(embed.device)
        self._anchor.data = self._anchor.data.to(device=embed.device, dtype=embed.dtype)

    def kv_cache_shapes(self) -> list[tuple[int, ...]]:
        return [(1,)]

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def forward(self, input_ids, hidden, ctx: ForwardContext, from_target: bool, need_logits: bool = True):
        B, T = input_ids.shape
        rows = ctx.rows if ctx.rows is not None else torch.arange(B, device=input_ids.device)
        pos = ctx.positions if ctx.logits_index is None else torch.gather(ctx.positions, 1, ctx.logits_index)
        idx = (pos + 2).clamp(max=self.reference.shape[1] - 1)
        nxt = self.reference[rows[:, None], idx]  # [B, R]; -1 beyond the reference
        V = self.config.vocab_size
        logits = torch.zeros(*nxt.shape, V, device=input_ids.device)
        logits.scatter_(-1, nxt.clamp(min=0)[..., None], torch.where(nxt >= 0, 30.0, 0.0)[..., None])
        out_hidden = torch.zeros(B, nxt.shape[1], 1, dtype=self._anchor.dtype, device=input_ids.device)  # [B, R, 1]
        return (logits if need_logits else None), out_hidden
