"""User prompts written by the target itself, to widen the training data beyond the conversations on disk.

Why: the SmolLM2 drafter trained on ShareGPT answers scores 0.69 step-0 accuracy on fresh answers to held-out ShareGPT
prompts but 0.53 on MT-bench answers, 0.08-0.15 lower at equal target certainty (docs/training.md, "Where the two
part"): a domain gap. An instruction-tuned target, given its chat template up to where a user message's text begins,
writes user messages like those it was tuned on (the Magpie method); their answers, regenerated like any other
conversation, are text of the kinds of tasks the target expects, with no dataset to download.

Contract of `self_prompts(target, tokenizer, cfg, cache_dir, target_name, progress)` -> list of conversations
`[{"role": "user", "content": prompt}, {"role": "assistant", "content": "."}]` (the answer is a stub: regeneration
replaces it), at most `cfg.n`:
- generation: the engine samples continuations of `user_prefix(tokenizer)`, followed by one of `openers` (cycled
  over the rows) when given (temperature, top_p, `max_new_tokens`; rounds of `batch_size` requests, up to
  ROUNDS_PER_CALL rounds per `Engine.generate` call over `batch_size` rows, so a row that finishes its prompt takes
  the next request at once: a round no longer waits for its longest generation); a prompt counts
  when `keep_prompt` accepts it (it ended with an end token, has 3 to 400 words, is mostly printable text), the
  target's mean negative log-likelihood of its tokens after the prefix is at most `max_nll` (`prompt_nll`: sampling
  at T = 1 also draws word salad, which the target itself finds unlikely; SmolLM2's coherent requests score 1.3-2.8
  nats, garbled ones 3.1-4.1) and it is new (case and whitespace folded). Rounds continue until `n` are kept or
  `max_rounds * ceil(n / batch_size)` rounds ran, counted over every run with these settings (a target that writes
  few usable prompts gives fewer, not a hang, and re-running the same command generates nothing more; a larger `n`
  continues). A call's engine is seeded with seed * 1000 + the rounds run before it, so a run from scratch is
  reproducible (a resumed one draws other prompts than an uninterrupted one would have).
- cache: the kept prompts are written to `cache_dir/prompts-<fingerprint>.jsonl` (the target's name and the settings)
  after every round, so a later run with the same settings reads them instead of generating, and an interrupted one
  continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..config import EngineConfig
from ..sampling_params import SamplingParams
from .conversations import Message

if TYPE_CHECKING:
    from ..loading.tokenizer import BaseTokenizer

SENTINEL = "\u2063EAGLESPEC_USER\u2063"  # a user text no template rewrites: where it starts, the prompt's text begins
ROUNDS_PER_CALL = 4  # rounds of `batch_size` requests given to one `Engine.generate` call (continuous batching)


@dataclass(frozen=True)
class SelfPromptConfig:
    n: int
    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 256
    batch_size: int = 256
    seed: int = 0
    max_rounds: int = 8  # at most this many rounds of `batch_size` generations per `batch_size` prompts asked for
    max_nll: float | None = 3.0  # nats per token; None: no likelihood filter
    # text each prompt starts with, cycled over the rows (e.g. "Write", "Solve", "Imagine you are"): steers the
    # target towards task types its unprompted requests (mostly advice) rarely are; empty: free prompts
    openers: tuple[str, ...] = ()
    cuda_graphs: bool = True


def user_prefix(tokenizer: "BaseTokenizer") -> list[int]:
    """Token ids of the chat template rendered up to where a user message's text begins (system prompt included
    when the template adds one)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}])
    return tokenizer.encode(text[: text.index(SENTINEL)])


def keep_prompt(text: str, finished: bool) -> bool:
    """Whether a generated user message is usable: it ended on its own (not cut by the token limit), has 3 to 400
    words, and at least 90% of its characters are printable letters, digits, spaces or punctuation."""
    words = text.split()
    if not finished or not 3 <= len(words) <= 400:
        return False
    ok = sum(ch.isprintable() or ch in "\n\t" for ch in text)
    return ok >= 0.9 * len(text)


@torch.inference_mode()
def prompt_nll(target: torch.nn.Module, prefix: list[int], tokens: list[int]) -> float:
    """The target's mean negative log-likelihood (nats per token) of `tokens` following `prefix`."""
    return prompt_nlls(target, [(prefix, tokens)])[0]


@torch.inference_mode()
def prompt_nlls(target: torch.nn.Module, pairs: list[tuple[list[int], list[int]]], rows: int = 16) -> list[float]:
    """`prompt_nll` of many (prefix, tokens) pairs, `rows` sequences per forward: right-padded, so the causal mask
    keeps every real position's result equal to its own forward (pads come after it)."""
    from ..layers.context import ForwardContext

    dev = next(target.parameters()).device
    out: list[float] = []
    for i in range(0, len(pairs), rows):
        chunk = [(list(p), list(t)) for p, t in pairs[i : i + rows]]
        T = max(len(p) + len(t) for p, t in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.int64)
        for r, (p, t) in enumerate(chunk):
            ids[r, : len(p) + len(t)] = torch.tensor(p + t)
        ids = ids.to(dev)
        logp = target(ids, ForwardContext.plain(len(chunk), T, dev)).logits.float().log_softmax(-1)  # [R, T, V]
        for r, (p, t) in enumerate(chunk):
            pos = torch.arange(len(p) - 1, len(p) + len(t) - 1, device=dev)  # the logits predicting t
            out.append(-logp[r, pos, ids[r, pos + 1]].mean().item())
    return out


def prompt_key(text: str) -> str:
    """A prompt's identity for de-duplication: case and whitespace folded."""
    return " ".join(text.lower().split())


def fingerprint(target_name: str, cfg: SelfPromptConfig) -> str:
    key = {**asdict(cfg), "n": None, "batch_size": None, "cuda_graphs": None, "max_rounds": None}  # same text
    return hashlib.sha256(json.dumps({"target": target_name, **key}, sort_keys=True).encode()).hexdigest()[:16]


def self_prompts(target: torch.nn.Module, tokenizer: "BaseTokenizer", cfg: SelfPromptConfig, cache_dir: str | Path,
                 target_name: str = "target", progress: bool = True) -> list[list[Message]]:
    """See the module docstring."""
    from tqdm.auto import tqdm

    from ..engine.engine import Engine

    path = Path(cache_dir) / f"prompts-{fingerprint(target_name, cfg)}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    kept: list[str] = []
    rounds_done = 0
    if path.is_file():
        state = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
        rounds_done = state[0]["rounds"] if state else 0
        kept = [s["prompt"] for s in state[1:]]
    seen = {prompt_key(p) for p in kept}
    prefix = user_prefix(tokenizer)
    starts = [(o, prefix + tokenizer.encode(o)) for o in cfg.openers] or [("", prefix)]
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    bar = tqdm(total=cfg.n, initial=min(len(kept), cfg.n), desc="self prompts", unit="prompt",
               disable=not progress, dynamic_ncols=True)
    try:
        limit = cfg.max_rounds * -(-cfg.n // cfg.batch_size)  # rounds in all, over every run with these settings
        engine = None  # one engine (and one set of captured graphs) for all of this call's rounds
        while len(kept) < cfg.n and rounds_done < limit:
            if engine is None:
                longest = max(len(ids) for _, ids in starts)
                engine = Engine(target, tokenizer, EngineConfig(
                    max_batch_size=cfg.batch_size, max_seq_len=longest + cfg.max_new_tokens + 1,
                    seed=cfg.seed * 1000 + rounds_done, cuda_graphs=cfg.cuda_graphs,
                    min_prefill_rows=max(1, cfg.batch_size // 8)))
            # several rounds' requests per call: the engine refills a row as soon as its prompt ends, instead of
            # every row waiting for the round's longest (most end within ~40 tokens; some run to the limit and are
            # dropped anyway); never more requests than prompts still missing, nor rounds than the limit leaves
            k = min(ROUNDS_PER_CALL, limit - rounds_done, -(-(cfg.n - len(kept)) // cfg.batch_size))
            rows = [starts[(rounds_done * cfg.batch_size + i) % len(starts)] for i in range(k * cfg.batch_size)]
            outs = engine.generate([ids for _, ids in rows], params, chat=False)
            cands = [(ids, o, (opener + o.text).strip()) for (opener, ids), o in zip(rows, outs)]
            # the cheap checks first: only new, well-formed prompts are scored by the target
            cands = [c for c in cands
                     if keep_prompt(c[2], c[1].finish_reason == "stop") and prompt_key(c[2]) not in seen]
            if cfg.max_nll is not None and cands:
                nll = prompt_nlls(target, [(ids, o.token_ids) for ids, o, _ in cands])
                cands = [c for c, v in zip(cands, nll) if v <= cfg.max_nll]
            for _, _, text in cands:
                if len(kept) < cfg.n and prompt_key(text) not in seen:
                    seen.add(prompt_key(text))
                    kept.append(text)
                    bar.update(1)
            rounds_done += k
            _write(path, rounds_done, kept)
    finally:
        bar.close()
    return [[{"role": "user", "content": p}, {"role": "assistant", "content": "."}] for p in kept[: cfg.n]]


def _write(path: Path, rounds: int, prompts: list[str]) -> None:
    """Atomically: a first line with the rounds run, then one prompt per line."""
    tmp = path.with_suffix(".tmp")
    lines = [json.dumps({"rounds": rounds})] + [json.dumps({"prompt": p}, ensure_ascii=False) for p in prompts]
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)
