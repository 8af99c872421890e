"""`eaglespec bench`: no-spec baseline vs speculative configurations, per batch size, on MT-bench or any JSONL.

    eaglespec bench --limit 20 --batch-sizes 1,8 --draft oracle --spec 3,1,4 --spec 5,4,16 --out results/
    eaglespec bench --random-weights llama-3.1-8b --batch-sizes 1 --draft random --spec 3,1,4 --out r/
    eaglespec bench --no-spec --peer hf --limit 80 --out r/

Prints one progress line per run on stderr and the Markdown table last on stdout; with --out writes results.json
(schema in bench/report.py), results.md, results.png and outputs.jsonl; all but the plot also after every run,
marked incomplete, so that a bench stopped part-way leaves what it measured. `add_run_options` and `prepare` are
shared with `eaglespec tune`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..assets import is_default_drafter
from ..engine.gc_heap import freeze_heap
from ..engine.int4_weights import int4_mode
from ..errors import ConfigError
from ..loading.default import is_default_model
from .options import (add_adjustment_options, add_runtime_options, add_structured_options, adjustments, engine_config,
                      structured_output)

if TYPE_CHECKING:
    from ..bench.suite import BenchModel, SuiteOptions, SuiteResult, Workload


def add_run_options(p: argparse.ArgumentParser, max_new_tokens: int, limit: int | None,
                    min_limit: int | None = None) -> None:
    """Options of bench and tune: model, prompts, batch sizes, sampling, placement, output. With `min_limit` (tune)
    the default --limit is max(min_limit, the largest batch size), so that every batch size has its rows filled."""
    m = p.add_argument_group("model")
    m.add_argument("--model", default=None, help="HF model folder or .gguf file (default: embedded SmolLM2-135M)")
    m.add_argument("--random-weights", default=None, metavar="CONFIG",
                   help="a model of this shape with random weights instead of a checkpoint: a config.json path or "
                        "a preset (llama-3.1-8b, smollm2-135m, qwen3-30b-a3b, kimi-k2.5-slice, gpt-oss-20b, "
                        "qwen2.5-7b); prompts are random ids, EOS is ignored")
    add_runtime_options(m)
    w = p.add_argument_group("prompts")
    w.add_argument("--prompts", default=None, metavar="mt-bench|FILE",
                   help="mt-bench (the default) or a JSONL file: one {prompt}, {turns} or {messages} per line")
    default = f"max({min_limit}, the largest batch size)" if min_limit else limit or "all"
    w.add_argument("--limit", type=int, default=limit,
                   help=f"use the first N prompts (default: {default}; random prompts: max(batch sizes, 8))")
    p.set_defaults(min_limit=min_limit)
    w.add_argument("--turns", type=int, default=1, choices=[1, 2],
                   help="2: also the second turns, after the model's own first answers")
    w.add_argument("--no-chat-template", action="store_true", help="feed 'prompt' strings as raw text")
    w.add_argument("--prompt-len", type=int, default=128, help="random prompt length (--random-weights; default 128)")
    r = p.add_argument_group("run")
    r.add_argument("--batch-sizes", default="1", help="batch sizes, e.g. 1,8,32 (default: 1)")
    r.add_argument("--batching", default="static", choices=["static", "continuous"],
                   help="static: the prompts in consecutive batches, each run to completion (default); continuous: "
                        "all prompts queued, batch-size of them running at once, a finished row refilled at once "
                        "(what a server does)")
    r.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=f"default: {max_new_tokens}")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    r.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (with --temperature > 0)")
    r.add_argument("--top-k", type=int, default=0, help="top-k sampling (with --temperature > 0; 0 = off)")
    r.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    add_adjustment_options(r)
    add_structured_options(r)
    r.add_argument("--seed", type=int, default=0, help="engine, random weights and random prompts (default: 0)")
    r.add_argument("--warmup", type=int, default=1,
                   help="untimed warm-up generations per run, then one untimed prefill of every batch the run will "
                        "time (0: no warm-up at all; default: 1)")
    r.add_argument("--repeats", type=int, default=1,
                   help="rounds of the baseline and every configuration per batch size, odd rounds in reverse "
                        "order; the table adds each one's median tok/s and speedup with their ranges (tune chooses "
                        "by the medians; default: 1)")
    r.add_argument("--peer", default=None, choices=["hf"], help="also time transformers' generate (batch 1)")
    r.add_argument("--out", default=None, metavar="DIR",
                   help="write results.json, results.md, results.png and outputs.jsonl here")


@dataclass
class Prepared:
    model: "BenchModel"
    workload: "Workload"
    options: "SuiteOptions"
    machine: dict[str, Any]


def prepare(args: argparse.Namespace) -> Prepared:
    """Validate, measure the device, load the model and encode the prompts (in that order: errors come first)."""
    from ..sampling_params import SamplingParams
    from ..bench.bandwidth import copy_bandwidth
    from ..bench.report import machine_info
    from ..bench.setup import (build_workload, check_workload, load_bench_model, parse_sizes, resolve_placement,
                               select_prompts)
    from ..bench.suite import SuiteOptions, stderr_log

    sizes = parse_sizes(args.batch_sizes)
    if args.limit is None and args.min_limit:  # tune: enough prompts to fill its largest batch (recorded as the
        args.limit = max(args.min_limit, max(sizes))  # --limit of the results' command line)
    limit = args.limit
    check_workload(args.random_weights is not None, args.prompts, limit, args.turns)
    if args.prompts not in (None, "mt-bench") and not Path(args.prompts).is_file():
        raise ConfigError(f"prompt file {args.prompts} does not exist")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0 (got {args.warmup})")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1 (got {args.repeats})")
    structured = structured_output(args)
    if structured is not None and args.random_weights is not None:
        raise ConfigError("a structured output needs the model's tokenizer: not with --random-weights")
    if structured is not None and args.peer is not None:
        raise ConfigError("the peer (--peer hf) does not take a structured output")
    items, count = select_prompts(args.random_weights is not None, args.prompts, limit, sizes)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, ignore_eos=args.ignore_eos or args.random_weights is not None,
                            **adjustments(args), structured=structured)
    engine = engine_config(args)
    device, dtype = resolve_placement(engine.device, args.dtype)
    bw = copy_bandwidth(device)
    if bw:
        stderr_log(f"device copy bandwidth {bw / 1e9:.0f} GB/s")
    model = load_bench_model(args.model, args.random_weights, device, dtype, args.seed, args.fuse, args.compile,
                             int4_mode(engine.cpu_weights, device, args.dtype, args.compile, max(sizes)))
    workload = build_workload(model, args.prompts, items, args.turns, not args.no_chat_template, args.prompt_len,
                              count, args.seed)
    # the model, its tokenizer and the libraries, out of the timed runs' full garbage collections (gc_heap.py); not
    # the engines, which the suite builds and drops one per configuration (a frozen one would never be freed)
    freeze_heap()
    return Prepared(model, workload, SuiteOptions(sizes, params, engine, args.warmup, args.peer, args.batching,
                                                  args.repeats), machine_info(device, bw))


NEGATABLE = ("cuda_graphs", "fuse", "compile", "overlap")  # BooleanOptionalAction options: False is spelled --no-...


def command_line(kind: str, args: argparse.Namespace) -> str:
    """The command, every option spelled out (reproducible whatever the defaults become)."""
    import shlex

    parts = ["eaglespec", kind]
    for key, val in vars(args).items():
        flag = "--" + key.replace("_", "-")
        if key in NEGATABLE and val is False:
            parts.append("--no-" + flag[2:])
            continue
        if key in ("command", "min_limit") or val is None or val is False:
            continue
        if val is True:
            parts.append(flag)
        elif isinstance(val, list):
            for v in val:
                parts += [flag, str(v)]
        else:
            parts += [flag, str(val)]
    return shlex.join(parts)


def finish(kind: str, args: argparse.Namespace, prep: Prepared, result: "SuiteResult") -> str:
    """The results document (for tune with its verdict, and the table sorted by tok/s per batch size), written to
    --out when given; returns the Markdown to print."""
    from ..bench.report import document, markdown, write_outputs
    from ..bench.tune import tune_section

    doc = document(kind, result, prep.model, prep.workload, prep.options, prep.machine, command_line(kind, args))
    if kind == "tune":
        # the medians over the rounds (one round: the records); the kind of step measured from the sampling
        doc["tune"] = tune_section(doc["summary"], doc["sampling"])
        order = {b: i for i, b in enumerate(doc["batch_sizes"])}
        recs = sorted(doc["records"], key=lambda r: (order.get(r["batch_size"], len(order)), -r["tok_per_s"]))
        md = markdown(doc, recs) + "\n" + "\n".join(doc["tune"]["messages"]) + "\n"
    else:
        md = markdown(doc)
    if args.out:
        write_outputs(doc, result, args.out, md)
    return md


def record_writer(kind: str, args: argparse.Namespace, prep: Prepared) -> Callable[["SuiteResult"], None] | None:
    """With --out, what `run_suite` calls after every record: the results so far written to --out, marked
    incomplete (`finish` writes the complete ones), so that a run stopped part-way leaves what it measured."""
    if not args.out:
        return None
    from ..bench.report import document, markdown, write_outputs

    def write(result: "SuiteResult") -> None:
        doc = document(kind, result, prep.model, prep.workload, prep.options, prep.machine, command_line(kind, args),
                       complete=False)
        write_outputs(doc, result, args.out, markdown(doc))

    return write


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark baseline vs speculative decoding (tok/s, acceptance, bandwidth)")
    add_run_options(p, max_new_tokens=256, limit=None)
    s = p.add_argument_group("speculation")
    s.add_argument("--spec", action="append", default=[], metavar="S,K,D",
                   help="a speculative shape: steps, topk, draft tokens (repeatable; default 5,4,16, and for the "
                        "embedded model's shipped drafter 'auto'), a schedule ROWS:S,K,D/ROWS:S,K,D/... (each step "
                        "the shape of the first entry whose ROWS reach its highest running row, e.g. "
                        "1:3,1,4/8:4,2,8; ';sampled=SHAPE' and ';penalized=SHAPE' after either give sampled steps "
                        "and steps under count penalties their own, 'plain' to decode them plainly), or "
                        "'auto': at each batch size the shapes generate and the API take for "
                        "an engine of that many rows on this device (not run where that is plain decoding)")
    s.add_argument("--draft", action="append", default=None, metavar="DIR|oracle|random",
                   help="drafter (repeatable): an EAGLE-3 folder, 'oracle' (the baseline's own greedy outputs: the "
                        "upper bound) or 'random' (random weights of the target's shape: the lower bound); default: "
                        "the shipped drafter of the embedded model")
    s.add_argument("--no-spec", action="store_true",
                   help="without --spec: only the no-spec baseline (which always runs)")


def run(args: argparse.Namespace) -> int:
    from ..bench.runs import check_batching
    from ..bench.runs import AUTO
    from ..bench.setup import parse_bench_spec, spec_runs
    from ..bench.suite import run_suite, stderr_log

    specs = [parse_bench_spec(s) for s in args.spec]
    # the embedded model, named or not (its GGUF anywhere: loading.default.is_default_model)
    default_model = args.random_weights is None and (args.model is None or is_default_model(args.model))
    # the shipped drafter, by "auto" on the embedded model or named (a copy of its folder too), without --spec: the
    # shape `draft="auto"` gives each batch size (where it speculates)
    shipped = all((d == "auto" and default_model) or (d != "auto" and is_default_drafter(d))
                  for d in args.draft or ["auto"])
    if not specs and shipped and args.random_weights is None:
        specs = [AUTO]
    configs = spec_runs(args.draft, specs, args.no_spec, default_model)
    check_batching(args.batching, configs)
    if not configs and not args.no_spec:
        stderr_log("no drafter for this model: running the no-spec baseline only (see --draft)")
    prep = prepare(args)
    result = run_suite(prep.model, prep.workload, configs, prep.options, on_record=record_writer("bench", args, prep))
    print(finish("bench", args, prep, result), end="")
    return 0
