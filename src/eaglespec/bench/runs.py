"""One benchmark run: a configuration (plain, or a drafter with S/K/D) at one batch size, over static batches or
through continuous batching.

Contract of `ConfigRun(target, tokenizer, config, batch_size, engine_config, drafter, batching)`:
- it builds one fresh `Engine` with `max_batch_size = batch_size`;
- `batching="static"`: the prompt list runs in static batches (consecutive chunks of `batch_size`), each to
  completion before the next starts; its requests take cache rows 0..B-1 in order (what an oracle's references
  index). A static batch lasts as long as its slowest row: speculating, the row that accepts least;
- `batching="continuous"`: the whole prompt list goes to the engine at once, which runs at most `batch_size`
  requests and admits a waiting one as soon as a row frees (what a server does; `batch_size` is the concurrency).
  An oracle drafter cannot follow requests across rows there (refused: `check_batching`);
- `reserve(prompts, params)` sizes the caches and captures the CUDA graphs (Engine.reserve / Engine.warmup) before
  anything is timed;
- `warmup(prompts, params, n, refs)` runs n untimed generations of the first chunk (at most WARMUP_TOKENS new
  tokens each), then resets the phase timer;
- `prefill_pass(groups, params, refs)` prefills every chunk the timed run will (one new token each), untimed: the
  eager multi-row prefill and the drafter's catch-up meet one shape per chunk, and whatever a device does once per
  new shape is done before timing (on the H200 the first configuration of each batch size of 8 or 32 rows ran
  ~0.1-0.5 s slower than a later one doing the same work, with no compile inside the timed run: docs/benchmarks.md,
  "Session 7"); continuous batching admits a few rows at a time, so it also prefills 1..PREFILL_GRAPH_ROWS copies of
  one prompt per prefill-graph length bucket (the graphs are captured per (rows, bucket));
- `prepare(groups, params, warmup, refs)`: reserve, `warmup` generations, then (when warmup > 0) the prefill pass,
  as the bench runs them before timing (the probes under benchmarks/ call it too);
- every `generate` call starts with no free row's cache entries to reuse (`Engine.forget_prefixes`; prefix reuse,
  engine/scheduler.py, is the eager path's): the warm-up and the prefill pass ran the same prompts, and a timed
  prompt must prefill whole, its static batch in rows 0..B-1; within a continuous run a request may still reuse what
  a finished one left, as in a server;
- `run(prompts, params, refs)` generates chunk by chunk, timing each `generate` call with the host clock (its result
  is read on the host, so the time includes every device step); it may be called again with more prompts (MT-bench's
  second turns), and everything accumulates;
- `record()` -> `RunRecord`: outputs in prompt order, output tokens, wall seconds, acceptance statistics (merged
  per-request `SpecStats`), the PhaseTimer totals, the engine's batched steps by kind (prefill / decode / spec) and
  the decode traffic (bandwidth.DecodeTraffic: static batches from their lengths, continuous from the steps run);
- `close()` releases the engine and turns the target's aux capture off again, so a later plain run does not pay for
  it.
For an oracle drafter `refs[i]` is the reference sequence of prompt i (drafters.references).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from torch import nn

from ..config import EngineConfig, SpecConfig

from ..spec_schedule import SpecSchedule, format_spec
from ..engine.cuda_graphs import PREFILL_GRAPH_ROWS
from ..engine.engine import Engine
from ..errors import ConfigError
from ..sampling_params import SamplingParams
from ..spec.stats import SpecStats
from .bandwidth import DecodeTraffic
from .drafters import ORACLE, is_oracle

WARMUP_TOKENS = 32
BATCHING = ("static", "continuous")


def check_batching(batching: str, configs: Sequence["RunConfig"]) -> None:
    """Refuse what a batching mode cannot run, before any model is loaded."""
    if batching not in BATCHING:
        raise ConfigError(f"--batching must be one of {', '.join(BATCHING)} (got {batching!r})")
    if batching == "continuous" and any(c.drafter == ORACLE for c in configs):
        raise ConfigError("--draft oracle needs --batching static: the oracle's references follow cache rows, and "
                          "continuous batching gives a freed row to the next request")


# `--spec auto`: the shape `draft="auto"` gives an engine of the run's batch size (api.auto_spec), resolved per batch
# size by `RunConfig.resolved`; the run keeps its name ("<drafter> auto") at every size, its records the shape taken
AUTO = "auto"


@dataclass(frozen=True)
class RunConfig:
    name: str  # "no-spec", "oracle S3 K1 D4", "draft:smollm2-135m-eagle3 auto", ...
    drafter: str | None = None  # None: plain decoding; "oracle", "random" or a drafter folder
    spec: SpecConfig | SpecSchedule | str | None = None  # AUTO until `resolved`
    auto: bool = False  # resolved from AUTO

    def resolved(self, target: nn.Module, device_type: str, batch_size: int, params: SamplingParams,
                 spec_max_rows: int | None = None) -> tuple["RunConfig | None", str | None]:
        """An AUTO configuration with the shape `api.auto_spec` gives an engine of `batch_size` rows here (speculating
        on at most `spec_max_rows`) for steps of requests with these parameters (a run's requests all alike: the
        entries of auto's schedule for other modes never run), or (None, why) where that is plain decoding; any
        other configuration as it is."""
        if self.spec != AUTO:
            return self, None
        from ..api import auto_spec

        spec, why = auto_spec(target, device_type, batch_size, params.temperature, spec_max_rows, only=params)
        return (replace(self, spec=spec, auto=True), None) if spec is not None else (None, why)

    @property
    def speculative(self) -> bool:
        return self.drafter is not None

    @staticmethod
    def plain() -> "RunConfig":
        return RunConfig("no-spec")

    @staticmethod
    def of(drafter_label: str, drafter: str, spec: SpecConfig | SpecSchedule) -> "RunConfig":
        return RunConfig(f"{drafter_label} {shape_label(spec)}", drafter, spec)


def shape_label(spec: SpecConfig | SpecSchedule | str) -> str:
    """"S3 K1 D4", or a schedule's entries: "1:S3 K1 D4 / 32:S4 K2 D8" (with other modes' own: "...; sampled S3 K1
    D4; penalized plain"; AUTO: "auto")."""
    if spec == AUTO:
        return AUTO
    assert not isinstance(spec, str)
    return format_spec(spec, lambda s: f"S{s.steps} K{s.topk} D{s.draft_tokens}", " / ", "; {} {}")


@dataclass
class RunRecord:
    config: RunConfig
    batch_size: int
    prompt_tokens: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    stopped: list[bool] = field(default_factory=list)  # finished on EOS / a stop string
    seconds: float = 0.0
    stats: SpecStats = field(default_factory=SpecStats)
    phases: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # batched engine steps of the timed run, by kind
    spare_rows: int = 0  # the engine's cache rows for requests prefilled ahead (EngineConfig.prefill_ahead, resolved)
    traffic: DecodeTraffic = field(default_factory=DecodeTraffic)
    batching: str = "static"
    round: int = 0  # the repeat round (suite.run_suite with repeats > 1)

    @property
    def output_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0


class ConfigRun:
    def __init__(self, target: nn.Module, tokenizer, config: RunConfig, batch_size: int,
                 engine_config: EngineConfig, drafter: nn.Module | None = None, batching: str = "static") -> None:
        check_batching(batching, [config])
        self.target, self.config, self.batch_size = target, config, batch_size
        self.drafter = drafter
        self.continuous = batching == "continuous"
        self.engine = Engine(target, tokenizer, replace(engine_config, max_batch_size=batch_size),
                             drafter=drafter, spec=config.spec if drafter is not None else None)
        self.timer = self.engine.runner.timer
        self.timer.enabled = True
        self.rec = RunRecord(config, batch_size, batching=batching)

    def reserve(self, prompts: Sequence[Sequence[int]], params: SamplingParams, longest: int = 0) -> None:
        """Size the caches for these prompts (or `longest` prompt tokens) and capture the CUDA graphs of every batch
        bucket a batch can shrink through, so that nothing is allocated or captured while timed."""
        if not prompts:
            return
        rows = min(len(prompts), self.batch_size)
        self.engine.reserve(rows, max(longest, max(len(p) for p in prompts)) + params.max_new_tokens)
        self.engine.warmup(range(1, rows + 1), params.greedy)

    def _generate(self, prompts: list[list[int]], params: SamplingParams, refs: Sequence[Sequence[int]] | None):
        if is_oracle(self.drafter):
            assert refs is not None, "an oracle run needs the reference outputs"
            self.drafter.set_references(refs)
        self.engine.forget_prefixes()
        return self.engine.generate(prompts, params, chat=False)

    def _reset(self) -> None:
        """Forget what untimed work did: the phase timer and the step counts."""
        self.timer.reset()
        self.engine.step_counts.clear()

    def warmup(self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int,
               refs: Sequence[Sequence[int]] | None = None) -> None:
        first = [list(p) for p in prompts[: self.batch_size]]
        short = replace(params, max_new_tokens=min(params.max_new_tokens, WARMUP_TOKENS))
        for _ in range(n):
            self._generate(first, short, refs[: self.batch_size] if refs is not None else None)
        self._reset()

    def _batches(self, prompts: Sequence[Sequence[int]], offset: int = 0) -> list[tuple[int, list[list[int]]]]:
        """The static batches of `prompts` (consecutive chunks of `batch_size`), each with the index of its first
        prompt plus `offset` (where its references start); continuous batching: all prompts as one."""
        size = len(prompts) if self.continuous else self.batch_size
        return [(offset + i, [list(p) for p in prompts[i : i + size]]) for i in range(0, len(prompts), max(size, 1))]

    def _admission_shapes(self, prompts: Sequence[Sequence[int]]) -> list[list[list[int]]]:
        """Continuous batching admits 1..PREFILL_GRAPH_ROWS rows at a time: one batch of r copies of one prompt per
        (r, prefill-graph length bucket) the prompts reach, so that every such graph is captured before timing."""
        graphs = self.engine.runner.graphs
        if graphs is None:
            return []
        longest: dict[int, list[int]] = {}  # bucket -> its longest prompt
        for p in prompts:
            b = graphs.prefill_bucket(len(p))
            if b is not None and len(p) > len(longest.get(b, [])):
                longest[b] = list(p)
        return [[p] * r for p in longest.values() for r in range(1, min(self.batch_size, PREFILL_GRAPH_ROWS) + 1)]

    def prefill_pass(self, groups: Sequence[Sequence[Sequence[int]]], params: SamplingParams,
                     refs: Sequence[Sequence[int]] | None = None) -> None:
        one = replace(params, max_new_tokens=1)
        start = 0
        for g in groups:
            for at, batch in self._batches(g, start):
                self._generate(batch, one, refs[at : at + len(batch)] if refs is not None else None)
            if self.continuous:
                for batch in self._admission_shapes(g):
                    self._generate(batch, one, None)
            start += len(g)
        self._reset()

    def prepare(self, groups: Sequence[Sequence[Sequence[int]]], params: SamplingParams, warmup: int = 1,
                refs: Sequence[Sequence[int]] | None = None) -> None:
        """Everything untimed before the timed `run` calls of these prompt groups, in the bench's order: reserve
        (every prompt of every group), `warmup` generations of the first group, and, when warming up at all, the
        prefill pass."""
        self.reserve([p for g in groups for p in g], params)
        self.warmup(groups[0], params, warmup, refs)
        if warmup:
            self.prefill_pass(groups, params, refs)

    def run(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
            refs: Sequence[Sequence[int]] | None = None) -> None:
        rec = self.rec
        for start, batch in self._batches(prompts):
            batch_refs = refs[start : start + len(batch)] if refs is not None else None
            steps_before = self.engine.step_counts.get("decode", 0)
            t0 = time.perf_counter()
            outs = self._generate(batch, params, batch_refs)
            rec.seconds += time.perf_counter() - t0
            for p, o in zip(batch, outs):
                rec.prompt_tokens.append(len(p))
                rec.outputs.append(list(o.token_ids))
                rec.texts.append(o.text)
                rec.stopped.append(o.finish_reason == "stop")
                rec.stats.merge(o.stats)
            lens = [len(p) for p in batch]
            generated = [len(o.token_ids) + (o.finish_reason == "stop") for o in outs]
            if self.continuous:  # rows come and go: the weights are read once per decode step actually run
                rec.traffic.add_sequences(lens, generated, self.engine.step_counts.get("decode", 0) - steps_before)
            else:
                rec.traffic.add_batch(lens, generated)

    def record(self) -> RunRecord:
        self.rec.phases = self.timer.totals()
        self.rec.steps = dict(self.engine.step_counts)
        self.rec.spare_rows = self.engine.runner.rows - self.engine.runner.step_rows
        return self.rec

    def close(self) -> None:
        """Release the engine (caches, graphs) and turn the target's aux capture off; call after `record()`."""
        if self.drafter is not None:
            self.target.set_eagle3_layers_to_capture(None)
        cuda = self.engine.device.type == "cuda"
        del self.engine, self.timer
        if cuda:
            torch.cuda.empty_cache()
