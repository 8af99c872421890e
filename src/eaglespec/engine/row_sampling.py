"""Each cache row's sampling parameters, on the device: what a step's sampled rows read, by row.

Contract of `RowSampling(rows, device)`: temperature [rows] float32, top_k [rows] int64, top_p [rows] float32, and
for `SamplingParams.seed` seed [rows] int64 and seeded [rows] bool (a sampled row with its own seed).
- `set(row, params)`: a request's parameters into its row, as enqueued fills (`t[row] = value` would copy a host
  scalar to the device, which on CUDA synchronises the stream: the device idles while the host catches up);
- `tensors()`: every per-row tensor (a row moved to another copies them: `ModelRunner.move_row`);
- `params(r)`: (temperature, top_k, top_p) of the step's rows r (an index tensor, or slice(0, B) in graph phases:
  views);
- `draws(generator, r, position, site, seeded_step)`: where the step's draws come from: `generator`, or in a step
  holding a seeded row a `RowDraws` over rows r (layers/row_draws.py; position [B]: their committed lengths as the
  step began).

`StepExtras(seeded, adjusted, constrained)`: the optional parts of a step (part of every graph key, so steps without
them run graphs that compute none): rows drawing from their own seeds, rows whose logits are adjusted
(engine/row_adjust.py), rows held to a structured output (masks read from engine/grammar_rows.py).
`StepExtras.of(params)` gives a step's, from its requests' parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

import torch

from ..layers.row_draws import RowDraws
from ..layers.sampling import Draws
from ..sampling_params import SamplingParams

Rows = Union[torch.Tensor, slice]


@dataclass(frozen=True)
class StepExtras:
    seeded: bool = False  # a sampled row draws from its own seed (SamplingParams.seed)
    adjusted: bool = False  # a row's logits are adjusted (SamplingParams.adjusts_logits)
    constrained: bool = False  # a row has a structured output (SamplingParams.structured)

    @staticmethod
    def of(params: Iterable[SamplingParams]) -> "StepExtras":
        ps = list(params)
        return StepExtras(seeded=any(p.seed is not None and not p.greedy for p in ps),
                          adjusted=any(p.adjusts_logits for p in ps),
                          constrained=any(p.structured is not None for p in ps))


class RowSampling:
    def __init__(self, rows: int, device: torch.device) -> None:
        self.temperature = torch.zeros(rows, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(rows, dtype=torch.int64, device=device)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=device)
        self.seed = torch.zeros(rows, dtype=torch.int64, device=device)
        self.seeded = torch.zeros(rows, dtype=torch.bool, device=device)

    def set(self, row: int, params: SamplingParams) -> None:
        self.temperature[row].fill_(params.temperature)
        self.top_k[row].fill_(params.top_k)
        self.top_p[row].fill_(params.top_p)
        self.seed[row].fill_(params.seed or 0)
        self.seeded[row].fill_(params.seed is not None and not params.greedy)

    def tensors(self) -> list[torch.Tensor]:
        return [self.temperature, self.top_k, self.top_p, self.seed, self.seeded]

    def params(self, r: Rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.temperature[r], self.top_k[r], self.top_p[r]

    def draws(self, generator: torch.Generator | None, r: Rows, position: torch.Tensor, site: int,
              seeded_step: bool) -> Draws:
        return RowDraws(generator, self.seed[r], self.seeded[r], position, site) if seeded_step else generator
