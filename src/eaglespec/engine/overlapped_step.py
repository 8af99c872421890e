"""The overlapped step of `Engine` (engine.py), and the row moves it relies on, in a file of their own: a mixin of the
engine's methods, over its scheduler and runner (the engine module's docstring gives the whole loop).

- `_launch_running(ahead)`: launch the next step of every running row without reading it (`ModelRunner.launch`);
- `_step_overlapped()`: launch the next step, then read the pending one (not launched when waiting requests may be
  admitted, when rows are to be compacted, when a row could outgrow its cache, or while a structured-output request
  runs: its masks come from the host);
- `_join_parked()`: requests prefilled ahead take freed rows (enqueued copies, no prefill);
- `_compaction()` / `_compact_rows()`: a draining batch's requests move into the lowest free rows, so that its steps
  replay the smallest graph bucket that holds them.
`constrained(reqs)`: whether a request among them has a structured output (its steps are not overlapped).
"""

from __future__ import annotations

from typing import Sequence

from .request import Request
from .row_sampling import StepExtras


class OverlappedStep:
    def _join_parked(self) -> list[int]:
        """Requests prefilled ahead take the free rows (`Scheduler.join`, `ModelRunner.move_row`): enqueued copies,
        no prefill and no synchronisation. Returns the rows taken."""
        assert self.scheduler is not None
        joined = []
        for q, src in self.scheduler.join():
            self.runner.move_row(src, q.slot)
            joined.append(q.slot)
            self.step_counts["join"] += 1
        return joined

    def _compaction(self) -> list[tuple[int, int]]:
        """The row moves that would let the running requests' steps replay a smaller graph (`Scheduler.compaction`,
        by the graphs' batch buckets): none unless `EngineConfig.compact_rows` is on and the graph path runs."""
        graphs = self.runner.graphs
        if not self.config.compact_rows or graphs is None or self.scheduler is None:
            return []
        return self.scheduler.compaction(graphs.batch_bucket)

    def _compact_rows(self) -> None:
        """Apply `_compaction` (no step may be in flight: the host lengths are exact): each request's cache entries and
        row state move to its new row (`ModelRunner.move_row`), enqueued, no synchronisation."""
        moves = dict(self._compaction())
        for q in self.scheduler.running if moves else ():
            dst = moves.get(q.slot)  # type: ignore[arg-type]
            if dst is not None:
                self.runner.move_row(q.slot, dst)  # type: ignore[arg-type]
                self.scheduler.move(q, dst)  # frees the old row; the running list is unchanged
                self.step_counts["compact"] += 1

    def _launch_running(self, ahead: int = 0) -> None:
        """Overlap: launch the next step of every running row (read by the next `step()`); `ahead`: positions a still
        unread step may have added to any row (`ModelRunner.launch`), 0 when nothing is unread. Rows whose request
        finishes on tokens not yet read compute one step for nothing, which the read drops (`_step_overlapped`)."""
        assert self.scheduler is not None and self._pending is None
        running = sorted(self.scheduler.running, key=lambda q: q.slot)
        rows = [q.slot for q in running]
        greedy = all(q.params.greedy for q in running)
        kind = self._step_kind(rows, greedy, any(q.params.penalized for q in running))
        self._count_step(kind)
        self.runner.step_extras = StepExtras.of(q.params for q in running)
        self.runner.constraint = None  # launched steps hold no structured output (`step`, `_step_overlapped`)
        self._pending = (running, self.runner.launch(kind, rows, greedy, ahead, self._step_logprobs(running)))

    def _step_overlapped(self) -> list[Request]:
        """Launch the next step of the running rows, then read the launched one's results. Not launched (the
        pending step is only read) when waiting requests may be admitted (the next step is their prefill), when
        rows are to be compacted (`_compaction`: the next `step()` moves them), or, speculating, when a row could
        outgrow its cache: the unread step may have added up to `max_accept`
        positions, and the next one writes `headroom` past those. A request that finishes on the results read had
        a token (or tokens) computed by the step just launched: dropped when that step is read; its row is released
        after that launch, in stream order, so the step cannot write into a row that a new request took."""
        assert self.scheduler is not None and self._pending is not None
        reqs, pending = self._pending
        self._pending = None
        sched, run = self.scheduler, self.runner
        # rows freed at the last read go to requests prefilled ahead at once: the next step takes them in; the
        # copies are enqueued after the pending step, which still computed those rows for their finished requests
        joined = self._join_parked()
        running = sched.running
        ahead = run.spec.max_accept if run.speculative else 0  # the largest shape's
        fits = all(run.host_len[q.slot] + ahead <= run.max_len for q in running)
        # not launched when waiting requests may be admitted or rows could be compacted: both need the read first
        if running and fits and not sched.may_admit() and not self._compaction() and not constrained(running):
            self._launch_running(ahead)
        # a joined row's host length is its new request's (a decode step launched above already counted its token);
        # the read below advances it for the finished request the pending step computed there: undone
        held = {s: run.host_len[s] for s in joined}
        m_host, tok_host = run.collect(pending)
        live = [i for i, q in enumerate(reqs) if not q.finished]
        for q in reqs:
            if q.finished:  # released before this step was read; the read advanced its host length
                if q.slot in held:  # a request prefilled ahead runs there now
                    run.host_len[q.slot] = held[q.slot]
                else:  # still free (admissions wait for the read): inert again
                    run.release(q.slot)
        got = [reqs[i] for i in live]
        # the step's log-probability rows are indexed by row: request i ran in row pending.rows[i]
        lp_all = pending.logprobs.tolist() if pending.logprobs is not None else None
        lp_rows = [lp_all[pending.rows[i]] for i in live] if lp_all is not None else None
        if m_host is None:
            for j, i in enumerate(live):
                reqs[i].append([tok_host[i]], lp_rows[j] if lp_rows is not None else None)
        else:
            self._append_spec(got, [m_host[i] for i in live], [tok_host[i] for i in live], pending.steps, lp_rows)
        self._release_finished()
        return got


def constrained(reqs: Sequence[Request]) -> bool:
    """Whether a request among these has a structured output (its steps are not overlapped)."""
    return any(q.grammar is not None for q in reqs)
