"""Regenerating the assistant turns with the target itself (the EAGLE-3 recipe), batched, cached and resumable.

Contract of `regenerate(target, tokenizer, conversations, cache_dir, config)` -> `RegenResult`:
- the user (and system) messages are kept; every assistant message is replaced by the target's own answer, generated
  through `Engine.generate` (continuous batching over `batch_size` rows, greedy at temperature 0, else sampled with
  the engine reseeded from (seed, shard) at each shard: one engine serves every shard of a call). The drafter then
  learns what the target actually says.
- multi-turn (default): turn by turn. Round r answers the r-th assistant turn of every conversation that has one,
  conditioned on the regenerated turns before it (the prompt is the chat template over the conversation so far).
  `first_turn_only` keeps each conversation up to its first assistant turn instead: fewer tokens, one round, but no
  training data with multi-turn contexts.
- lengths: a turn gets min(max_new_tokens, max_len - prompt tokens) new tokens (with `stop_loop` N, it ends where it
  goes deeper than N tokens into a repetition loop); when fewer than MIN_NEW would fit,
  the conversation ends before that turn (and is dropped, counted, if no turn is left). Trailing user messages are
  removed.
- cache: conversations are processed in shards of `shard_size`; each finished shard is written to
  `cache_dir/regen-<fingerprint>/shard-NNNNN.jsonl` (atomically) and reused by any later run with the same
  fingerprint (the conversations, the target's name and the settings), so an interrupted run resumes at the first
  missing shard and a finished one costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import torch

from ..config import EngineConfig
from ..sampling_params import SamplingParams
from .conversations import Message

if TYPE_CHECKING:
    from ..loading.tokenizer import BaseTokenizer

MIN_NEW = 16  # fewer free positions than this: the turn is not generated


@dataclass(frozen=True)
class RegenConfig:
    temperature: float = 0.0
    max_new_tokens: int = 512
    max_len: int = 2048
    first_turn_only: bool = False
    batch_size: int = 256
    shard_size: int = 1024
    seed: int = 0
    cuda_graphs: bool = True  # the engine's CUDA-graph decode (no effect on the CPU)
    # > 0: an answer ends before its first token deeper than this into a repetition loop (SamplingParams.stop_loop):
    # with --loop-keep N <= this those tokens carry no loss, and a small target's greedy answers loop a lot (43% of
    # the tokens SmolLM2 regenerated in session 38 lay deeper than 32 into a loop). 0: off
    stop_loop: int = 0


@dataclass
class RegenResult:
    conversations: list[list[Message]]
    dropped: Counter = field(default_factory=Counter)
    new_tokens: int = 0  # generated in this call (cached shards count 0)


def fingerprint(conversations: Sequence[Sequence[Message]], target_name: str, cfg: RegenConfig) -> str:
    h = hashlib.sha256()
    key = {**asdict(cfg), "batch_size": None, "cuda_graphs": None}  # the rows and the graphs do not change the text
    if not cfg.stop_loop:
        del key["stop_loop"]  # caches written before the option keep their key
    h.update(json.dumps({"target": target_name, **key}, sort_keys=True).encode())
    for c in conversations:
        h.update(json.dumps(c, ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _assistant_turns(conv: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(conv) if m["role"] == "assistant"]


def _trim(conv: list[Message]) -> list[Message]:
    while conv and conv[-1]["role"] != "assistant":
        conv.pop()
    return conv


def regenerate_shard(engine, convs: Sequence[Sequence[Message]], cfg: RegenConfig) -> tuple[list, int]:
    """Regenerate one shard; returns (conversations or None when dropped, generated tokens)."""
    work = [list(c) for c in convs]
    if cfg.first_turn_only:
        work = [c[: _assistant_turns(c)[0] + 1] for c in work]
    alive = [True] * len(work)
    n_new = 0
    rnd = 0
    while True:
        jobs: list[tuple[int, int, list[int]]] = []
        for ci, conv in enumerate(work):
            turns = _assistant_turns(conv)
            if not alive[ci] or rnd >= len(turns):
                continue
            ai = turns[rnd]
            prompt = engine.encode_prompt(conv[:ai])
            if len(prompt) + MIN_NEW > cfg.max_len:
                work[ci] = conv[:ai]
                alive[ci] = False
                continue
            jobs.append((ci, ai, prompt))
        if not jobs:
            break
        params = [SamplingParams(max_new_tokens=min(cfg.max_new_tokens, cfg.max_len - len(p)),
                                 temperature=cfg.temperature, detokenize=False, stop_loop=cfg.stop_loop)
                  for _, _, p in jobs]
        outs = engine.generate([p for _, _, p in jobs], params)
        for (ci, ai, _), o in zip(jobs, outs):
            work[ci][ai] = {"role": "assistant", "content": o.text.strip()}
            n_new += len(o.token_ids)
        rnd += 1
    result = []
    for conv in work:
        conv = _trim(conv)
        result.append(conv if any(m["role"] == "assistant" for m in conv) else None)
    return result, n_new


def write_shard(path: Path, rows: list) -> None:
    """One JSON line per conversation, written atomically (a killed run leaves no half shard)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"messages": r}, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


def read_shard(path: Path) -> list:
    # split on "\n" only: str.splitlines would also cut at U+2028/U+0085, which JSON strings may hold raw
    return [json.loads(line)["messages"] for line in path.read_text(encoding="utf-8").split("\n") if line]


def read_cache(folder: Path) -> list:
    """Every conversation a regeneration cache folder (`regen-<fingerprint>`) holds, shard by shard, without those the
    regeneration dropped (no assistant turn fit): what the probes of benchmarks/ read."""
    return [m for shard in sorted(Path(folder).glob("shard-*.jsonl")) for m in read_shard(shard) if m]


def regenerate(target: torch.nn.Module, tokenizer: "BaseTokenizer", conversations: Sequence[Sequence[Message]],
               cache_dir: str | Path, cfg: RegenConfig = RegenConfig(), target_name: str = "target",
               progress: bool = True) -> RegenResult:
    """See the module docstring."""
    from tqdm.auto import tqdm

    from ..engine.engine import Engine

    folder = Path(cache_dir) / f"regen-{fingerprint(conversations, target_name, cfg)}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps({"target": target_name, **asdict(cfg),
                                                      "conversations": len(conversations)}, indent=2) + "\n")
    n_shards = (len(conversations) + cfg.shard_size - 1) // cfg.shard_size
    out: list[list[Message]] = []
    dropped: Counter = Counter()
    n_new = 0
    engine = None  # one engine (and one set of captured CUDA graphs) for every shard this call generates
    bar = tqdm(total=len(conversations), desc="regenerate", unit="conv", disable=not progress, dynamic_ncols=True)
    try:
        for s in range(n_shards):
            path = folder / f"shard-{s:05d}.jsonl"
            chunk = conversations[s * cfg.shard_size: (s + 1) * cfg.shard_size]
            if path.is_file():
                rows = read_shard(path)
            else:
                if engine is None:
                    # prefills batched by eighths of the rows: one-row prefills would otherwise take every other step
                    ecfg = EngineConfig(max_batch_size=cfg.batch_size, max_seq_len=cfg.max_len + 1,
                                        cuda_graphs=cfg.cuda_graphs, min_prefill_rows=max(1, cfg.batch_size // 8))
                    engine = Engine(target, tokenizer, ecfg)
                # each shard draws from its own seed, so a resumed run samples a missing shard as a whole run did;
                # an engine per shard instead recaptured its graphs: 0.7-5.3 s a shard on the H200 (session 40)
                engine.reseed(cfg.seed + s)
                rows, k = regenerate_shard(engine, chunk, cfg)
                n_new += k
                write_shard(path, rows)
            for r in rows:
                if r is None:
                    dropped["no assistant turn fits --max-len"] += 1
                else:
                    out.append(r)
            bar.update(len(chunk))
            bar.set_postfix_str(f"new tokens {n_new}")
    finally:
        bar.close()
    return RegenResult(out, dropped, n_new)
