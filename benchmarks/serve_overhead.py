"""The server's own host cost, apart from the model's: `eaglespec serve`'s app and worker on a tiny random Llama (2
layers of width 32, the character tokenizer, 32 rows, CPU, greedy), loaded by C clients in another process with
completions of 200 tokens (`ignore_eos`), unstreamed and streamed at each `--stream-interval`.

    python benchmarks/serve_overhead.py [--requests 96] [--concurrency 32] [--intervals 1,4,16] [--rounds 2]

A step of the tiny model takes about a millisecond, as SmolLM2's do on an H200, so what the table shows is what the
HTTP side (one SSE chunk per delta, built and written under the GIL the engine's loop needs) costs such an engine.
Each configuration runs in a fresh server process (`python serve_overhead.py --serve PORT INTERVAL`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from serve_load import run_clients  # noqa: E402  (the client threads, shared)
TOKENS = 200


def serve(port: int, interval: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    import uvicorn
    from tiny import CharTokenizer, tiny_llama

    from eaglespec.config import EngineConfig
    from eaglespec.engine.engine import Engine
    from eaglespec.server.app import create_app
    from eaglespec.server.worker import EngineWorker

    torch.set_num_threads(1)
    model = tiny_llama(seed=0, layers=2, hidden=32)
    engine = Engine(model, CharTokenizer(97), EngineConfig(device="cpu", max_batch_size=32, cuda_graphs=False))
    worker = EngineWorker(engine, 32, 256, stream_interval=interval).ready()
    server = uvicorn.Server(uvicorn.Config(create_app(worker, "tiny", 0.0), host="127.0.0.1", port=port,
                                           log_level="warning"))
    http_thread = threading.Thread(target=server.run, daemon=True)
    http_thread.start()
    worker.run(keep_running=http_thread.is_alive)


def post(port: int, i: int, stream: bool) -> int:
    """One completion; returns the number of content chunks (0 unstreamed)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "tiny", "prompt": f"abc {i} def", "max_tokens": TOKENS, "temperature": 0, "stream": stream,
            "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    chunks = 0
    if stream:
        for line in resp:
            if line.startswith(b"data: ") and b"[DONE]" not in line:
                chunks += 1
    else:
        resp.read()
    conn.close()
    return chunks


def load(port: int, requests: int, concurrency: int, stream: bool) -> tuple[float, float]:
    """(tok/s, chunks per answer) of `requests` completions, `concurrency` at a time."""
    for _ in range(200):  # the server's start
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.2)
    post(port, 0, stream)  # warm-up
    chunks, wall = run_clients(requests, concurrency, lambda i: post(port, i, stream))
    return requests * TOKENS / wall, sum(chunks) / requests


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--intervals", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=8811)
    args = ap.parse_args()
    configs = [(False, 1)] + [(True, int(n)) for n in args.intervals.split(",")]
    results: dict = {c: [] for c in configs}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    for _ in range(args.rounds):
        for stream, interval in configs:
            proc = subprocess.Popen([sys.executable, __file__, "--serve", str(args.port), str(interval)], env=env,
                                    stderr=subprocess.DEVNULL)
            try:
                results[(stream, interval)].append(load(args.port, args.requests, args.concurrency, stream))
            finally:
                proc.terminate()
                proc.wait(30)
    print("| streamed | --stream-interval | tok/s (each round) | chunks per answer |")
    print("| --- | ---: | --- | ---: |")
    for (stream, interval), runs in results.items():
        rates = " / ".join(f"{r:,.0f}" for r, _ in runs)
        print(f"| {'yes' if stream else 'no'} | {interval if stream else '-'} | {rates} | "
              f"{runs[-1][1]:.0f} |" if stream else f"| no | - | {rates} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
