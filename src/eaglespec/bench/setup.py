"""From command-line values to what the suite runs: the model, the prompts, the configurations.

Contract:
- `resolve_placement(device, dtype)` -> (torch device, torch dtype); dtype "auto" is bf16 on CUDA (float16 on GPUs
  without bf16), float32 elsewhere.
- `load_bench_model(model, random_weights, device, dtype, seed, fuse, compile)` -> `BenchModel`: a checkpoint (None:
  the embedded SmolLM2) through `engine.target_load.load_target`, or a random-weights model of a shape
  (random_model.py), with the engine's inference transforms applied as `api.load` does. Its `hf_source` is what
  `--peer hf` loads: the same file or folder, or the same random weights rebuilt.
- `select_prompts(random_weights, prompts, limit, sizes)` -> (items, count): MT-bench or a JSONL, read once (its
  first `limit` items; None for a random-weights model), and how many prompts the workload holds (a random-weights
  model: `limit`, else max(batch sizes, 8)); a batch size above that count is refused.
- `build_workload(model, name, items, turns, chat, prompt_len, count, seed)` -> `Workload`: those items encoded once
  with the model's tokenizer; for a random-weights model, `count` prompts of `prompt_len` random ids.
- `check_workload(...)` and `select_prompts` raise the prompt options' errors before the (slow) model load.
- `parse_sizes("1,8,32")`, `parse_bench_spec("5,4,16")` (or a schedule, `"1:3,1,4/32:4,2,8"`, or "auto": the
  shape `draft="auto"` takes at each batch size), `parse_ints` (config.py's, shared with `parse_spec`) validate with
  one-sentence errors.
- `spec_runs(drafts, specs, no_spec, default_model)` -> the speculative `RunConfig`s: every drafter x every shape;
  "auto" means the drafter shipped for the embedded model (none for other models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ..assets import default_drafter_path
from ..config import SpecConfig, parse_ints
from ..spec_schedule import SpecSchedule, parse_spec
from ..errors import ConfigError
from ..loading.checkpoint import auto_dtype, computable, resolve_device
from ..loading.default import default_model_path
from .datasets import PromptItem, encode, load_prompt_set, random_prompts
from .drafters import ORACLE, RANDOM, drafter_label
from .runs import AUTO, RunConfig
from .suite import BenchModel, Workload


def parse_sizes(text: str) -> list[int]:
    sizes = parse_ints(text, "--batch-sizes")
    if any(b < 1 for b in sizes):
        raise ConfigError(f"--batch-sizes must be >= 1 (got {text!r})")
    return list(dict.fromkeys(sizes))


def parse_bench_spec(text: str) -> SpecConfig | SpecSchedule | str:
    """`--spec`: "auto" (runs.AUTO: the shape `draft="auto"` takes at each batch size), or `spec_schedule.parse_spec`'s
    S,K,D or schedule R:S,K,D/R:S,K,D/..."""
    return AUTO if text.strip() == AUTO else parse_spec(text)


def resolve_placement(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    dev = resolve_device(device)
    if dtype == "auto":  # bf16 on CUDA (float16 on a GPU without it, as `resolve_dtype`), float32 elsewhere
        return dev, auto_dtype(torch.bfloat16, dev) if dev.type == "cuda" else torch.float32
    return dev, computable(getattr(torch, dtype), dev)


def load_bench_model(model: str | None, random_weights: str | None, device: torch.device, dtype: torch.dtype,
                     seed: int = 0, fuse: bool | None = None, compile: bool | None = None,
                     int4: bool | None = False) -> BenchModel:
    """`int4`: the 4-bit CPU path (EngineConfig.cpu_weights, through `int4_weights.int4_mode`: True required, None
    where the model allows it): loaded in float32, computing in bf16 (the BenchModel's dtype, its drafters')."""
    from ..engine.target_load import load_target
    from ..engine.transforms import prepare_for_inference

    if random_weights is not None:
        if model is not None:
            raise ConfigError("--model and --random-weights exclude each other")
        from .random_model import random_model

        loaded = random_model(random_weights, device, dtype, seed)
        prepare_for_inference(loaded.model, device, fuse, compile, int4)  # as load_target does
        source = f"random-weights:{random_weights}"
        hf: object = ("random", random_weights, seed)  # peer_hf rebuilds the same weights (before any fusing)
    else:
        path = model if model is not None else str(default_model_path())
        loaded = load_target(path, device, dtype, fuse, compile, int4)  # as api.load does
        source, hf = path, path
    return BenchModel(loaded, source, device, next(loaded.model.parameters()).dtype, hf)


def check_workload(random_weights: bool, prompts: str | None, limit: int | None, turns: int) -> None:
    """The prompt options' errors, before any model is loaded."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {limit})")
    if turns not in (1, 2):
        raise ConfigError(f"--turns must be 1 or 2 (got {turns})")
    if random_weights and prompts is not None:
        raise ConfigError("a --random-weights model has no tokenizer: its prompts are random ids (--prompt-len)")
    if random_weights and turns == 2:
        raise ConfigError("--turns 2 needs text prompts, which a --random-weights model cannot encode")


def select_prompts(random_weights: bool, prompts: str | None, limit: int | None,
                   sizes: list[int]) -> tuple[list[PromptItem] | None, int]:
    """The workload's prompt items (read once: counted here, encoded by `build_workload` after the model loads) and
    their count. A batch size larger than the count would time fewer rows than it names (a 32-row run of 10 prompts
    runs 10 rows): refused before the model is loaded."""
    name = prompts or "mt-bench"
    items = None if random_weights else load_prompt_set(name)[:limit]
    n = (limit or max(max(sizes), 8)) if items is None else len(items)
    if max(sizes) > n:
        what = "random prompts" if random_weights else f"prompts in {name}"
        what += f" with --limit {limit}" if limit and not random_weights else ""
        raise ConfigError(f"batch size {max(sizes)} needs at least {max(sizes)} prompts, but there are {n} {what}: "
                          "raise --limit or lower --batch-sizes")
    return items, n


def build_workload(model: BenchModel, prompts: str | None, items: list[PromptItem] | None, turns: int, chat: bool,
                   prompt_len: int, count: int, seed: int = 0) -> Workload:
    """`items` and `count` as `select_prompts` gives them; `prompts` names the set (None: MT-bench)."""
    random_weights = str(model.source).startswith("random-weights:")
    check_workload(random_weights, prompts, None, turns)
    if random_weights:
        ids = random_prompts(count, prompt_len, model.loaded.config.vocab_size, seed)
        return Workload("random", ids, [None] * len(ids), None, 1, chat)
    name = prompts or "mt-bench"
    assert items is not None, "build_workload: a checkpoint's workload needs its prompt items (select_prompts)"
    if turns == 2 and not any(i.follow_up for i in items):
        raise ConfigError(f"--turns 2: the prompts of {name} have no second turn ('turns' with two entries)")
    encoded = [encode(model.loaded.tokenizer, i.first, chat) for i in items]
    return Workload(name, [e[0] for e in encoded], [e[1] for e in encoded], items, turns, chat)


def spec_runs(drafts: Sequence[str] | None, specs: Sequence[SpecConfig | SpecSchedule], no_spec: bool,
              default_model: bool) -> list[RunConfig]:
    if no_spec and not specs:
        return []
    kinds: list[str] = []
    for d in drafts or ["auto"]:
        if d == "auto":
            shipped = default_drafter_path() if default_model else None
            if shipped is None:
                if specs or drafts:
                    raise ConfigError("no drafter for this model: pass --draft DIR, --draft oracle or --draft random "
                                      "(or --no-spec for the baseline only)")
                continue
            d = str(shipped)
        elif d not in (ORACLE, RANDOM) and not Path(d).exists():
            raise ConfigError(f"--draft {d!r} is neither 'oracle', 'random' nor an existing drafter folder")
        kinds.append(d)
    shapes = list(specs) or [SpecConfig()]
    runs = [RunConfig.of(drafter_label(k), k, s) for k in dict.fromkeys(kinds) for s in dict.fromkeys(shapes)]
    return runs
