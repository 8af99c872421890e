"""Batching policy, in plain Python: which requests run next, and in which cache rows.

Requests wait in FIFO order. A step either prefills waiting requests (as many as there are free rows and as fit the
prefill token budget) or, when none can be admitted, advances every running request by one decode or speculative
step. A finished request frees its row at once, so a server can admit new work between steps (continuous batching).

Admission: with `min_prefill_rows = 1` (the default) waiting requests are admitted as soon as one row is free: the
lowest time to first token. A throughput job (drafter-data regeneration: thousands of prompts through hundreds of
rows) sets it higher: waiting requests are then admitted only once that many rows are free, or once every waiting
request fits, or when nothing runs. Otherwise, with hundreds of rows, almost every other step would be a one-row
prefill (a row frees every ~1-2 steps), and small eager prefills would cost more than the batched decode steps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .request import Request


@dataclass
class Batch:
    kind: str  # "prefill" or "decode"
    requests: list[Request]

    @property
    def rows(self) -> list[int]:
        return [r.slot for r in self.requests]  # type: ignore[misc]


class Scheduler:
    def __init__(self, rows: int, prefill_token_budget: int = 8192, min_prefill_rows: int = 1) -> None:
        self.free: list[int] = list(range(rows))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefill_token_budget = prefill_token_budget
        self.min_prefill_rows = max(1, min(min_prefill_rows, rows))

    def may_admit(self) -> bool:
        if not self.waiting or not self.free:
            return False
        return (not self.running or len(self.free) >= self.min_prefill_rows
                or len(self.free) >= len(self.waiting))

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Batch | None:
        admitted: list[Request] = []
        budget = self.prefill_token_budget
        if self.may_admit():  # decided once: admitting shrinks the free rows
            while self.waiting and self.free:
                req = self.waiting[0]
                n = len(req.prompt_ids)
                if admitted and n > budget:
                    break
                self.waiting.popleft()
                req.slot = self.free.pop(0)
                admitted.append(req)
                budget -= n
        if admitted:
            self.running.extend(admitted)
            return Batch("prefill", admitted)
        if self.running:
            return Batch("decode", sorted(self.running, key=lambda q: q.slot))
        return None

    def release_finished(self) -> list[Request]:
        done = [r for r in self.running if r.finished]
        if done:
            self.free = sorted(self.free + [r.slot for r in done])  # type: ignore[misc]
        self.running = [r for r in self.running if not r.finished]
        return done
