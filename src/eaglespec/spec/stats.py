"""Acceptance statistics of speculative decoding.

tau (acceptance length) = accepted draft tokens + 1 (the bonus) per verification step. `SpecStats` keeps the
histogram of tau, from which the mean, the per-depth acceptance rates (P(depth d accepted | depth d-1 accepted)) and
the step counts follow; `merge` combines per-request statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    max_tau: int = 1
    hist: list[int] = field(default_factory=list)  # hist[t] = verification steps with tau == t (index 0 unused)
    draft_forwards: int = 0
    verify_steps: int = 0

    def __post_init__(self) -> None:
        if len(self.hist) < self.max_tau + 1:
            self.hist = self.hist + [0] * (self.max_tau + 1 - len(self.hist))

    def _grow(self, tau: int) -> None:
        if tau > self.max_tau:
            self.hist += [0] * (tau - self.max_tau)
            self.max_tau = tau

    def add(self, tau: int, draft_forwards: int) -> None:
        self._grow(tau)
        self.hist[tau] += 1
        self.verify_steps += 1
        self.draft_forwards += draft_forwards

    def merge(self, other: "SpecStats") -> None:
        self._grow(other.max_tau)
        for t, n in enumerate(other.hist):
            self.hist[t] += n
        self.verify_steps += other.verify_steps
        self.draft_forwards += other.draft_forwards

    @property
    def accept_length_mean(self) -> float:
        n = sum(self.hist)
        return sum(t * c for t, c in enumerate(self.hist)) / n if n else 0.0

    def depth_rates(self) -> list[float]:
        """rates[d-1] = P(tau > d | tau > d-1) for d = 1..max_tau-1: acceptance of the draft token at depth d."""
        rates = []
        for d in range(1, self.max_tau):
            reached = sum(self.hist[d:])
            passed = sum(self.hist[d + 1 :])
            rates.append(passed / reached if reached else 0.0)
        return rates

    def to_dict(self) -> dict:
        return {
            "accept_length_mean": round(self.accept_length_mean, 4),
            "accept_length_hist": {str(t): c for t, c in enumerate(self.hist) if t >= 1},
            "accept_rate_per_depth": [round(r, 4) for r in self.depth_rates()],
            "verify_steps": self.verify_steps,
            "draft_forwards": self.draft_forwards,
        }
