"""The benchmark suite: the no-spec baseline and every configuration, at every batch size, on one prompt list.

Contract of `run_suite(model, workload, configs, options, log)` -> `SuiteResult`:
- for each batch size (in the order given): the no-spec baseline first, then each configuration, each a fresh
  `ConfigRun` (runs.py) with its warm-up, over the same prompts batched the same way (`options.batching`: static
  batches, or continuous batching with batch size concurrent requests);
- with `workload.turns == 2`, the baseline at the first batch size answers the first turns, then the second turns are
  built from those answers (datasets.second_turn) and everyone runs both groups (first turns, then second turns,
  batched separately);
- an `oracle` drafter gets the baseline's outputs at the same batch size as references, batch by batch;
- `options.peer == "hf"` adds transformers' generate at batch 1 over all prompts (peer_hf.py), last;
- `options.repeats` = N > 1: after that first round, N - 1 more rounds of the baseline and every configuration at
  the same batch size, each a fresh `ConfigRun`, in reverse order in odd rounds (ABBA: a position in the sequence,
  which can favour a run on a device, falls to each configuration alike); the records carry their round
  (`RunRecord.round`); the oracle keeps the first round's references;
- `SuiteResult.records` holds one `RunRecord` per (configuration, batch size, round) (+ the peer), baselines included;
  `SuiteResult.prompts` one row per prompt (turn, text, tokens, the reference baseline's answer);
- `on_record(result so far)`, when given, is called after every record (a long bench stopped part-way, by a timeout
  or a crash in a later configuration, still leaves what it measured: the CLI writes it to --out each time).
Both `bench` and `tune` run through here; `report.py` turns the result into JSON, Markdown and numbers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..config import EngineConfig
from ..errors import ConfigError
from ..loading.checkpoint import LoadedModel
from ..sampling_params import SamplingParams
from .bandwidth import kv_bytes_per_token, weight_bytes_per_step
from .datasets import PromptItem, encode, second_turn
from .drafters import ORACLE, DrafterPool, oracle, references
from .runs import ConfigRun, RunConfig, RunRecord, check_batching

Log = Callable[[str], None]


def stderr_log(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


@dataclass
class BenchModel:
    loaded: LoadedModel
    source: str  # what the user named: a path, or "random-weights:<shape>"
    device: torch.device
    dtype: torch.dtype
    hf_source: object = None  # what peer_hf loads: a path, or ("random", shape, seed)

    @property
    def weight_bytes(self) -> int:
        return weight_bytes_per_step(self.loaded.model)

    @property
    def kv_bytes(self) -> int:
        return kv_bytes_per_token(self.loaded.model, self.dtype)


@dataclass
class Workload:
    name: str  # "mt-bench", a JSONL path, or "random"
    first_ids: list[list[int]]
    first_text: list[str | None]
    items: list[PromptItem] | None = None  # the text items (for second turns)
    turns: int = 1
    chat: bool = True


@dataclass
class SuiteOptions:
    batch_sizes: list[int]
    params: SamplingParams
    engine: EngineConfig
    warmup: int = 1
    peer: str | None = None
    batching: str = "static"  # or "continuous" (runs.py)
    repeats: int = 1  # rounds of the baseline and every configuration per batch size (module docstring)


@dataclass
class PromptRow:
    index: int
    turn: int
    prompt_tokens: int
    text: str | None
    answer: str = ""


@dataclass
class SuiteResult:
    records: list[RunRecord]
    prompts: list[PromptRow] = field(default_factory=list)
    peer_version: str | None = None


def _second_turns(model: BenchModel, workload: Workload, answers: Sequence[str]) -> tuple[list[list[int]], list[str]]:
    ids, texts = [], []
    assert workload.items is not None
    for item, ans in zip(workload.items, answers):
        if item.follow_up is not None:
            i, t = encode(model.loaded.tokenizer, second_turn(item, ans), workload.chat)
            ids.append(i)
            texts.append(t)
    return ids, texts


def _config_run(model: BenchModel, pool: DrafterPool, cfg: RunConfig, bs: int, options: SuiteOptions,
                refs: list[list[int]]) -> ConfigRun:
    """A fresh run of a resolved configuration at batch size `bs` (the oracle built on the baseline's references)."""
    drafter = None
    if cfg.drafter == ORACLE:
        drafter = oracle(model.loaded.model.config, bs, max(len(r) for r in refs))
    elif cfg.speculative:
        drafter = pool.get(cfg.drafter)  # type: ignore[arg-type]
    return ConfigRun(model.loaded.model, model.loaded.tokenizer, cfg, bs, options.engine, drafter, options.batching)


def run_suite(model: BenchModel, workload: Workload, configs: Sequence[RunConfig], options: SuiteOptions,
              log: Log = stderr_log, on_record: Callable[[SuiteResult], None] | None = None) -> SuiteResult:
    check_batching(options.batching, configs)
    target, tok = model.loaded.model, model.loaded.tokenizer
    params = options.params
    eng = options.engine
    pool = DrafterPool(target, model.device, model.dtype, eng.seed, eng.fuse_projections, eng.compile)
    groups: list[list[list[int]]] = [workload.first_ids]
    prompts = [PromptRow(i, 1, len(p), t) for i, (p, t) in enumerate(zip(workload.first_ids, workload.first_text))]
    records: list[RunRecord] = []

    def add(rec: RunRecord) -> None:
        records.append(rec)
        if on_record is not None:
            on_record(SuiteResult(list(records), list(prompts)))

    def go(cr: ConfigRun, all_refs: list[list[int]] | None) -> RunRecord:
        cr.prepare(groups, params, options.warmup, all_refs)
        start = 0
        for g in groups:
            cr.run(g, params, all_refs[start : start + len(g)] if all_refs is not None else None)
            start += len(g)
        rec = cr.record()
        cr.close()
        log(f"{rec.config.name} bs={rec.batch_size}: {rec.output_tokens} tokens in {rec.seconds:.2f} s "
            f"({rec.tok_per_s:.1f} tok/s)" + (f", accept length {rec.stats.accept_length_mean:.2f}"
                                              if rec.stats.verify_steps else ""))
        return rec

    eos_ids: tuple[int, ...] = ()
    for bs in options.batch_sizes:
        base = ConfigRun(target, tok, RunConfig.plain(), bs, options.engine, batching=options.batching)
        eos_ids = tuple(base.engine.eos_ids)
        if workload.turns == 2 and len(groups) == 1:
            # the first batch size's baseline answers the first turns; the second turns follow its answers
            base.reserve(groups[0], params)
            base.warmup(groups[0], params, options.warmup)
            if options.warmup:
                base.prefill_pass(groups[:1], params)  # the second turns are not known yet
            base.run(groups[0], params)
            second, texts = _second_turns(model, workload, base.rec.texts)
            n = len(prompts)
            prompts += [PromptRow(n + i, 2, len(p), t) for i, (p, t) in enumerate(zip(second, texts))]
            if second:
                groups.append(second)
                base.reserve(second, params)  # longer prompts: may grow the caches, still untimed
                base.run(second, params)
            baseline = base.record()
            base.close()
            log(f"no-spec bs={bs}: {baseline.output_tokens} tokens in {baseline.seconds:.2f} s "
                f"({baseline.tok_per_s:.1f} tok/s), {len(prompts)} prompts over {len(groups)} turns")
        else:
            baseline = go(base, None)
        del base
        if bs == options.batch_sizes[0]:
            for row, ans in zip(prompts, baseline.texts):
                row.answer = ans
        add(baseline)
        all_ids = [p for g in groups for p in g]
        refs = references(all_ids, baseline.outputs, baseline.stopped, eos_ids)
        runs: list[RunConfig] = [RunConfig.plain()]  # this batch size's runs in order, for the later rounds
        for cfg in configs:
            if not cfg.speculative:
                continue
            resolved, why = cfg.resolved(target, model.device.type, bs, params, options.engine.spec_max_rows)
            if resolved is None:  # `--spec auto` where the default decodes plainly: the no-spec run is what it runs
                log(f"{cfg.name} bs={bs}: not run, the default decodes plainly here ({why})")
                continue
            runs.append(resolved)
            add(go(_config_run(model, pool, resolved, bs, options, refs), refs))
        for rnd in range(1, options.repeats):
            for cfg in (runs[::-1] if rnd % 2 else runs):
                rec = go(_config_run(model, pool, cfg, bs, options, refs), refs)  # only an oracle reads refs
                rec.round = rnd
                add(rec)
    peer_version = None
    if options.peer == "hf":
        if model.hf_source is None:
            raise ConfigError("--peer hf needs a model transformers can load")
        from .peer_hf import run_hf

        rec, peer_version = run_hf(model.hf_source, [p for g in groups for p in g], params, eos_ids, model.device,
                                   model.dtype, options.warmup, options.engine.seed)
        add(rec)
        log(f"hf-transformers {peer_version} bs=1: {rec.output_tokens} tokens in {rec.seconds:.2f} s "
            f"({rec.tok_per_s:.1f} tok/s)")
    elif options.peer is not None:
        raise ConfigError(f"--peer {options.peer!r} is not known (supported: hf)")
    return SuiteResult(records, prompts, peer_version)
