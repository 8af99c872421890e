"""Per-phase timing of engine steps (prefill, decode, draft, verify, commit), off unless asked for.

On CUDA each phase is bracketed by events and resolved lazily (no extra synchronisation inside a step); on the CPU a
host clock is used. `PhaseTimer.totals()` gives seconds per phase; benchmarks report the split between draft, verify
and the rest from it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch


class PhaseTimer:
    def __init__(self, device: torch.device, enabled: bool = False) -> None:
        self.device, self.enabled = device, enabled
        self._host: dict[str, float] = {}
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def reset(self) -> None:
        self._host.clear()
        self._events.clear()

    def phase(self, name: str):
        return self._timed(name) if self.enabled else nullcontext()

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._host[name] = self._host.get(name, 0.0) + time.perf_counter() - t0

    def totals(self) -> dict[str, float]:
        out = dict(self._host)
        if self._events:
            torch.cuda.synchronize(self.device)
            for name, s, e in self._events:
                out[name] = out.get(name, 0.0) + s.elapsed_time(e) / 1000.0
        return out
