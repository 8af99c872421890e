"""EngineWorker: one thread owns the `Engine` and runs its continuous-batching loop for the HTTP server.

Contract:
- The engine is touched only by the worker's thread (it is not thread-safe): `submit` and `Ticket.cancel` hand work
  to it through a queue. `run(keep_running)` runs the loop in the calling thread until `stop()` or until
  `keep_running()` turns false (`eaglespec serve`: the main thread, which loaded the model, with the HTTP server in
  another thread); `start()` runs it in a thread of its own (tests). The loop belongs on the thread that loaded the
  model: on the CPU, PyTorch's OpenMP pool is per thread, and a second thread's parallel regions ran SmolLM2 at
  17-20 tok/s against 29-33 on the loading thread (2-core machine, 2026-12-04). Before the loop the worker
  reserves the engine's caches, `rows` x `max_len` positions, so that no request ever grows them (which would wait
  for an idle engine and drop captured CUDA graphs).
- `submit(prompt, params, chat, max_tokens, stream, images)` -> `Ticket`, from any thread. The prompt is text
  (chat template applied when `chat`), chat messages, or token ids; `images` go to a multimodal target.
  `max_tokens` None: the room left in a row's cache after the prompt; a prompt or `max_tokens` that does not fit
  is refused with one sentence. Each ticket receives, in order, from the worker's thread: ("accepted",
  prompt_tokens) or ("error", message, status); with `echo`, ("prompt", its text, its tokens' logprob entries:
  `Engine.score`, empty unless asked for; `max_tokens` 0 then ends the request: scoring only); then ("delta", text,
  logprob entries) as text is committed (stop
  strings are never shown in part: `Request.take_delta`; the entries, `TokenLogprob`s of the tokens committed since
  the last delta, are empty unless the request asked for them, and a delta may carry entries without text; with
  `stream` False one delta at the end, the text decoded once: per-step detokenizing costs host time a busy GPU engine
  has not got); then ("done", finish_reason, completion_tokens, its `SpecStats` or None, its cached prompt tokens:
  `Request.reused`, its output token ids). A streamed answer's deltas go out at its first tokens, then every
  `stream_interval` tokens (default 1: each step's). A ticket's `events` is an `asyncio.Queue` of the event loop
  that called `submit` (filled with `call_soon_threadsafe`), or, called outside an event loop, a `queue.Queue`.
- `Ticket.cancel()` (the client went away) aborts the request (`Engine.abort`): its row frees at its next step.
- Between steps the worker admits everything submitted; with nothing to run it blocks on the queue (no spinning).
- `metrics` (server/metrics.py) counts requests, tokens, latencies and acceptance for `GET /metrics`; with
  `log_interval` > 0 the loop prints their rates to stderr that often (while anything happens).
- A failure inside a step is a bug: every live ticket gets ("error", message, 500), the worker stops, `alive` turns
  false and later submissions are refused with status 503.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..engine.engine import Engine, Prompt
from ..engine.request import Request
from ..errors import ConfigError, EaglespecError, RequestError
from ..sampling_params import SamplingParams
from .metrics import ServerMetrics


@dataclass
class Ticket:
    prompt: Prompt
    params: SamplingParams
    chat: bool
    max_tokens: int | None
    stream: bool  # deltas as the text grows; False: the text in one delta at the end (no per-step detokenizing)
    images: list | None  # a multimodal target's images, in prompt order
    events: Any  # asyncio.Queue or queue.Queue
    loop: asyncio.AbstractEventLoop | None
    worker: "EngineWorker"
    request: Request | None = None
    cancelled: bool = False
    sent: int = 0  # output tokens whose text has gone out (EngineWorker.stream_interval)
    arrival: float = field(default_factory=time.perf_counter)  # submitted (ServerMetrics' latencies count from here)
    first_token_at: float | None = None
    echo: bool = False  # the prompt comes back first (a "prompt" event), scored when log-probabilities are asked
    tools: list | None = None  # OpenAI's tool definitions, for the chat template
    grammar: Any = None  # the structured output's grammar, compiled by the HTTP side (Engine.compile_grammar)
    prompt_ids: list[int] | None = None  # the prompt's tokens, set before ("accepted", ...) goes out

    def put(self, event: tuple) -> None:
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self.events.put_nowait, event)
            except RuntimeError:  # the event loop has closed: nobody listens any more
                pass
        else:
            self.events.put_nowait(event)

    def cancel(self) -> None:
        self.cancelled = True
        self.worker._inbox.put(("cancel", self))


class EngineWorker:
    def __init__(self, engine: Engine, rows: int, max_len: int, stream_interval: int = 1,
                 log_interval: float = 0.0) -> None:
        self.check_options(stream_interval, log_interval)
        self.engine = engine
        # read by the HTTP thread to name the tokens of log-probabilities (decoding only: no engine state)
        self.tokenizer = engine.tokenizer
        self.rows = rows
        self.stream_interval = stream_interval
        self.log_interval = log_interval  # seconds between the stats lines on stderr (0: none)
        self._last_log = time.monotonic()
        # read by /metrics from the HTTP thread: len() of the scheduler's lists is atomic under the GIL
        self.metrics = ServerMetrics(running=self._running, waiting=self._waiting)
        self.max_len = min(max_len, engine.context_len)
        self._inbox: queue.Queue = queue.Queue()
        self._live: list[Ticket] = []
        self._thread: threading.Thread | None = None
        self._stop = False
        self.alive = False
        self.failure: str | None = None

    @staticmethod
    def check_options(stream_interval: int, log_interval: float) -> None:
        """A ConfigError for an option out of range (`eaglespec serve` asks before it loads the model)."""
        if stream_interval < 1:
            raise ConfigError(f"--stream-interval must be >= 1 (got {stream_interval})")
        if log_interval < 0:
            raise ConfigError(f"--log-stats-interval must be >= 0 (got {log_interval})")

    # --- any thread --------------------------------------------------------------------------------------------------
    def ready(self) -> "EngineWorker":
        """Reserve the engine's caches, prepare its structured outputs' tokenizer (~0.2 s, which the first
        structured request would otherwise wait for), and accept submissions (they queue until the loop runs);
        idempotent."""
        if not self.alive and self.failure is None:
            self.engine.reserve(self.rows, self.max_len)
            self.engine.prepare_grammars()
            self.alive = True
        return self

    def start(self) -> "EngineWorker":
        """Run the loop in a thread of its own."""
        self.ready()
        self._thread = threading.Thread(target=self._loop, name="eaglespec-engine", daemon=True)
        self._thread.start()
        return self

    def run(self, keep_running: Callable[[], bool] = lambda: True) -> None:
        """Run the loop in this thread until `stop()` or until `keep_running()` (asked about twice a second while
        idle, and between steps) is false."""
        self.ready()
        self._loop(keep_running)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._inbox.put(("stop", None))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def close(self) -> None:
        """Once the loop has ended, or never ran (`eaglespec serve` on its way out): refuse later submissions (503)
        and drop the engine, so that its weights and caches are freed even while the app lives on (FastAPI keeps an
        app's endpoint functions in module-level caches, and through their closures this worker)."""
        self.alive = False
        self.engine = None  # type: ignore[assignment]

    def submit(self, prompt: Prompt, params: SamplingParams, chat: bool = True, max_tokens: int | None = None,
               stream: bool = True, images: list | None = None, echo: bool = False,
               tools: list | None = None, grammar: Any = None) -> Ticket:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            events: Any = asyncio.Queue()
        except RuntimeError:
            loop, events = None, queue.Queue()
        ticket = Ticket(prompt, params, chat, max_tokens, stream, images or None, events, loop, self, echo=echo,
                        tools=tools or None, grammar=grammar)
        if not self.alive:
            ticket.put(("error", f"the engine has stopped: {self.failure or 'shut down'}", 503))
            return ticket
        self._inbox.put(("submit", ticket))
        return ticket

    # --- the worker's thread ------------------------------------------------------------------------------------
    def _loop(self, keep_running: Callable[[], bool] = lambda: True) -> None:
        try:
            if self.engine.device.type == "cuda":  # a new thread's current device is cuda:0, whatever --device says
                torch.cuda.set_device(self.engine.device)
            while not self._stop and keep_running():
                self._drain(block=not self.engine.has_work())
                if self._stop:
                    break
                if self.engine.has_work():
                    self.engine.step()
                    self._publish()
                self._log_stats()
        except Exception as e:  # a bug: say so to everyone waiting, keep the traceback in the server's log
            traceback.print_exc()
            self.failure = f"{type(e).__name__}: {e}"
            self.alive = False  # before anyone hears of it: /health answers 503 from the first 500 on
            for t in self._live:
                t.put(("error", f"internal error in the engine: {self.failure}", 500))
            self._live.clear()
        finally:
            self.alive = False
            while True:  # submissions that raced the stop
                try:
                    kind, t = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if kind == "submit":
                    t.put(("error", f"the engine has stopped: {self.failure or 'shut down'}", 503))

    def _drain(self, block: bool) -> None:
        while True:
            try:
                kind, t = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if kind == "submit":
                self._admit(t)
            elif kind == "cancel" and t.request is not None:
                self.engine.abort(t.request)
            elif kind == "stop":
                return

    def _admit(self, t: Ticket) -> None:
        if t.cancelled:
            return
        eng = self.engine
        try:
            ids, mm = eng.prepare(t.prompt, t.chat, t.images, t.tools)  # image placeholders expanded: counted too
            if not ids:
                raise RequestError("the prompt is empty")
            if t.echo:  # the prompt's text, and with logprobs its tokens' entries: one forward, before it queues
                k = t.params.logprobs
                echoed = ("prompt", t.prompt if isinstance(t.prompt, str) else eng.tokenizer.decode(ids)
                          if eng.tokenizer is not None else "", eng.score(ids, k) if k is not None else [])
                if t.max_tokens == 0:  # scoring only (an evaluation harness's log-likelihood); counted before the
                    # client hears of it, as every answer is (`_publish`)
                    self.metrics.accepted(len(ids))
                    self.metrics.finished("length", 0, time.perf_counter() - t.arrival, None)
                    for event in (("accepted", len(ids)), echoed, ("done", "length", 0, None, 0, [])):
                        t.put(event)
                    return
            # a sequence's positions: the reserved cache, and the model's context less the drafts' headroom
            limit = min(self.max_len, eng.context_len - eng.runner.headroom())
            room = limit - len(ids)
            if room < 1:
                raise RequestError(f"the prompt has {len(ids)} tokens, but this server's sequences hold {limit} "
                                   "tokens (--max-seq-len, the model's context)")
            if t.max_tokens is None:
                params = replace(t.params, max_new_tokens=room)
            elif t.max_tokens > room:
                raise RequestError(f"the prompt ({len(ids)} tokens) plus max_tokens ({t.max_tokens}) exceed this "
                                   f"server's {limit} tokens per sequence (--max-seq-len, the model's context)")
            else:
                params = replace(t.params, max_new_tokens=t.max_tokens)
            t.request = eng.add_prepared(ids, mm, params, stream=t.stream, grammar=t.grammar)
        except EaglespecError as e:
            t.put(("error", str(e), 400))
            return
        self.metrics.accepted(len(ids))
        t.prompt_ids = ids  # (a thinking model's reader looks for an open <think>: server/reasoning.py)
        t.put(("accepted", len(ids)))
        if t.echo:
            t.put(echoed)
        self._live.append(t)

    def _running(self) -> int:
        sched = self.engine.scheduler if self.engine is not None else None
        return len(sched.running) if sched is not None else 0

    def _waiting(self) -> int:
        """Requests submitted and not yet in a row: in the worker's inbox (where a cancellation in flight counts
        too), queued, or prefilled ahead."""
        sched = self.engine.scheduler if self.engine is not None else None
        queued = len(sched.waiting) + len(sched.parked) if sched is not None else 0
        return queued + self._inbox.qsize()

    def _log_stats(self) -> None:
        if not self.log_interval or time.monotonic() - self._last_log < self.log_interval:
            return
        self._last_log = time.monotonic()
        line = self.metrics.summary()
        if line is not None:
            print(f"[eaglespec] {line}", file=sys.stderr, flush=True)

    def _publish(self) -> None:
        still = []
        for t in self._live:
            req = t.request
            assert req is not None
            n = len(req.output_ids)
            if t.first_token_at is None and n:
                t.first_token_at = time.perf_counter()
                self.metrics.first_token(t.first_token_at - t.arrival)
            # a streamed answer's text goes out at its first tokens, then every stream_interval tokens (and at the
            # end): each delta costs the HTTP thread a chunk, under the GIL the engine's loop needs too; an unstreamed
            # one has no text before its end (Request: decoded once)
            if req.finished or (t.stream and (t.sent == 0 or n - t.sent >= self.stream_interval)):
                delta, entries = req.take_delta(), req.take_logprobs()
                if delta or entries:
                    t.put(("delta", delta, entries))
                    t.sent = n
            if req.finished:
                spec = req.stats if req.stats.verify_steps else None
                # counted before the client hears of it: a scrape right after the answer sees it
                self.metrics.finished(req.finish_reason or "length", n, time.perf_counter() - t.arrival, spec,
                                      req.reused)
                t.put(("done", req.finish_reason, len(req.output_ids), spec, req.reused, list(req.output_ids)))
            else:
                still.append(t)
        self._live = still
