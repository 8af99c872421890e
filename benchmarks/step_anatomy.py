"""Anatomy of one engine step: how much is the GPU's work and how much the host's, per batch size and shape.

For the embedded SmolLM2 (or MODEL.gguf) in bf16 with the CUDA fast path (graphs, fused, compiled) and its shipped
drafter, rows decoding steadily (random prompts, `ignore_eos`):
- engine_ms: one `Engine.step()` (scheduler, graph replays, reading the results: the step's one sync, bookkeeping);
- graph_ms: the same step's graphs replayed back to back (`GraphCache.run`), one sync after all of them;
- host_ms = engine_ms - graph_ms: the time per step the GPU waits for the host. If it is large, overlapping the
  host's work with the next step (launching step n+1 before reading step n) is what pays; if it is small, fewer
  kernels per step (fusion) is. The "... overlap" rows run with `EngineConfig.overlap`: their engine_ms against
  the same shape's without it is what the overlap gains.
- enqueue_ms: the host time per step of those back-to-back replays before the final sync (the CPU cost of
  launching the step's graphs). Close to graph_ms means the host cannot run ahead of the GPU: launches are that
  expensive, or a replay waits for the previous replay of the same graph (then two instances per graph, or fewer
  graph nodes, are the fix). The engine's own Python costs 15-60 us per step on a 2-core CPU with the tensor work
  faked out (session 4), far below the host_ms the H200 showed.
The replays advance the rows' device state without the host's bookkeeping, so the engine is discarded after them.

usage: python benchmarks/step_anatomy.py OUT_DIR [MODEL.gguf] [--cpu]   (--cpu: a quick check of the script itself,
       the static path run eagerly)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from eaglespec import api
from eaglespec.assets import default_drafter_path
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.cuda_graphs import GraphCache
from eaglespec.engine.engine import Engine
from eaglespec.sampling_params import SamplingParams

args = [a for a in sys.argv[1:] if not a.startswith("--")]
OUT = Path(args[0])
MODEL = args[1] if len(args) > 1 else None
CPU = "--cpu" in sys.argv
STEPS = 4 if CPU else 200
BATCHES = (1, 2) if CPU else (1, 8, 32)
# (shape, EngineConfig.overlap); None: plain decoding
SHAPES: list[tuple[SpecConfig | None, bool]] = [(None, False), (None, True), (SpecConfig(1, 1, 2), False),
                                                (SpecConfig(3, 1, 4), False), (SpecConfig(3, 1, 4), True),
                                                (SpecConfig(5, 4, 16), False)]
CACHE = 512 if CPU else 4096


def sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


BASE = EngineConfig(device="cpu" if CPU else "cuda", dtype="float32" if CPU else "bfloat16", max_seq_len=CACHE)
LOADED = api.load(MODEL, draft=default_drafter_path(), spec=SpecConfig(1, 1, 2), config=BASE)  # prepared once


def anatomy(spec: SpecConfig | None, overlap: bool, B: int) -> dict:
    cfg = replace(BASE, max_batch_size=B, overlap=overlap)
    eng = Engine(LOADED.target, LOADED.tokenizer, cfg, drafter=LOADED.drafter if spec else None, spec=spec)
    run = eng.runner
    if CPU:
        run.graphs = GraphCache(run, capture=False)
    eng.reserve(B, CACHE)
    vocab = eng.target.config.vocab_size
    g = torch.Generator().manual_seed(B)
    for i in range(B):
        ids = torch.randint(3, vocab, (48 + 16 * i,), generator=g).tolist()
        eng.add_request(ids, SamplingParams(max_new_tokens=CACHE - 48 - 16 * i - 64, ignore_eos=True))
    while eng.scheduler.waiting:  # admit and prefill every row
        eng.step()
    for _ in range(3 if CPU else 20):  # capture and warm the steady-state graphs
        eng.step()
    sync()
    t = time.perf_counter()
    for _ in range(STEPS):
        eng.step()
    sync()
    engine_ms = (time.perf_counter() - t) / STEPS * 1e3
    while eng._pending is not None:  # overlap: read the step still in flight before replaying by hand
        eng.step()
    rows = list(range(B))
    kind = "spec" if spec else "decode"
    Lmax = max(run.host_len[i] for i in rows)
    sync()
    t = time.perf_counter()
    for _ in range(STEPS):
        run.graphs.run(kind, B, Lmax, True)
    enqueue_ms = (time.perf_counter() - t) / STEPS * 1e3
    sync()
    graph_ms = (time.perf_counter() - t) / STEPS * 1e3
    label = (f"S{spec.steps} K{spec.topk} D{spec.draft_tokens}" if spec else "no-spec") + (" overlap" if overlap else "")
    return {"config": label, "batch": B, "engine_ms": round(engine_ms, 4), "graph_ms": round(graph_ms, 4),
            "enqueue_ms": round(enqueue_ms, 4), "host_ms": round(engine_ms - graph_ms, 4),
            "host_share": round(1 - graph_ms / engine_ms, 3)}


OUT.mkdir(parents=True, exist_ok=True)
results = []
for B in BATCHES:
    for spec, overlap in SHAPES:
        r = anatomy(spec, overlap, B)
        results.append(r)
        print(json.dumps(r), flush=True)
(OUT / "step_anatomy.json").write_text(json.dumps(results, indent=1))
print("\n| config | batch | engine ms/step | graphs only | graphs' enqueue | host | host share |\n"
      "|---|---:|---:|---:|---:|---:|---:|")
for r in results:
    print(f"| {r['config']} | {r['batch']} | {r['engine_ms']} | {r['graph_ms']} | {r['enqueue_ms']} | {r['host_ms']} "
          f"| {r['host_share']} |")
