"""Random draws for rows that carry their own seeds (`SamplingParams.seed`): counter-based, so that a seeded
request's samples depend on its seed and its own progress only, never on the engine's generator or its batch-mates.

Contract:
- `RowDraws(generator, seed, seeded, position, site)`: for a step's B rows (in the step's row order): seed [B] int64,
  seeded [B] bool, position [B] int64 (the row's committed length when the step began: each step of a row starts at
  a new one), and the step's first draw site (`PREFILL_SITE`, `DECODE_SITE`, `DRAFT_SITE`, `VERIFY_SITE`: each
  phase's draws apart from the others'). `uniform(shape, device)` / `exponential(shape, device, dtype, base)` return
  draws of `shape` (rows first, shape[0] == B): unseeded rows keep the engine stream's (`generator`'s, drawn as
  `layers/sampling.py` draws them without seeds; `base` for the exponential), seeded rows take hash(seed, position,
  site, element); each call takes the next site.
  Sampling functions accept it wherever they take a generator (`layers/sampling.py` `uniform`, `_exponential`).
- `hashed_uniform(seed, position, site, shape)`: the seeded rows' U(0, 1) draws, float32 in (0, 1) (24 bits, never 0
  or 1): splitmix64's finaliser over 64-bit integer counters (two's-complement wrap-around on int64, as PyTorch's
  integer arithmetic on the CPU and CUDA has it). No host synchronisation: graph steps compute it in place.
Only steps holding a seeded sampled row build these (the engine keys its graphs by it), so other steps run as before.
"""

from __future__ import annotations

import math

import torch

PREFILL_SITE, DECODE_SITE, DRAFT_SITE, VERIFY_SITE = 0, 1, 1 << 8, 1 << 16

# splitmix64's constants as signed int64 (the golden-ratio increment and the finaliser's multipliers)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)


def _int64(x: int) -> int:
    """A Python integer wrapped to int64, as tensor arithmetic wraps (a product of constants leaves its range)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (>> is arithmetic on signed integers)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def hashed_uniform(seed: torch.Tensor, position: torch.Tensor, site: int, shape: tuple[int, ...]) -> torch.Tensor:
    """seed, position [B] int64 -> U(0, 1) float32 of `shape` (shape[0] == B), one independent stream per (seed,
    position, site) and one draw per element."""
    B, rest = shape[0], tuple(shape[1:])
    key = _mix(_mix(seed * _GOLDEN + position) + _int64(site * _GOLDEN))  # [B]
    n = math.prod(rest)
    element = torch.arange(n, dtype=torch.int64, device=seed.device).view(1, *rest)
    z = _mix(key.view(B, *([1] * len(rest))) + (element + 1) * _GOLDEN)
    return (_shr(z, 40).float() + 0.5) * (1.0 / (1 << 24))


class RowDraws:
    """A step's random draws when some of its rows carry seeds (module docstring)."""

    def __init__(self, generator: torch.Generator | None, seed: torch.Tensor, seeded: torch.Tensor,
                 position: torch.Tensor, site: int) -> None:
        self.generator, self.seed, self.seeded, self.position = generator, seed, seeded, position
        self.site = site

    def _rows(self, base: torch.Tensor, shape: tuple[int, ...], transform) -> torch.Tensor:
        """base: the engine stream's draws of `shape`; seeded rows' replaced by `transform(hashed uniforms)`."""
        own = transform(hashed_uniform(self.seed, self.position, self.site, shape))
        self.site += 1
        mask = self.seeded.view(shape[0], *([1] * (len(shape) - 1)))
        return torch.where(mask, own.to(base.dtype), base)

    def uniform(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        base = torch.rand(shape, generator=self.generator, device=device)
        return self._rows(base, tuple(shape), lambda u: u)

    def exponential(self, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype,
                    base: torch.Tensor) -> torch.Tensor:
        """Exp(1) draws: `base` (the engine stream's, as layers/sampling.py draws them), seeded rows' -log(U)."""
        return self._rows(base, tuple(shape), lambda u: -torch.log(u))
