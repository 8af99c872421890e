"""Load on `eaglespec serve`: MT-bench first turns (or a JSONL of prompts) sent by C concurrent clients through the
HTTP API, for one or several server configurations launched in turn, side by side.

    python benchmarks/serve_load.py OUT --server-args= --server-args=--no-spec --concurrency 1,4 --limit 20
    python benchmarks/serve_load.py OUT --url http://127.0.0.1:8000 --concurrency 8      # a server already running
    # the device machine (GGUF staged by device_parts.sh; the web stack's wheels carried in .whl, downloaded here by
    #   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
    #     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl fastapi uvicorn "pydantic>=2" \
    #     httptools uvloop prometheus-client
    # and installed there by `pip install --no-index --no-deps --target /tmp/site .whl/*.whl`, PYTHONPATH=/tmp/site:src;
    # `--model $G` alone is the embedded model: the shipped drafter with the CUDA schedule of --spec auto):
    G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 benchmarks/serve_load.py $OUT/serve --concurrency 1,8,32 "--server-args=--model $G --no-spec" \
        "--server-args=--model $G"

Each configuration: `python -m eaglespec serve ARGS --port P --default-temperature T` (stderr to OUT/server_I.log),
waited for on /health, then for each C of --concurrency: warmed with one request, then every prompt once, C at a
time (--rounds times over), as chat completions of `--max-tokens` tokens (streamed with --stream: time to first
token too). Reports completion tokens per second of wall time, latency (mean, p50, p90), with --stream the mean time
to the first token, the mean acceptance length (non-streamed answers carry it), and how many answers equal the first
configuration's at the same C (greedy: all should).
Writes OUT/serve_load.json and each server's /metrics after its loads (OUT/metrics_I.txt) and prints a Markdown
table. Standard library only (http.client, threads), so it runs on
the device machine as it is.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from eaglespec.bench.datasets import load_prompt_set  # noqa: E402


def post(url: str, body: dict, stream: bool) -> dict:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read().decode()[:300]}")
    out: dict = {"ttft": None}
    if not stream:
        data = json.loads(resp.read())
        out.update(text=data["choices"][0]["message"]["content"], tokens=data["usage"]["completion_tokens"],
                   tau=(data.get("eaglespec") or {}).get("accept_length_mean"))
    else:
        text, tokens = [], 0
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                piece = c["delta"].get("content")
                if piece:
                    if out["ttft"] is None:
                        out["ttft"] = time.perf_counter() - t0
                    text.append(piece)
        out.update(text="".join(text), tokens=tokens, tau=None)
    out["latency"] = time.perf_counter() - t0
    conn.close()
    return out


def run_clients(n: int, concurrency: int, work: Callable[[int], Any]) -> tuple[list, float]:
    """`work(i)` for i in 0..n-1, from `concurrency` client threads taking the next i as each finishes; returns the
    results in order of i and the wall seconds."""
    results: list = [None] * n
    todo = iter(range(n))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            results[i] = work(i)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def run_load(url: str, prompts: list, args: argparse.Namespace, concurrency: int) -> dict:
    def body(p) -> dict:
        messages = p if isinstance(p, list) else [{"role": "user", "content": p}]
        b = {"messages": messages, "max_tokens": args.max_tokens, "temperature": args.temperature}
        if args.stream:
            b.update(stream=True, stream_options={"include_usage": True})
        return b

    post(url, body(prompts[0]), args.stream)  # warm-up: caches, first graphs
    results, wall = run_clients(len(prompts), concurrency, lambda i: post(url, body(prompts[i]), args.stream))
    lat = sorted(r["latency"] for r in results)
    taus = [r["tau"] for r in results if r["tau"] is not None]
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    tokens = sum(r["tokens"] for r in results)
    return {
        "concurrency": concurrency, "requests": len(results), "completion_tokens": tokens, "wall_s": round(wall, 3),
        "tok_per_s": round(tokens / wall, 1), "latency_mean_s": round(statistics.mean(lat), 3),
        "latency_p50_s": round(lat[len(lat) // 2], 3), "latency_p90_s": round(lat[int(0.9 * (len(lat) - 1))], 3),
        "ttft_mean_s": round(statistics.mean(ttfts), 4) if ttfts else None,
        "tau_mean": round(statistics.mean(taus), 3) if taus else None,
        "texts": [r["text"] for r in results],
    }


def save_metrics(url: str, path: Path) -> None:
    """The server's /metrics after its loads (its Prometheus counters: what it counted, for the record)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    if resp.status == 200:
        path.write_bytes(resp.read())


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float = 600) -> None:
    u = urlparse(url)
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no healthy server at {url} after {timeout:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--url", default=None, help="a running server (else each --server-args is launched)")
    ap.add_argument("--server-args", action="append", default=None,
                    help="`eaglespec serve` options of one configuration, as --server-args=\"--no-spec --seed 1\" "
                         "(repeatable; default: one, the defaults)")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--prompts", default="mt-bench")
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--concurrency", default="1",
                    help="clients at once; a list (1,8,32) runs each load in turn on one start of each server")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="send the prompts this many times (a load long enough that ramp-up and drain weigh little)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [item.first for item in load_prompt_set(args.prompts)[: args.limit]] * args.rounds
    configs = [None] if args.url else (args.server_args or [""])
    levels = [int(c) for c in str(args.concurrency).split(",")]
    rows = []
    for i, cfg in enumerate(configs):
        proc = None
        url = args.url
        if url is None:
            url = f"http://127.0.0.1:{args.port}"
            cmd = [sys.executable, "-m", "eaglespec", "serve", *shlex.split(cfg), "--port", str(args.port),
                   "--default-temperature", str(args.temperature), "--log-level", "warning"]
            src = str(Path(__file__).resolve().parents[1] / "src")  # before what PYTHONPATH has (the device's wheels)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
            proc = subprocess.Popen(cmd, stderr=open(out / f"server_{i}.log", "w"), env=env)
        try:
            wait_healthy(url, proc)
            runs = [run_load(url, prompts, args, c) for c in levels]
            save_metrics(url, out / f"metrics_{i}.txt")
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(60)
        for res in runs:
            res["config"] = cfg if cfg is not None else url
            if proc is not None:
                res["server_line"] = next((ln.strip() for ln in open(out / f"server_{i}.log") if "serving" in ln), "")
        rows.extend(runs)
    # each row against the first configuration's row at the same concurrency
    first = {r["concurrency"]: r for r in rows[: len(levels)]}
    for r in rows:
        r["identical_to_first"] = sum(a == b for a, b in zip(r["texts"], first[r["concurrency"]]["texts"]))
    (out / "serve_load.json").write_text(json.dumps({"args": vars(args), "runs": rows}, indent=2))
    print("| server | requests | concurrency | tok/s | vs first | latency mean / p50 / p90 s | ttft s | tau | "
          "identical |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        base = first[r["concurrency"]]["tok_per_s"]
        print(f"| `{r['config'] or '(defaults)'}` | {r['requests']} | {r['concurrency']} | {r['tok_per_s']} | "
              f"{r['tok_per_s'] / base:.2f}x | {r['latency_mean_s']} / {r['latency_p50_s']} / "
              f"{r['latency_p90_s']} | {r['ttft_mean_s'] or '-'} | {r['tau_mean'] or '-'} | "
              f"{r['identical_to_first']}/{r['requests']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
