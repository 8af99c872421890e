"""Benchmark prompt sets: MT-bench (shipped in the package), any JSONL of prompts, random token ids.

Contract:
- `mt_bench()` -> the 80 MT-bench questions as `PromptItem`s (first turn, and the second turn as `follow_up`), read
  from `eaglespec/assets/mt_bench_question.jsonl` (nothing outside the package is read).
- `read_jsonl(path)` -> one `PromptItem` per non-empty line, which is one of
  `{"prompt": "text"}`, `{"turns": ["first", "second", ...]}` (MT-bench's form), `{"messages": [{"role", "content"},
  ...]}` (a trailing assistant message is dropped) or `{"prompt_ids": [1, 2, ...]}` (token ids, for models without a
  tokenizer). A malformed line is a `ConfigError` naming the file and the line.
- `encode(tokenizer, first, chat)` -> (ids, rendered text): a string goes through the chat template when `chat` and
  the tokenizer has one (as the engine does), messages always do, ids pass through.
- `second_turn(item, answer)` -> the conversation [user first, assistant answer, user follow_up]: MT-bench's second
  turn is answered after the model's own first answer.
- `random_prompts(n, length, vocab, seed)` -> n lists of random token ids (random-weight models have no tokenizer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import torch

from ..assets import ASSETS
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..loading.tokenizer import BaseTokenizer

MT_BENCH_FILE = ASSETS / "mt_bench_question.jsonl"

First = Union[str, list, tuple]  # text, chat messages (list of dicts) or token ids (list of ints)


@dataclass(frozen=True)
class PromptItem:
    first: First
    follow_up: str | None = None  # the second user turn, answered after the model's own first answer


def _item(obj: object, where: str) -> PromptItem:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} is not a JSON object")
    if isinstance(obj.get("prompt"), str):
        return PromptItem(obj["prompt"])
    turns = obj.get("turns")
    if isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns):
        return PromptItem(turns[0], turns[1] if len(turns) > 1 else None)
    msgs = obj.get("messages")
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
        msgs = list(msgs)
        if msgs[-1]["role"] == "assistant":
            msgs = msgs[:-1]
        if not msgs:
            raise ConfigError(f"{where} has only an assistant message")
        return PromptItem(tuple(dict(m) for m in msgs))
    ids = obj.get("prompt_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return PromptItem(tuple(ids))
    raise ConfigError(
        f"{where} has none of 'prompt' (a string), 'turns' (a list of strings), 'messages' (a list of "
        "{role, content}) or 'prompt_ids' (a list of ints)"
    )


def read_jsonl(path: str | Path) -> list[PromptItem]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"prompt file {p} does not exist")
    items = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p} line {n} is not valid JSON ({e.msg})") from None
        items.append(_item(obj, f"{p} line {n}"))
    if not items:
        raise ConfigError(f"prompt file {p} has no prompts")
    return items


def mt_bench() -> list[PromptItem]:
    """The 80 MT-bench questions, in file order."""
    return read_jsonl(MT_BENCH_FILE)


def load_prompt_set(name: str) -> list[PromptItem]:
    """`mt-bench` or the path of a JSONL file."""
    return mt_bench() if name == "mt-bench" else read_jsonl(name)


def encode(tokenizer: "BaseTokenizer | None", first: First, chat: bool = True) -> tuple[list[int], str | None]:
    """Prompt ids and the text they encode (None for raw ids)."""
    if isinstance(first, str):
        if tokenizer is None:
            raise ConfigError("this model has no tokenizer: use a prompt file with 'prompt_ids' or --random-weights")
        text = first
        if chat and tokenizer.has_chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": first}])
        return tokenizer.encode(text), text
    items = list(first)
    if items and isinstance(items[0], dict):
        if tokenizer is None or not tokenizer.has_chat_template:
            raise ConfigError("chat messages need a tokenizer with a chat template")
        text = tokenizer.apply_chat_template(items)
        return tokenizer.encode(text), text
    return [int(i) for i in items], None


def second_turn(item: PromptItem, answer: str) -> list[dict]:
    """The conversation whose last user turn is `item.follow_up`, after the model's own first `answer`."""
    assert item.follow_up is not None
    if isinstance(item.first, str):
        history = [{"role": "user", "content": item.first}]
    elif item.first and isinstance(item.first[0], dict):
        history = [dict(m) for m in item.first]
    else:
        raise ConfigError("a second turn needs a text first turn, not token ids")
    return history + [{"role": "assistant", "content": answer}, {"role": "user", "content": item.follow_up}]


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n prompts of `length` uniform random token ids (fixed seed)."""
    if length < 1:
        raise ConfigError(f"--prompt-len must be >= 1 (got {length})")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()
