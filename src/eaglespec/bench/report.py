"""Benchmark results as data: the versioned JSON document, its Markdown table, and the files in --out.

`document(kind, result, model, workload, options, machine)` -> dict, schema `eaglespec.bench` version 1:

    schema, schema_version, kind ("bench" | "tune"), date (UTC ISO 8601), command, git_revision, git_dirty (both
    from `EAGLESPEC_GIT_REVISION`, "REV" or "REV-dirty", when set: `git_revision()`),
    eaglespec_version, complete (false in the files --out holds while the run goes on: written after every record,
    so that a run stopped part-way leaves what it measured; true once it has finished),
    machine:  hostname, platform, python, torch, cpu_count, device, device_name, device_memory_gb,
              copy_bandwidth_gb_s (CUDA: measured device-to-device copy, read + write; null on the CPU)
    model:    source, architecture, parameters, dtype, num_hidden_layers, hidden_size, vocab_size,
              weight_bytes_per_step, kv_bytes_per_token
    prompts:  set, count, turns, prompt_tokens_mean
    sampling: max_new_tokens, temperature, top_p, top_k, ignore_eos, seed, min_p, repetition_penalty,
              frequency_penalty, presence_penalty, structured (the structured output's kind, or null)
    engine:   cuda_graphs, fuse_projections (null: on CUDA and the CPU), compile, overlap, spec_max_rows (null: always),
              min_prefill_rows (continuous batching: free rows an admission waits for), prefill_ahead (continuous
              batching: requests an admission also prefills into spare rows; null: the engine's choice), compact_rows
              (the drain's requests moved into the lowest rows)
    warmup, batch_sizes, batching ("static": the prompts in consecutive chunks of batch_size, each run to completion;
    "continuous": all prompts queued, batch_size of them running at a time, a freed row taken at once), peer
    ({library, version} | null)
    records:  one per (configuration, batch size), baselines included, in run order:
      config (name), kind ("no-spec" | "spec" | "peer"), drafter, steps, topk, draft_tokens (null for a schedule),
      schedule ([[max rows, steps, topk, draft tokens], ...] for a `--spec R:S,K,D/...` schedule, else null),
      sampled_schedule, penalized_schedule (the same for a schedule's sampled steps, and its steps under count
      penalties, where it gives them their own, [] where they decode plainly, else null),
      shape (the shape's label, "S3 K1 D4" or "1:S3 K1 D4 / 8:S4 K2 D8"; null without speculation), auto (true for
      `--spec auto`: the shape `draft="auto"` takes at this batch size, resolved per batch size; the config name
      stays "<drafter> auto"),
      batch_size, round (0, or the repeat round: `--repeats`), prompts,
      prompt_tokens, output_tokens, seconds (wall time of the timed generations), tok_per_s (output tokens / seconds),
      speedup (tok_per_s / the no-spec tok_per_s at the same batch size and round; the peer: at batch 1, else null),
      identical_outputs (outputs equal token for token to the reference's) and identical_reference (the no-spec run
      at the same batch size; for a no-spec run and the peer: the no-spec run at the first batch size, batch 1 for
      the peer when measured), finished_by_eos, batching, engine_steps (batched steps the engine ran, by kind:
      prefill, decode, spec, and for a schedule of several shapes also per shape, "spec 3,1,4"; "join" and "compact":
      requests moved into freed or lower rows, no steps of their own; {} for the peer), spare_rows (the engine's rows
      for requests prefilled ahead: `prefill_ahead` resolved; 0 for the peer),
      accept_length_mean, accept_length_hist ({"tau": steps}), accept_rate_per_depth, verify_steps, draft_forwards
      (null without speculation),
      time_split: seconds of draft, verify, rest (= seconds - draft - verify: prefill, plain decode, commit and host
      work), prefill, decode, commit (from the engine's PhaseTimer; null for the peer),
      bandwidth (no-spec only): decode_steps, decode_seconds, decode_seconds_from ("timer", or "wall minus prefill"
      where graph replays are not timed one by one), bytes, bytes_per_step, achieved_gb_s, device_gb_s,
      fraction_of_device (see bandwidth.py for what is counted)
    repeats: rounds per batch size (suite.py);
    summary:  one row per (configuration, batch size): its first round's record with tok_per_s, speedup and
      accept_length_mean the medians over its rounds, plus runs, tok_per_s_range and speedup_range ([min, max]);
    tune (kind "tune" only): see tune.py.

`markdown(doc)` renders the table (and the acceptance table; a run not yet complete says so above it);
`write_outputs(doc, result, out)` writes results.json, results.md, results.png (not while the run is incomplete)
and outputs.jsonl (one line per prompt: turn, tokens, text, the reference baseline's answer).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import subprocess
from statistics import median
from pathlib import Path
from typing import Any, Sequence

import torch

from ..config import SpecConfig
from ..engine.int4_weights import on_int4_path

from ..spec_schedule import SpecSchedule
from .runs import RunRecord, shape_label
from .suite import BenchModel, SuiteOptions, SuiteResult, Workload

SCHEMA, SCHEMA_VERSION = "eaglespec.bench", 1


def git_revision() -> tuple[str | None, bool | None]:
    """(the tree's commit, whether tracked files differ from it); `EAGLESPEC_GIT_REVISION` ("REV" or "REV-dirty")
    overrides it where the local `.git` does not describe the files: a device machine's copy of the tree carries
    the `.git` of the session's first checkout (docs/benchmarks.md "Session 43")."""
    given = os.environ.get("EAGLESPEC_GIT_REVISION", "").strip()
    if given:
        return given.removesuffix("-dirty"), given.endswith("-dirty")
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None, None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def machine_info(device: torch.device, copy_bandwidth: float | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "cpu_count": os.cpu_count(), "device": str(device),
        "device_name": platform.processor() or platform.machine(), "device_memory_gb": None,
        "copy_bandwidth_gb_s": round(copy_bandwidth / 1e9, 1) if copy_bandwidth else None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, device_memory_gb=round(props.total_memory / 2**30, 1))
    return info


def _r(x: float | None, n: int = 3) -> float | None:
    return None if x is None else round(x, n)


def _kind(rec: RunRecord) -> str:
    if rec.config.name == "hf-transformers":
        return "peer"
    return "spec" if rec.config.speculative else "no-spec"


def _reference(rec: RunRecord, records: Sequence[RunRecord]) -> RunRecord | None:
    plain = [r for r in records if _kind(r) == "no-spec"]
    same = [r for r in plain if r.batch_size == rec.batch_size]
    if _kind(rec) == "spec":
        return same[0] if same else None
    return same[0] if (_kind(rec) == "peer" and same) else (plain[0] if plain else None)


def record_dict(rec: RunRecord, records: Sequence[RunRecord], model: BenchModel,
                device_bw: float | None) -> dict[str, Any]:
    kind = _kind(rec)
    ref = _reference(rec, records)
    base = next((r for r in records if _kind(r) == "no-spec" and r.batch_size == rec.batch_size
                 and r.round == rec.round), None)  # the speedup's: the same round's baseline
    spec = rec.config.spec
    schedule = spec.entries if isinstance(spec, SpecSchedule) else None
    shape = spec if isinstance(spec, SpecConfig) else None
    d: dict[str, Any] = {
        "config": rec.config.name, "kind": kind, "drafter": rec.config.drafter,
        "steps": shape.steps if shape else None, "topk": shape.topk if shape else None,
        "draft_tokens": shape.draft_tokens if shape else None,
        "schedule": [[rows, s.steps, s.topk, s.draft_tokens] for rows, s in schedule] if schedule else None,
        # a schedule's sampled / penalized steps' entries where they differ ([]: such steps decode plainly)
        **{f"{mode}_schedule": ([[rows, s.steps, s.topk, s.draft_tokens] for rows, s in getattr(spec, mode)]
                                if isinstance(spec, SpecSchedule) and getattr(spec, mode) is not None else None)
           for mode in ("sampled", "penalized")},
        "shape": shape_label(spec) if spec is not None else None, "auto": rec.config.auto,
        "batch_size": rec.batch_size, "round": rec.round, "prompts": len(rec.outputs),
        "prompt_tokens": sum(rec.prompt_tokens),
        "output_tokens": rec.output_tokens, "seconds": _r(rec.seconds, 4), "tok_per_s": _r(rec.tok_per_s, 2),
        "speedup": _r(rec.tok_per_s / base.tok_per_s, 4) if base is not None and base.tok_per_s > 0 else None,
        "identical_outputs": sum(a == b for a, b in zip(rec.outputs, ref.outputs)) if ref is not None else None,
        "identical_reference": f"no-spec bs={ref.batch_size}" if ref is not None else None,
        "finished_by_eos": sum(rec.stopped),
        "batching": rec.batching,
        "engine_steps": dict(sorted(rec.steps.items())),
        "spare_rows": rec.spare_rows,
    }
    if rec is base:
        d["speedup"] = 1.0
    stats = rec.stats.to_dict() if rec.stats.verify_steps else {}
    for key in ("accept_length_mean", "accept_length_hist", "accept_rate_per_depth", "verify_steps",
                "draft_forwards"):
        d[key] = stats.get(key)
    d["time_split"] = None
    if kind != "peer":
        ph = rec.phases
        draft, verify = ph.get("draft", 0.0), ph.get("verify", 0.0)
        d["time_split"] = {"draft": _r(draft, 4), "verify": _r(verify, 4),
                           "rest": _r(max(rec.seconds - draft - verify, 0.0), 4),
                           **{k: _r(ph.get(k, 0.0), 4) for k in ("prefill", "decode", "commit")}}
    d["bandwidth"] = None
    if kind == "no-spec":
        t = rec.traffic
        nbytes = t.bytes(model.weight_bytes, model.kv_bytes)
        secs, source = rec.phases.get("decode", 0.0), "timer"
        if secs <= 0 and t.steps:  # graph replays are not timed one by one: the wall time less the prefills
            secs, source = max(rec.seconds - rec.phases.get("prefill", 0.0), 0.0), "wall minus prefill"
        achieved = nbytes / secs if secs > 0 else None
        d["bandwidth"] = {
            "decode_steps": t.steps, "decode_seconds": _r(secs, 4), "decode_seconds_from": source, "bytes": nbytes,
            "bytes_per_step": round(nbytes / t.steps) if t.steps else None,
            "achieved_gb_s": _r(achieved / 1e9 if achieved else None, 2),
            "device_gb_s": _r(device_bw / 1e9 if device_bw else None, 1),
            "fraction_of_device": _r(achieved / device_bw if achieved and device_bw else None, 4),
        }
    return d


def document(kind: str, result: SuiteResult, model: BenchModel, workload: Workload, options: SuiteOptions,
             machine: dict[str, Any], command: str = "", complete: bool = True) -> dict[str, Any]:
    from .. import __version__ as version

    rev, dirty = git_revision()
    cfg = model.loaded.config
    device_bw = (machine.get("copy_bandwidth_gb_s") or 0) * 1e9 or None
    n_params = sum(p.numel() for p in {id(p): p for p in model.loaded.model.parameters()}.values())
    p = options.params
    records = [record_dict(r, result.records, model, device_bw) for r in result.records]
    return {
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "git_revision": rev, "git_dirty": dirty, "eaglespec_version": version, "complete": complete,
        "machine": machine,
        "model": {
            "source": model.source, "architecture": cfg.architecture, "parameters": n_params,
            "dtype": str(model.dtype).removeprefix("torch."), "num_hidden_layers": cfg.num_hidden_layers,
            # the 4-bit CPU path (EngineConfig.cpu_weights: "q4", or "auto" where it applied)
            "int4_weights": on_int4_path(model.loaded.model),
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "weight_bytes_per_step": model.weight_bytes, "kv_bytes_per_token": model.kv_bytes,
        },
        "prompts": {
            "set": workload.name, "count": len(result.prompts), "turns": workload.turns,
            "prompt_tokens_mean": _r(sum(r.prompt_tokens for r in result.prompts) / max(len(result.prompts), 1), 1),
        },
        "sampling": {"max_new_tokens": p.max_new_tokens, "temperature": p.temperature, "top_p": p.top_p,
                     "top_k": p.top_k, "ignore_eos": p.ignore_eos,
                     "seed": options.engine.seed, "min_p": p.min_p, "repetition_penalty": p.repetition_penalty,
                     "frequency_penalty": p.frequency_penalty, "presence_penalty": p.presence_penalty,
                     "structured": p.structured.kind if p.structured is not None else None},
        "engine": {"cuda_graphs": options.engine.cuda_graphs, "fuse_projections": options.engine.fuse_projections,
                   "compile": options.engine.compile, "overlap": options.engine.overlap,
                   "spec_max_rows": options.engine.spec_max_rows, "min_prefill_rows": options.engine.min_prefill_rows,
                   "prefill_ahead": options.engine.prefill_ahead, "compact_rows": options.engine.compact_rows},
        "warmup": options.warmup, "batch_sizes": list(options.batch_sizes), "batching": options.batching,
        "repeats": options.repeats,
        "peer": {"library": "transformers", "version": result.peer_version} if result.peer_version else None,
        "records": records,
        "summary": summary(records),
    }


def summary(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (configuration, batch size) over its rounds, in first-run order: its first round's record with
    tok_per_s, speedup and accept_length_mean replaced by their medians over the rounds (the speedup's: of each
    round's ratio to that round's baseline), plus runs and the [min, max] of tok/s and speedup."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["config"], r["batch_size"]), []).append(r)
    out = []
    for rs in groups.values():
        row = dict(rs[0])
        tps = [r["tok_per_s"] for r in rs]
        sp = [r["speedup"] for r in rs if r["speedup"] is not None]
        tau = [r["accept_length_mean"] for r in rs if r["accept_length_mean"] is not None]
        row.update(runs=len(rs), tok_per_s=_r(median(tps), 2), tok_per_s_range=[min(tps), max(tps)],
                   speedup=_r(median(sp), 4) if sp else None, speedup_range=[min(sp), max(sp)] if sp else None,
                   accept_length_mean=_r(median(tau), 4) if tau else None)
        out.append(row)
    return out


def _pct(part: float | None, whole: float | None) -> str:
    return f"{100 * part / whole:.0f}" if part is not None and whole else "-"


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _config_cell(r: dict[str, Any]) -> str:
    """The configuration's name, for `--spec auto` the shape it took at this batch size, and a repeat's round."""
    cell = f"{r['config']} = {r['shape']}" if r.get("auto") else r["config"]
    return cell + (f" (round {r['round']})" if r.get("round") else "")


_NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


def _adjustments(sampling: dict) -> dict:
    """The logit adjustments a run used (those away from neutral), for the table's heading."""
    return {k: sampling[k] for k, off in _NEUTRAL.items() if sampling.get(k, off) != off}


def markdown(doc: dict[str, Any], records: Sequence[dict[str, Any]] | None = None) -> str:
    recs = list(doc["records"] if records is None else records)
    m, mach, pr = doc["model"], doc["machine"], doc["prompts"]
    lines = [
        f"**{doc['kind']}** {m['source']} ({m['architecture']}, {m['dtype']}) on {mach['device']} "
        f"({mach['device_name']}); {pr['count']} prompts from {pr['set']} ({pr['turns']} turn(s)), "
        f"max_new_tokens {doc['sampling']['max_new_tokens']}, temperature {doc['sampling']['temperature']}"
        + (f", top-p {doc['sampling']['top_p']}" if doc["sampling"].get("top_p", 1.0) < 1.0 else "")
        + (f", top-k {doc['sampling']['top_k']}" if doc["sampling"].get("top_k", 0) > 0 else "")
        + "".join(f", {k.replace('_', ' ')} {v}" for k, v in _adjustments(doc["sampling"]).items())
        + (f", structured output {doc['sampling']['structured']}" if doc["sampling"].get("structured") else "")
        + f", {doc.get('batching', 'static')} batching",
        "",
    ]
    if not doc.get("complete", True):
        lines += [f"*Incomplete: written after {len(recs)} record(s) while the run went on (a run stopped part-way "
                  "leaves this).*", ""]
    lines += [
        "| config | batch | tok/s | speedup | accept len | identical | out tokens | seconds | steps | draft % "
        "| verify % | rest % | prefill % | decode GB/s |",  # prefill: part of rest (graph path: the drafter's too)
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in recs:
        ts, bw = r["time_split"] or {}, r["bandwidth"] or {}
        gbs = _f(bw.get("achieved_gb_s"), "{:.1f}")
        if bw.get("device_gb_s"):
            gbs += f" / {bw['device_gb_s']:.0f}"
        ident = f"{r['identical_outputs']}/{r['prompts']}" if r["identical_outputs"] is not None else "-"
        es = r.get("engine_steps") or {}
        steps = es.get("decode", 0) + es.get("spec", 0)  # batched decode / speculative steps (prefills apart)
        lines.append(
            f"| {_config_cell(r)} | {r['batch_size']} | {r['tok_per_s']:.1f} | {_f(r['speedup'], '{:.2f}x')} | "
            f"{_f(r['accept_length_mean'])} | {ident} | {r['output_tokens']} | {r['seconds']:.2f} | "
            f"{steps or '-'} | "
            f"{_pct(ts.get('draft'), r['seconds'])} | {_pct(ts.get('verify'), r['seconds'])} | "
            f"{_pct(ts.get('rest'), r['seconds'])} | {_pct(ts.get('prefill'), r['seconds'])} | {gbs} |"
        )
    if doc.get("repeats", 1) > 1:
        lines += ["", f"Medians over {doc['repeats']} rounds (odd rounds in reverse order; speedup: of each round's "
                  "ratio to its own baseline):", "",
                  "| config | batch | runs | tok/s | tok/s range | speedup | speedup range | accept len |",
                  "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: |"]
        for r in doc["summary"]:
            lo, hi = r["tok_per_s_range"]
            sr = r["speedup_range"]
            lines.append(f"| {_config_cell(r)} | {r['batch_size']} | {r['runs']} | {r['tok_per_s']:.1f} | "
                         f"{lo:.1f}-{hi:.1f} | {_f(r['speedup'], '{:.2f}x')} | "
                         f"{f'{sr[0]:.2f}-{sr[1]:.2f}x' if sr else '-'} | {_f(r['accept_length_mean'])} |")
    spec = [r for r in recs if r["accept_length_hist"] and not r.get("round")]
    if spec:
        lines += ["", "| config | batch | accept length histogram (tau: steps) | acceptance per depth |",
                  "| --- | ---: | --- | --- |"]
        for r in spec:
            hist = " ".join(f"{t}:{n}" for t, n in r["accept_length_hist"].items())
            depth = " ".join(f"{x:.2f}" for x in r["accept_rate_per_depth"])
            lines.append(f"| {_config_cell(r)} | {r['batch_size']} | {hist} | {depth} |")
    return "\n".join(lines) + "\n"


def write_outputs(doc: dict[str, Any], result: SuiteResult, out: str | Path, md: str) -> Path:
    from .plot import plot

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (d / "results.md").write_text(md)
    with open(d / "outputs.jsonl", "w", encoding="utf-8") as f:
        for row in result.prompts:
            f.write(json.dumps({"index": row.index, "turn": row.turn, "prompt_tokens": row.prompt_tokens,
                                "prompt": row.text, "answer": row.answer}, ensure_ascii=False) + "\n")
    if doc.get("complete", True):
        plot(doc, d / "results.png")
    else:  # an earlier run's plot in the same folder would not match these results
        (d / "results.png").unlink(missing_ok=True)
    return d
