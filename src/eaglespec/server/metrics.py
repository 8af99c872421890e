"""ServerMetrics: what `eaglespec serve` has done, for `GET /metrics` (Prometheus' text format) and a periodic log line.

Contract:
- The worker's thread reports each request's life: `accepted(prompt_tokens)` (admitted to the engine),
  `first_token(seconds)` (since its submission to the worker), `finished(reason, completion_tokens, seconds, stats)`
  (`stats`: its speculative statistics, or None); the app's error handlers report `rejected(status)` (refused before
  it ran: a user mistake, an unknown model, a stopped engine). The engine's queue is read when scraped: `running`
  and `waiting` are callables.
- `render()` -> (body, content type) for `/metrics`, from any thread (prometheus_client's collectors are thread-safe).
  Each server has its own registry, so several apps in one process (tests) do not share counters.
- `summary(now)` -> one line of rates since the last summary (requests and tokens per second, running / waiting, the
  acceptance length of the speculative steps in that span, and the garbage collector's pauses in it, when any took
  a millisecond or more), or None when nothing happened; `eaglespec serve` logs it every `--log-stats-interval`
  seconds.
- Python's garbage collections are timed from a `gc.callbacks` hook (any thread's: the engine's loop stalls for
  them whichever thread collects; a full one of an unfrozen heap took 65-140 ms on the H200's host, engine/gc_heap.py)
  into `gc_pause_seconds{generation}`. The hook holds the metrics weakly; a later ServerMetrics drops the hooks of
  metrics since gone.

Each of a request's `n` choices runs, and counts here, as a request of its own (`requests_total`, the tokens, the
latencies); a refusal counts once. Metric names (prefix `eaglespec_`): `requests_total{finish_reason}`,
`requests_rejected_total{status}`, `prompt_tokens_total`, `prompt_tokens_cached_total` (prompt tokens whose cache
entries a row already held: engine/scheduler.py's prefix reuse), `generation_tokens_total`, `requests_running`,
`requests_waiting`, `time_to_first_token_seconds` and `request_seconds` (histograms), `spec_verify_steps_total` and
`spec_accepted_tokens_total` (draft tokens accepted; the mean acceptance length is 1 + accepted / steps, as
`accept_length_mean` counts the bonus token), `gc_pause_seconds{generation}` (a histogram).
"""

from __future__ import annotations

import gc
import time
import weakref
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..spec.stats import SpecStats

# seconds: a first token within milliseconds on a GPU, a long answer within minutes
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# seconds: young collections take microseconds, a full one of an unfrozen heap tens to hundreds of milliseconds
_GC_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ServerMetrics:
    def __init__(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("eaglespec_requests", "Requests finished, by finish reason", ["finish_reason"],
                                registry=r)
        self.rejected_requests = Counter("eaglespec_requests_rejected", "Requests refused before they ran, by HTTP "
                                         "status", ["status"], registry=r)
        self.prompt_tokens = Counter("eaglespec_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.cached_tokens = Counter("eaglespec_prompt_tokens_cached", "Prompt tokens not prefilled: their cache "
                                     "entries were reused", registry=r)
        self.generation_tokens = Counter("eaglespec_generation_tokens", "Tokens generated", registry=r)
        Gauge("eaglespec_requests_running", "Requests in the engine's rows", registry=r).set_function(running)
        Gauge("eaglespec_requests_waiting", "Requests queued for a row", registry=r).set_function(waiting)
        self.ttft = Histogram("eaglespec_time_to_first_token_seconds", "From a request's arrival at the engine to "
                              "its first token", buckets=_TTFT_BUCKETS, registry=r)
        self.latency = Histogram("eaglespec_request_seconds", "From a request's arrival at the engine to its last "
                                 "token", buckets=_REQUEST_BUCKETS, registry=r)
        self.verify_steps = Counter("eaglespec_spec_verify_steps", "Speculative verification steps", registry=r)
        self.accepted_tokens = Counter("eaglespec_spec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.gc_pause = Histogram("eaglespec_gc_pause_seconds", "Python garbage collections, by generation (2: full)",
                                  ["generation"], buckets=_GC_BUCKETS, registry=r)
        self._running, self._waiting = running, waiting
        # the span the next summary covers: [_since, now), its counts
        self._since = time.monotonic()
        self._span = {"requests": 0, "prompt": 0, "generated": 0, "steps": 0, "accepted": 0, "gc": 0.0}
        # hooks of metrics since gone are dropped here (not from inside a collection, whose callback list it is)
        gc.callbacks[:] = [cb for cb in gc.callbacks if getattr(cb, "metrics", _alive)() is not None]
        gc.callbacks.append(_gc_timer(weakref.ref(self)))

    def collected(self, generation: int, seconds: float) -> None:
        """One garbage collection took `seconds` (the gc hook's report, from whichever thread collected)."""
        self.gc_pause.labels(generation=str(generation)).observe(seconds)
        self._span["gc"] += seconds

    # --- the worker's thread (rejected: the event loop's) ----------------------------------------------------------
    def accepted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self._span["prompt"] += prompt_tokens

    def rejected(self, status: int) -> None:
        self.rejected_requests.labels(status=str(status)).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def finished(self, reason: str, completion_tokens: int, seconds: float, stats: SpecStats | None,
                 cached_tokens: int = 0) -> None:
        self.requests.labels(finish_reason=reason).inc()
        self.cached_tokens.inc(cached_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.latency.observe(seconds)
        self._span["requests"] += 1
        self._span["generated"] += completion_tokens
        if stats is not None and stats.verify_steps:
            accepted = sum((t - 1) * n for t, n in enumerate(stats.hist) if t >= 1)
            self.verify_steps.inc(stats.verify_steps)
            self.accepted_tokens.inc(accepted)
            self._span["steps"] += stats.verify_steps
            self._span["accepted"] += accepted

    def summary(self, now: float | None = None) -> str | None:
        """Rates over the span since the last call (None, and the span kept open, when nothing finished or was
        admitted in it)."""
        now = time.monotonic() if now is None else now
        span, seconds = self._span, max(now - self._since, 1e-9)
        if not (span["requests"] or span["prompt"]):
            return None
        line = (f"{span['requests'] / seconds:.1f} req/s, {span['generated'] / seconds:,.0f} generated tok/s, "
                f"{span['prompt'] / seconds:,.0f} prompt tok/s; running {self._running()}, waiting {self._waiting()}")
        if span["steps"]:
            line += f"; accept length {1 + span['accepted'] / span['steps']:.2f}"
        if span["gc"] >= 1e-3:
            line += f"; garbage collection {span['gc'] * 1e3:.0f} ms"
        self._since = now
        self._span = dict.fromkeys(span, 0)
        return line

    # --- any thread --------------------------------------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _alive() -> bool:
    return True


def _gc_timer(metrics: "weakref.ref[ServerMetrics]") -> Callable[[str, dict], None]:
    """A `gc.callbacks` hook timing each collection into `metrics` (a no-op once they are gone; the next
    ServerMetrics drops it)."""
    started = [0.0]

    def hook(phase: str, info: dict) -> None:
        m = metrics()
        if m is None:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            m.collected(info["generation"], time.perf_counter() - started[0])

    hook.metrics = metrics  # type: ignore[attr-defined]
    return hook
