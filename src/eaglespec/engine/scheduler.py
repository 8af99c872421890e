"""Batching policy, in plain Python: which requests run next, and in which cache rows.

Requests wait in FIFO order. A step either prefills waiting requests (as many as there are free rows and as fit the
prefill token budget) or, when none can be admitted, advances every running request by one decode or speculative
step. A finished request frees its row at once, so a server can admit new work between steps (continuous batching).

Prefill ahead (`ahead` spare rows, EngineConfig.prefill_ahead): an admission also prefills up to that many more
waiting requests, in cache rows past the running ones that no step covers ("parked"). When a running row frees, the
oldest parked request takes it (`join`: the engine copies its cache entries and row state across) without a prefill
of its own, so admissions cost one prefill per 1 + `ahead` requests instead of one each, and the running rows never
pause for a one-prompt prefill in between. Parked requests keep their place: they join before anything waiting is
admitted. Parking happens only while requests run (nothing else to spare), and never makes a prefill larger than
`ahead_cap` rows (the engine's prefill graphs take up to 32; larger prefills run eagerly).

Admission: with `min_prefill_rows = 1` (the default) waiting requests are admitted as soon as one row is free: the
lowest time to first token. A throughput job (drafter-data regeneration: thousands of prompts through hundreds of
rows) sets it higher: waiting requests are then admitted only once that many rows are free, or once every waiting
request fits, or when nothing runs. Otherwise, with hundreds of rows, almost every other step would be a one-row
prefill (a row frees every ~1-2 steps), and small eager prefills would cost more than the batched decode steps.

Prefix reuse (`keep`, for engines whose steps leave free rows untouched: the eager path): a free row may keep the
tokens whose cache entries its finished request left there. A request admitted into the free rows takes the kept
row that shares the longest prefix with its prompt, when it shares one (`Request.reused`: the prompt positions its
prefill skips, `reusable`), else the lowest free row that keeps nothing, else the one kept longest ago (on the CPU a
step over rows that do not start at 0 costs about the same: 30.6 against 31.0 ms for SmolLM2 alone in row 1 or 0,
34.7 against 33.1 ms for rows 1-2 or 0-1; session 52, benchmarks/row_placement_cpu.py); the prefill token budget
counts the positions left to prefill. A row's kept tokens are dropped as soon as any request takes the row
(admitted, joined or moved into it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from .request import Request


@dataclass
class Batch:
    kind: str  # "prefill" or "decode"
    requests: list[Request]

    @property
    def rows(self) -> list[int]:
        return [r.slot for r in self.requests]  # type: ignore[misc]


class Scheduler:
    def __init__(self, rows: int, prefill_token_budget: int = 8192, min_prefill_rows: int = 1, ahead: int = 0,
                 ahead_cap: int | None = None) -> None:
        self.free: list[int] = list(range(rows))
        self.spare: list[int] = list(range(rows, rows + ahead))  # free cache rows for requests prefilled ahead
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.parked: deque[Request] = deque()  # prefilled ahead, in spare rows, oldest first
        self.prefill_token_budget = prefill_token_budget
        self.min_prefill_rows = max(1, min(min_prefill_rows, rows))
        self._first_spare = rows
        # requests prefilled ahead never make a prefill batch larger than this (the engine: the most rows its prefill
        # graphs take; past them a prefill runs eagerly, ~50 ms for 32 rows on the H200)
        self.ahead_cap = ahead_cap if ahead_cap is not None else rows + ahead
        # free step rows whose caches still hold a finished request's entries: the tokens they were computed for
        self.kept: dict[int, list[int]] = {}

    def may_admit(self) -> bool:
        """A prefill may run now (the engine joins parked requests first: `join`)."""
        if self.parked or not self.waiting or not self.free:
            return False
        return (not self.running or len(self.free) >= self.min_prefill_rows
                or len(self.free) >= len(self.waiting))

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def drop_waiting(self, req: Request) -> bool:
        """Take `req` out of the queue if it waits there (an aborted request); returns whether it did."""
        kept = deque(q for q in self.waiting if q is not req)
        dropped = len(kept) != len(self.waiting)
        self.waiting = kept
        return dropped

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.parked)

    def join(self) -> list[tuple[Request, int]]:
        """Parked requests take free rows, oldest first, and run from the next step: [(request, the spare row it was
        prefilled in)], each request's `slot` now its new row. The spare rows are free again at once: anything the
        engine enqueues into them later runs after its copies, in stream order."""
        moves = []
        while self.parked and self.free:
            req = self.parked.popleft()
            moves.append((req, req.slot))
            self.spare.append(req.slot)  # type: ignore[arg-type]
            req.slot = self.free.pop(0)
            self.kept.pop(req.slot, None)  # the copies overwrite it
            self.running.append(req)
        self.spare.sort()
        return moves

    def compaction(self, bucket: Callable[[int], int]) -> list[tuple[int, int]]:
        """The row moves [(from, to)] that would let the running requests' steps cover fewer rows: `bucket(n)` is the
        rows a step of rows 0..n-1 covers (the graphs' batch bucket). Empty while anything waits or is parked (new
        requests fill the rows anyway) or while the highest running row's bucket is already that of the running
        count; else each request past that bucket moves to a free row below it."""
        slots = sorted(q.slot for q in self.running)  # type: ignore[type-var]
        if self.waiting or self.parked or not slots:
            return []
        target = bucket(len(slots))
        if bucket(slots[-1] + 1) <= target:
            return []
        holes = [r for r in self.free if r < target]
        return list(zip([s for s in slots if s >= target], holes))

    def move(self, req: Request, row: int) -> None:
        """A running request continues in the free row `row` (the engine moves its state): its old row is free."""
        self.free.remove(row)
        self.kept.pop(row, None)
        self.free = sorted(self.free + [req.slot])  # type: ignore[list-item]
        req.slot = row

    def keep(self, row: int, tokens: Sequence[int]) -> None:
        """The free step row `row` holds cache entries computed for `tokens` (a finished request's prompt and
        output, as far as its entries reach), which a later prompt that starts with them may reuse."""
        if row in self.free and tokens:
            self.kept.pop(row, None)
            self.kept[row] = list(tokens)  # last in the dict: the most recently kept

    def forget(self) -> None:
        """No free row's entries are reused from now on (a benchmark's runs each start cold)."""
        self.kept.clear()

    def _pick(self, rows: list[int], req: Request) -> tuple[int, int]:
        """(index into `rows`, prompt positions reused) of the row `req` would take: among the free step rows the
        kept one sharing the longest prefix with its prompt (`reusable`); else the first row that keeps nothing, so
        that kept rows wait for their conversations' next turns; else the row kept longest ago."""
        if rows is not self.free or not self.kept:
            return 0, 0
        best, reused = 0, 0
        if req.mm_inputs is None:
            for i, row in enumerate(rows):
                kept = self.kept.get(row)
                k = reusable(kept, req.prompt_ids) if kept is not None else 0
                if k > reused:
                    best, reused = i, k
        if reused:
            return best, reused
        empty = next((i for i, row in enumerate(rows) if row not in self.kept), None)
        return (empty if empty is not None else rows.index(next(iter(self.kept)))), 0

    def schedule(self) -> Batch | None:
        """The next batch: a prefill of admitted requests (and of requests prefilled ahead into spare rows, which
        the batch lists after them), else a decode step over the running ones, else None."""
        admitted: list[Request] = []
        budget = self.prefill_token_budget
        if self.may_admit():  # decided once: admitting shrinks the free rows
            # prefilling ahead spares the running rows a pause later; with none running there is nothing to spare
            spare = self.spare if self.running else []
            for rows, cap in ((self.free, len(self.free)), (spare, self.ahead_cap)):
                while self.waiting and rows and len(admitted) < cap:
                    req = self.waiting[0]
                    i, reused = self._pick(rows, req)
                    n = len(req.prompt_ids) - reused
                    if admitted and n > budget:
                        break
                    self.waiting.popleft()
                    req.slot, req.reused = rows.pop(i), reused
                    self.kept.pop(req.slot, None)
                    admitted.append(req)
                    budget -= n
        if admitted:
            k = sum(1 for r in admitted if r.slot < self._first_spare)  # type: ignore[operator]
            self.running.extend(admitted[:k])
            self.parked.extend(admitted[k:])
            return Batch("prefill", admitted)
        if self.running:
            return Batch("decode", sorted(self.running, key=lambda q: q.slot))
        return None

    def release_finished(self) -> list[Request]:
        """Finished requests leave their rows (parked ones too: a request may end on its prefill's token)."""
        done = [r for r in self.running if r.finished]
        if done:
            self.free = sorted(self.free + [r.slot for r in done])  # type: ignore[misc]
            self.running = [r for r in self.running if not r.finished]
        gone = [r for r in self.parked if r.finished]
        if gone:
            self.spare = sorted(self.spare + [r.slot for r in gone])  # type: ignore[misc]
            self.parked = deque(r for r in self.parked if not r.finished)
        return done + gone


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences: one comparison where the shorter starts the
    longer (a conversation's next turn), else a binary search over slice comparisons, each in C."""
    a, b = (x if isinstance(x, list) else list(x) for x in (a, b))  # slices of one type compare
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def reusable(kept: Sequence[int], prompt: Sequence[int]) -> int:
    """Prompt positions whose cache entries a row that kept `kept` (module docstring) holds for `prompt`: the target's
    entry at p is right for a shared prefix of m tokens when p < m, the drafter's pairs the target's hidden state at
    p with the token at p + 1, so both are right below m - 1; and the prompt's last token is always computed (its
    logits choose the first token). 0 when nothing is shared."""
    if not kept or not prompt or kept[0] != prompt[0]:
        return 0
    return max(0, min(common_prefix(kept, prompt) - 1, len(prompt) - 1))
