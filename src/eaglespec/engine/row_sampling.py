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
"""

from __future__ import annotations

from typing import Union

import torch

from ..layers.row_draws import RowDraws
from ..layers.sampling import Draws
from ..sampling_params import SamplingParams

Rows = Union[torch.Tensor, slice]


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
