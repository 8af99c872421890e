"""A process's long-lived Python heap, frozen out of the cyclic garbage collector's full collections.

`freeze_heap()` collects once, then moves every object alive into the collector's permanent generation
(`gc.freeze`), which no later collection walks. Why: a full (oldest-generation) collection walks every tracked object
of the process, and after loading a model with its tokenizer, torch, Triton and the engine that is ~217,000 objects,
a 86-92 ms pause on the development CPU. Long runs trigger such collections (every ~55,000 surviving container
objects: requests, per-token log-probability entries, server objects), and each one stalls the host that feeds the
GPU. On the H200 (docs/benchmarks.md, "Session 47") they made runs of 32 rows asking for log-probabilities 25-40%
slower at random; with the heap frozen, a full collection walks only what was created since.

The cost: objects alive at the freeze are never collected if they later become cyclic garbage (`gc.unfreeze()`
returns them to the collector). An engine is such garbage once dropped (it and its graph cache refer to each other),
so only what lives as long as the process is frozen: the CLI freezes once its long-lived objects exist (`serve` after
its warm-up, `chat` after loading, `bench` / `tune` after loading the model but before the engines they build and drop
per configuration, `train` after loading the target and the data, before the regeneration's engines). A program that
keeps one engine for its life calls `freeze_heap()` after building (and warming) it. vLLM freezes its worker's heap at
the end of its warm-up (`freeze_gc_heap`); SGLang on request (`freeze_gc`).
"""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect, then freeze every object now alive; returns how many objects the permanent generation holds."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
