"""`eaglespec generate PROMPT`: stream the answer to stdout, statistics (and a thinking model's reasoning:
answer_printer.py) to stderr, and to `--stats-json`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .. import api
from ..engine.int4_weights import on_int4_path
from ..errors import RequestError
from .answer_printer import AnswerPrinter
from .options import (add_model_options, add_sampling_options, answer_line, draft_arg, engine_config, plain_reason,
                      sampling_params, spec_config)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate an answer to one prompt")
    p.add_argument("prompt")
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="an image for a multimodal model such as Kimi-K2.5 (repeatable, in prompt order)")
    p.add_argument("--stats-json", default=None, metavar="PATH", help="write the statistics as JSON")


def run(args: argparse.Namespace) -> int:
    t_begin = time.perf_counter()
    params = sampling_params(args)  # validate before the (slow) model load
    spec = spec_config(args)
    missing = [path for path in args.image if not Path(path).is_file()]
    if missing:  # before the (slow) model load
        raise RequestError(f"image file {missing[0]} does not exist")
    engine = api.load(args.model, draft=draft_arg(args), spec=spec, config=engine_config(args, max_batch_size=1),
                      only=params)  # one request: auto schedules its kind of step alone
    t_loaded = time.perf_counter()
    images = list(args.image) or None
    # the caches and CUDA graphs this answer needs, before its clock starts, so that the stats line gives the
    # answer's speed and the start-up apart
    graphs = engine.warm_for(args.prompt, params, chat=not args.no_chat_template, images=images)
    t0 = time.perf_counter()
    prepared = engine.prepare(args.prompt, not args.no_chat_template, images)
    printer = AnswerPrinter(engine.tokenizer, prepared[0], params)  # a thinking model's reasoning to stderr
    for delta in engine.stream_prepared(*prepared, printer.params):
        printer.write(delta)
    printer.finish()
    seconds = time.perf_counter() - t0
    sys.stdout.write("\n")
    req = engine.last_request
    n = len(req.output_ids)
    stats = {
        "tokens": n,
        "prompt_tokens": len(req.prompt_ids),
        "seconds": round(seconds, 4),
        "tok_per_s": round(n / seconds, 2) if seconds > 0 else 0.0,
        "ttft_s": round((req.t_first or t0) - req.t_start, 4),
        "load_s": round(t_loaded - t_begin, 3),
        "cpu_timing_s": round(engine.cpu_timing_s, 3),  # of load_s: draft="auto" timing this CPU's forwards
        "warmup_s": round(t0 - t_loaded, 3),
        "graphs_captured": graphs,
        "finish_reason": req.finish_reason,
        "speculative": engine.speculative,
        "device": str(engine.device),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "int4_weights": on_int4_path(engine.runner.target),  # the 4-bit CPU path (cpu_weights)
    }
    line = answer_line(n, seconds)
    if stats["int4_weights"]:  # bf16 on the GGUF's own 4-bit weights (by default on a one-row x86-64 CPU engine)
        line += ", 4-bit CPU weights"
    plain = plain_reason(engine, args)
    if plain is not None:
        line += ", " + plain
    # the shape this answer's steps took (a schedule gives greedy, sampled and penalized steps their own; None: they
    # decoded plainly)
    s = engine.schedule.shape(1, params.greedy, params.penalized) if engine.schedule is not None else None
    if s is not None:
        stats.update(steps=s.steps, topk=s.topk, draft_tokens=s.draft_tokens, **req.stats.to_dict())
        line += f", accept length {req.stats.accept_length_mean:.2f} (S={s.steps} K={s.topk} D={s.draft_tokens})"
    line += f"; start-up {t0 - t_begin:.1f} s (load {t_loaded - t_begin:.1f} s"
    if engine.cpu_timing_s >= 0.05:  # a machine's first loads: its rounds are kept (engine/verify_cost.py)
        line += f", of which {engine.cpu_timing_s:.1f} s timed this CPU's forwards"
    line += f", {graphs} CUDA graphs {t0 - t_loaded:.1f} s)" if graphs else ")"
    print(line, file=sys.stderr)
    if args.stats_json:
        with open(args.stats_json, "w") as f:
            json.dump(stats, f, indent=2)
    return 0
