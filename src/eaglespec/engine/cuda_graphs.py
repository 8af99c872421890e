"""CUDA graphs for the decode and speculative steps (the GPU fast path).

`GraphCache.run(kind, n_rows, longest, greedy, lp)` replays the graph of step `kind` ("decode", or "spec", "spec1", ...
for the runner's speculation shapes) for the batch
bucket covering rows 0..n_rows-1 and the key-length bucket covering `longest + headroom`, capturing it on first use;
`lp` (the alternatives per committed token whose log-probabilities the step computes, None: none; runner.py) is part
of every key, so steps without it run graphs that compute none; so are the runner's `step_extras` (a row of the step
samples with its own seed: layers/row_draws.py; a row adjusts its logits: engine/row_adjust.py), so steps without
them run as before.
A speculative step is three graphs (draft, verify, commit) replayed back to back, so the phase timer can tell their
times apart; the verify graph reads the draft graph's static outputs, the commit graph the verify graph's.
A step holding structured outputs (`StepExtras.constrained`) splits off the choice from each target forward: decode
is "decode" (the forward) then "sample", a speculative step "draft", "verify" (the forward), "accept", "commit";
`run(..., after={phase: fn})` calls fn(that phase's output) once the phase is replayed (enqueued), so that the host
computes and loads the rows' masks (runner.py, engine/grammar_rows.py) while the GPU runs the forward that does not
read them: the current masks during a decode's forward, the tree's (copied to the host behind the draft) during the
verify's forward.
`GraphCache.prefill(rows, prompts, greedy)` prefills B prompts through the graph of (B, their power-of-two length
bucket) (64..2048; B <= PREFILL_GRAPH_ROWS and B x bucket <= PREFILL_GRAPH_TOKENS): the prompts, their lengths and
cache rows are copied into static buffers, the rest of the bucket is padding whose KV entries lie past each row's
length (never read before being overwritten). `prefill_plan(lens)` splits a prefill of up to PREFILL_SPLIT_ROWS
rows that no single graph takes into groups of <= PREFILL_GRAPH_ROWS rows of similar length that each fit one (or
None: eager), and `prefill_groups` runs them, each group's tokens copied out before the next replay.
`precapture_prefill` captures them up front (`Engine.warmup`: up to PREFILL_GRAPH_ROWS prompts, or its largest
batch size; `generate`: the one-prompt graph of its prompt's bucket), any other on first use. Graphs, not eager
prefills: an eager multi-row prefill cost 21-52 ms per batch of 8 MT-bench prompts on the H200 (launch-bound, and
with cuDNN's SDPA a ~0.2 s plan per new shape), 10-23% of a speculative batch-8 run (session 8).

Capture protocol: the small row state (lengths, last tokens, drafter state) and the RNG state are snapshotted, the
step runs twice eagerly on a side stream (warm-up: allocator, cuBLAS handles, lazy init), each round from the
snapshot (restored after it), then each phase is captured into a shared memory pool. A warm-up round thus writes
exactly the KV entries the step itself writes next: past the committed lengths (no later step reads them before
overwriting, so the caches need no snapshot) and inside the cache. The static path without graphs
(`capture=False`, the CPU tests) runs the same warm-up on a key's first use.

Python's cyclic garbage collector is held off during a capture (`no_gc`): an earlier engine left in a reference cycle
owns CUDA graphs, and a collection that frees one mid-capture destroys a graph while the stream is capturing, which
invalidates the capture (seen on the H200 when a benchmark built engines one after another; PyTorch's own
`torch.cuda.graph` no longer collects before capturing). A new cache collects once instead, before its first capture.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping

import torch

from ..layers.attention import graph_build
from .host_upload import upload
from .row_sampling import StepExtras
from .step_kinds import shape_index

BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
MIN_LEN_BUCKET = 256
PREFILL_MIN_BUCKET = 64  # prompt-length buckets of the prefill graphs: 64, 128, ..., PREFILL_GRAPH_MAX
PREFILL_GRAPH_MAX = 2048  # longer prompts are compute-bound: eager prefill loses little to launch overhead
PREFILL_GRAPH_TOKENS = 8192  # rows x bucket of a multi-row prefill graph (bounds the graph pool's activations)
PREFILL_GRAPH_ROWS = 8  # rows are exact (not bucketed): at most 8 x 6 graphs per engine, captured on first use
PREFILL_SPLIT_ROWS = 32  # up to this many rows a prefill too large for one graph runs as graphs of <= 8 rows each
# (a 32-row eager prefill of MT-bench prompts took ~50 ms on the H200, an 8-row graph ~3 ms); larger prefills
# (regeneration admits hundreds of rows at once) are compute-bound and stay eager


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Automatic garbage collection off inside the block (restored to what it was, also on an exception)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def capturable(*models: torch.nn.Module) -> bool:
    """False when a layer has data-dependent shapes (it says `supports_cuda_graphs = False`, e.g. MoE dispatch)."""
    return all(getattr(mod, "supports_cuda_graphs", True) for m in models for mod in m.modules())


class GraphCache:
    """`capture=False` runs the same static, bucketed all-rows steps eagerly (no CUDA needed): the tests use it to
    check the bookkeeping of the fast path (buckets, padding rows, inert rows) on the CPU."""

    def __init__(self, runner, capture: bool = True, prefill_graphs: bool = True) -> None:
        self.runner = runner
        self.capture = capture
        if capture:  # free dead engines' graphs now, not in the middle of one of our captures (module docstring)
            gc.collect()
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: dict[tuple, list[tuple[str, torch.cuda.CUDAGraph]]] = {}
        self.outputs: dict[tuple, object] = {}
        self.phase_out: dict[tuple, dict[str, object]] = {}  # each phase's output (static tensors), for `run(after=)`
        self._keep: dict[tuple, object] = {}
        self._prefill_in: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.prefill_graphs = prefill_graphs  # EngineConfig.prefill_graphs

    def reset(self) -> None:
        """Forget every graph (the caches they point at were reallocated), and take a fresh memory pool: once the
        last graph of a pool is freed, capturing into that pool again trips an internal assert of PyTorch's
        caching allocator (`use_count > 0`, seen on the H200 when a second `generate` grew the caches)."""
        self.graphs.clear()
        self.outputs.clear()
        self.phase_out.clear()
        self._keep.clear()
        self._prefill_in.clear()
        if self.capture:
            self.pool = torch.cuda.graph_pool_handle()

    # --- buckets ------------------------------------------------------------------------------------------------
    def batch_bucket(self, n: int) -> int:
        """The rows 0..bucket-1 a step of rows 0..n-1 covers: never the spare rows of requests prefilled ahead."""
        rows = self.runner.step_rows
        for b in BATCH_BUCKETS:
            if b >= n:
                return min(b, rows)
        return rows

    def len_bucket(self, need: int) -> int:
        b = MIN_LEN_BUCKET
        while b < need:
            b *= 2
        return min(b, self.runner.cache_len)

    def prefill_bucket(self, n: int, rows: int = 1) -> int | None:
        """The padded length of the prefill graph for `rows` prompts of at most n tokens, or None (run it eagerly)."""
        if not self.prefill_graphs:
            return None
        b = PREFILL_MIN_BUCKET
        while b < n:
            b *= 2
        fits = b <= min(PREFILL_GRAPH_MAX, self.runner.cache_len) and (
            rows == 1 or (rows <= PREFILL_GRAPH_ROWS and rows * b <= PREFILL_GRAPH_TOKENS))
        return b if fits else None

    # --- the phases of each step --------------------------------------------------------------------------------
    def _phases(self, kind: str, B: int, kv_len: int, greedy: bool, lp: int | None, extras: StepExtras):
        """The step's phases as callables; each first sets the runner's `step_extras` to the key's (seeded draws,
        adjusted logits), so a capture or an eager run computes what the key names."""
        run = self.runner

        def as_keyed(fn):
            def phase():
                run.step_extras = extras
                return fn()
            return phase

        if kind == "prefill":  # kv_len is the padded prompt length; inputs live in static buffers (prefill())
            ids, lens, row = self._prefill_in[(kind, B, kv_len, greedy, lp, extras)]
            return [("prefill", as_keyed(lambda: run._prefill_core(row, ids, lens, greedy, lp)))]
        r = slice(0, B)  # rows 0..B-1: the per-row state is read through views (an index tensor would gather)
        box: dict[str, object] = {}
        if kind == "decode":
            if not extras.constrained:
                return [("decode", as_keyed(lambda: run._decode_core(r, None, kv_len, greedy, lp)))]

            def forward():
                box["out"] = run._decode_forward(r, None, kv_len)

            return [("decode", as_keyed(forward)),
                    ("sample", as_keyed(lambda: run._decode_choose(r, None, kv_len, greedy, lp, *box["out"])))]
        shape = run.shapes[shape_index(kind)]  # "spec", "spec1", ...: the runner's speculation shapes

        def draft():
            box["tree"] = run._spec_draft(r, None, kv_len, greedy, shape)
            return box["tree"]

        def verify():
            box["res"], box["aux"] = run._spec_verify(r, None, kv_len, box["tree"], greedy, shape, lp)

        def verify_forward():
            box["raw"] = run._verify_forward(r, None, kv_len, box["tree"], shape)

        def accept():
            box["res"], box["aux"] = run._verify_accept(r, box["tree"], greedy, shape, lp, *box["raw"])

        def commit():
            box["out"] = run._spec_commit(r, None, kv_len, box["res"], box["aux"], shape)
            return box["out"]

        if extras.constrained:
            return [("draft", as_keyed(draft)), ("verify", as_keyed(verify_forward)), ("accept", as_keyed(accept)),
                    ("commit", as_keyed(commit))]
        return [("draft", as_keyed(draft)), ("verify", as_keyed(verify)), ("commit", as_keyed(commit))]

    def _capture(self, key: tuple) -> None:
        run = self.runner
        phases = self._phases(*key)
        side = torch.cuda.Stream(run.device)
        side.wait_stream(torch.cuda.current_stream(run.device))
        # the warm-up and the capture choose the same SDPA backends (layers/attention.py, graph_build)
        with torch.cuda.stream(side), graph_build():
            self._warm_up(phases)
        torch.cuda.current_stream(run.device).wait_stream(side)
        graphs = []
        out = None
        with torch.inference_mode(), no_gc(), graph_build():
            for name, fn in phases:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    out = fn()
                graphs.append((name, g))
                self.phase_out.setdefault(key, {})[name] = out
        self.graphs[key] = graphs
        # the closures own tensors the graphs read by address (the phases' outputs, the prefill inputs): keep them alive
        self._keep[key] = phases
        self.outputs[key] = out if isinstance(out, tuple) else (out,)

    def _warm_up(self, phases, rounds: int = 2) -> None:
        """Run the step `rounds` times, each from the current row state and RNG state, which are restored after each
        round: a round then writes exactly the KV entries the step itself writes next (past the committed lengths,
        inside the cache, as the engine sized it). Rounds chained on the advanced state wrote up to 2 x D past the
        lengths: past the end of a cache sized to its requests once a drafter accepted everything (the oracle
        drafter; on CUDA a device-side index assert in the KV write, session 22)."""
        run = self.runner
        saved = [t.clone() for t in run.state_tensors()]
        cuda = run.device.type == "cuda"
        rng = torch.cuda.get_rng_state(run.device) if cuda else run.generator.get_state()
        with torch.inference_mode():
            for _ in range(rounds):
                for _, fn in phases:
                    fn()
                for t, s in zip(run.state_tensors(), saved):
                    t.copy_(s)
                if cuda:
                    torch.cuda.set_rng_state(rng, run.device)
                else:
                    run.generator.set_state(rng)

    def precapture(self, kind: str, n_rows: int, greedy: bool, lp: int | None = None,
                   extras: StepExtras = StepExtras()) -> int:
        """Capture every length bucket of one batch bucket now (so that timed runs never capture); returns count.
        (`extras` constrained: the runner's grammar buffers exist first, `ModelRunner.grammar_buffers`.)"""
        n, length = 0, MIN_LEN_BUCKET
        B = self.batch_bucket(n_rows)
        while True:
            Lb = min(length, self.runner.cache_len)
            key = (kind, B, Lb, greedy, lp, extras)
            if key not in self.graphs:
                self._capture(key)
                n += 1
            if Lb >= self.runner.cache_len:
                return n
            length *= 2

    def precapture_prefill(self, greedy: bool, only: int | None = None, lp: int | None = None,
                           extras: StepExtras = StepExtras(), rows: int = 1) -> int:
        """Capture the prefill graphs of 1..`rows` prompts (at most PREFILL_GRAPH_ROWS) for every length bucket that
        fits them now (`only`: just the one-prompt graph of a prompt of that many tokens, if it has one); returns the
        count. Only while no row holds a request: the captures' warm-up runs write rows 0..B-1's caches. Multi-row
        graphs not captured here are captured on first use: ~60 ms each inside whatever request admits that many
        prompts of that length first (an H100, session 53: 1-4 such captures per 80-prompt sampled run)."""
        n = 0
        most = 1 if only is not None else min(rows, PREFILL_GRAPH_ROWS, self.runner.step_rows)
        for B in range(1, most + 1):
            buckets, Tb = [], PREFILL_MIN_BUCKET
            while self.prefill_bucket(Tb, B) == Tb:
                buckets.append(Tb)
                Tb *= 2
            if only is not None:
                buckets = [b for b in buckets if b == self.prefill_bucket(only)]
            for Tb in buckets:
                key = ("prefill", B, Tb, greedy, lp, extras)
                if key not in self.graphs:
                    self._prefill_inputs(key, [[0]] * B, range(B))
                    self._capture(key)
                    n += 1
        return n

    def _prefill_inputs(self, key: tuple, prompts, rows) -> None:
        """Write B prompts (right-padded), their lengths and rows into the static input buffers of a prefill graph."""
        B, Tb, dev = key[1], key[2], self.runner.device
        if key not in self._prefill_in:
            self._prefill_in[key] = (torch.zeros(B, Tb, dtype=torch.int64, device=dev),
                                     torch.ones(B, dtype=torch.int64, device=dev),
                                     torch.zeros(B, dtype=torch.int64, device=dev))
        ids, lens, rows_t = self._prefill_in[key]
        # staged in pinned memory (the caching host allocator keeps a block until its copy ran): truly asynchronous
        # copies; from pageable memory the driver may wait for the stream first
        pin = dev.type == "cuda"
        host = torch.zeros(B, Tb, dtype=torch.int64, pin_memory=pin)
        for b, p in enumerate(prompts):
            host[b, : len(p)] = torch.tensor(p, dtype=torch.int64)
        ids.copy_(host, non_blocking=True)
        lens.copy_(torch.tensor([len(p) for p in prompts], dtype=torch.int64, pin_memory=pin), non_blocking=True)
        rows_t.copy_(torch.tensor(list(rows), dtype=torch.int64, pin_memory=pin), non_blocking=True)

    def prefill(self, rows, prompts, greedy: bool, lp: int | None = None) -> torch.Tensor:
        """Prefill prompts into cache rows `rows` through the graph of (rows, their length bucket); returns the
        first tokens [B]."""
        Tb = self.prefill_bucket(max(len(p) for p in prompts), len(rows))
        assert Tb is not None, "prefill() called for prompts without a graph bucket"
        key = ("prefill", len(rows), Tb, greedy, lp, self.runner.step_extras)
        self._prefill_inputs(key, prompts, rows)
        if not self.capture:  # (the key noted as `run` notes it: tests read which graphs a run would take)
            self.graphs.setdefault(key, [])
            with torch.inference_mode():
                return self._phases(*key)[0][1]()
        if key not in self.graphs:
            self._capture(key)
        self.graphs[key][0][1].replay()
        return self.outputs[key][0]

    def prefill_plan(self, lens: list[int]) -> list[list[int]] | None:
        """How a prefill of prompts of these lengths runs through graphs: [all indices] when one graph takes it,
        else up to PREFILL_SPLIT_ROWS rows in groups of <= PREFILL_GRAPH_ROWS consecutive ones by length (each fitting
        a graph), else None (eager)."""
        B = len(lens)
        if self.prefill_bucket(max(lens), B):
            return [list(range(B))]
        if B > PREFILL_SPLIT_ROWS:
            return None
        order = sorted(range(B), key=lambda i: lens[i])
        groups = [order[i : i + PREFILL_GRAPH_ROWS] for i in range(0, B, PREFILL_GRAPH_ROWS)]
        if all(self.prefill_bucket(max(lens[i] for i in g), len(g)) for g in groups):
            return groups
        return None

    def prefill_groups(self, rows, prompts, greedy: bool, groups: list[list[int]],
                       lp: int | None = None) -> torch.Tensor:
        """`prefill` over each group of `prefill_plan`; returns the first tokens [B] in the order of `rows`."""
        if len(groups) == 1:
            return self.prefill(rows, prompts, greedy, lp)
        dev = self.runner.device
        out = torch.empty(len(rows), dtype=torch.int64, device=dev)
        for g in groups:  # a group's tokens live in its graph's static output: copied before that graph replays again
            index = upload(g, dev, torch.int64)
            out.index_copy_(0, index, self.prefill([rows[i] for i in g], [prompts[i] for i in g], greedy, lp))
        return out

    def key(self, kind: str, n_rows: int, longest: int, greedy: bool, lp: int | None = None) -> tuple:
        """The graph `run` takes for a step of `kind` over rows 0..n_rows-1 whose longest row holds `longest` tokens."""
        return (kind, self.batch_bucket(n_rows), self.len_bucket(longest + self.runner.headroom()), greedy, lp,
                self.runner.step_extras)

    def captured(self, kind: str, n_rows: int, longest: int, greedy: bool,
                 lp: int | None = None) -> list[tuple[str, torch.cuda.CUDAGraph]]:
        """The (phase name, graph) list `run` replays for these arguments, captured now if needed (benchmarks replay
        and profile the graphs alone)."""
        key = self.key(kind, n_rows, longest, greedy, lp)
        if key not in self.graphs:
            self._capture(key)
        return self.graphs[key]

    def run(self, kind: str, n_rows: int, longest: int, greedy: bool, lp: int | None = None,
            after: Mapping[str, Callable[[object], None]] | None = None):
        key = self.key(kind, n_rows, longest, greedy, lp)
        after = after or {}
        if not self.capture:  # the graph protocol without graphs: a warm-up on a key's first use, then the step
            if key not in self.graphs:
                self._warm_up(self._phases(*key))
                self.graphs[key] = []
            out = None
            with torch.inference_mode():
                for name, fn in self._phases(*key):
                    out = fn()
                    if name in after:
                        after[name](out)
            return out if isinstance(out, tuple) else (out,)
        if key not in self.graphs:
            self._capture(key)
        timer = self.runner.timer
        for name, g in self.graphs[key]:
            if kind == "decode":
                g.replay()
            else:  # (a constrained step's "accept" is timed as part of its verify)
                with timer.phase("verify" if name == "accept" else name):
                    g.replay()
            if name in after:
                after[name](self.phase_out[key][name])
        return self.outputs[key]
