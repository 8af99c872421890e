"""`eaglespec serve`: an OpenAI-compatible HTTP server (chat/completions, completions, models, streaming) on one engine.

The engine batches concurrent requests continuously (`--max-batch-size` rows). On CUDA the default is 32 rows, where
the shipped drafter's schedule was measured up to 32 rows, speculating at every size. On the CPU it is 4 rows with
`--spec-max-rows 1`: speculation pays there only for a request running alone, and several requests gain more from
plain batched steps (this 2-core machine, MT-bench, 64 tokens, docs/benchmarks.md "Session 44": one client 1.26x over
plain 4-row decoding, 35.3 tok/s; four clients 70.3 tok/s, as plain 4-row decoding's 70.1, where a speculative
one-row engine gave 36.3; 8 rows only 7% over 4). Requests that omit `temperature` sample at
`--default-temperature` (1, as OpenAI's API; 0 serves greedy answers, speculation's lossless case); that value also
informs `--draft auto`'s choice.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from .. import api
from ..engine.engine import SERVE_LEN
from ..engine.gc_heap import freeze_heap
from ..errors import ConfigError
from ..loading.checkpoint import resolve_device
from .options import (add_model_options, device_arg, device_text, draft_arg, engine_config, engine_summary,
                      spec_config)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
CPU_ROWS = 4  # the CPU's default rows (module docstring)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server")
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-size", type=int, default=None, metavar="N",
                   help="requests run at once (default: 32 on CUDA; 4 on the CPU, speculating only while one runs: "
                        "--spec-max-rows 1); more wait in a queue")
    p.add_argument("--max-seq-len", type=int, default=None, metavar="N",
                   help=f"prompt + answer tokens per request (default: the model's context, at most {SERVE_LEN})")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients name (default: the model file or folder name)")
    p.add_argument("--default-temperature", type=float, default=1.0,
                   help="for requests without a temperature (default 1, as OpenAI's API; 0: greedy)")
    p.add_argument("--stream-interval", type=int, default=1, metavar="N",
                   help="a streamed answer's text goes out at its first tokens, then every N tokens (default 1; "
                        "larger N: fewer, larger chunks and more throughput with many streaming clients)")
    p.add_argument("--max-logprobs", type=int, default=20, metavar="N",
                   help="requests may ask for log-probabilities with up to N alternatives per token (default 20, "
                        "OpenAI's limit); steps compute them only while such a request runs")
    p.add_argument("--warmup-logprobs", action="store_true",
                   help="with --warmup, also capture the CUDA graphs of steps computing log-probabilities (twice "
                        "the start-up), so that the first requests asking for them do not capture their own")
    p.add_argument("--warmup-structured", action="store_true",
                   help="with --warmup, also capture the CUDA graphs of steps holding a structured output (JSON "
                        "schemas, regexes, tools; twice the start-up), so that the first such requests do not "
                        "capture their own")
    p.add_argument("--api-key", default=os.environ.get("EAGLESPEC_API_KEY"), metavar="KEY",
                   help="the /v1 routes take requests carrying 'Authorization: Bearer KEY' only (default: the "
                        "environment's EAGLESPEC_API_KEY; unset: no key); /health and /metrics stay open")
    p.add_argument("--log-stats-interval", type=float, default=10.0, metavar="SECONDS",
                   help="print request and token rates, queue sizes and the acceptance length to stderr this often "
                        "while requests run (default 10; 0: never); GET /metrics has them for Prometheus")
    p.add_argument("--warmup-both-modes", action="store_true",
                   help="with --warmup, capture the CUDA graphs of both greedy and sampled steps, whatever the "
                        "default temperature (twice the start-up; the two kinds of step take their own speculation "
                        "shapes), so that the first requests of the other kind do not capture their own")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="capture the CUDA graphs of every batch size at start (for the default temperature's greedy "
                        "or sampled steps), not during the first requests (default: on)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def model_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    return Path(args.model).name if args.model else DEFAULT_MODEL_NAME


def run(args: argparse.Namespace) -> int:
    import uvicorn  # here, not at the top: the other commands start without the web stack

    from ..server.app import create_app
    from ..server.worker import EngineWorker

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be in 1..65535 (got {args.port})")
    if args.max_seq_len is not None and args.max_seq_len < 2:
        raise ConfigError(f"--max-seq-len must be >= 2 (got {args.max_seq_len})")
    EngineWorker.check_options(args.stream_interval, args.log_stats_interval)
    if args.default_temperature < 0:
        raise ConfigError(f"--default-temperature must be >= 0 (got {args.default_temperature})")
    device = resolve_device(device_arg(args))
    config = engine_config(args, max_batch_size=args.max_batch_size or (32 if device.type == "cuda" else CPU_ROWS),
                           max_seq_len=args.max_seq_len, max_logprobs=args.max_logprobs)
    if device.type == "cpu" and args.spec_max_rows is None:
        config = replace(config, spec_max_rows=1)  # the CPU's speculation pays for a lone request only
    rows = config.max_batch_size
    engine = api.load(args.model, draft=draft_arg(args), spec=spec_config(args), config=config,
                      temperature=args.default_temperature)
    max_len = min(args.max_seq_len or SERVE_LEN, engine.context_len)
    # requests queue from the first one the server takes
    worker = EngineWorker(engine, rows, max_len, args.stream_interval, args.log_stats_interval).ready()
    if args.warmup:  # CUDA graphs of every batch and length bucket now, not during the first requests (CPU: none)
        t0 = time.perf_counter()
        default_greedy = args.default_temperature == 0
        modes = (default_greedy, not default_greedy) if args.warmup_both_modes else (default_greedy,)
        graphs = sum(engine.warmup(range(1, rows + 1), greedy=greedy, logprobs=args.warmup_logprobs,
                                   structured=args.warmup_structured) for greedy in modes)
        if graphs:
            print(f"[eaglespec] captured {graphs} CUDA graphs in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    freeze_heap()  # the engine and its graphs live as long as the server: full collections skip them (gc_heap.py)
    name = model_name(args)
    app = create_app(worker, name, args.default_temperature, api_key=args.api_key or None)
    print(f"[eaglespec] serving {name} at http://{args.host}:{args.port}/v1 on {device_text(engine)}: {rows} "
          f"row{'s' if rows > 1 else ''} of {max_len} tokens, {engine_summary(engine, args)}", file=sys.stderr)
    # the engine's loop stays on this thread, which loaded the model (server/worker.py says why); HTTP in another
    def terminate(signum: int, frame: object) -> None:  # `kill`, `docker stop`: shut down as Ctrl-C does
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    http = threading.Thread(target=server.run, name="eaglespec-http", daemon=True)
    try:
        http.start()
        while not server.started and http.is_alive():
            time.sleep(0.05)
        if not server.started:
            raise ConfigError(f"the HTTP server could not start on {args.host}:{args.port} (the port in use?)")
        worker.run(keep_running=http.is_alive)  # Ctrl-C (KeyboardInterrupt) or SIGTERM (SystemExit) ends it here
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.should_exit = True
        if http.is_alive():
            http.join(10)
        worker.close()  # the engine's memory back now, not when FastAPI's caches let go of the app
    return 0
