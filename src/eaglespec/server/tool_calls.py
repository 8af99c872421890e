"""Tool calls for `/v1/chat/completions`: OpenAI's `tools` and `tool_choice`, as structured outputs and a parser.

Contract:
- `plan_tools(tools, tool_choice, parallel_tool_calls)` -> a `ToolPlan` (None without tools): the tool definitions
  for the chat template, and how the answer is read:
  - a named function (`{"type": "function", "function": {"name": ...}}`): the answer is held to the function's
    parameters schema (grammar/: a structured output) and is that call's `arguments`;
  - "required": the answer is held to a JSON array of `{"name": ..., "parameters": {...}}` objects, one of the
    tools each (one object when `parallel_tool_calls` is false), read as that many calls;
  - "auto" (the default with tools): the answer is free; calls the model writes are read out of it, the rest is
    the content. How a model writes them is the `ToolSyntax` the server reads off its tokenizer (`tool_syntax`):
    the Hermes convention (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen's, Hermes' and
    SmolLM3's templates teach), or Kimi-K2's, whose markers are special tokens (`<|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>
    <|tool_calls_section_end|>`): such an answer is decoded with its special tokens (`ToolPlan.decodes_special`),
    which are stripped from the content again unless the request asked to keep them (`skip_special_tokens`
    false); a Kimi call's id is its function id (`functions.NAME:IDX`, which Kimi's template writes back);
  - "none": the answer is free and read as content only.
  A tool without a name, a named choice that names no tool, and an unknown choice are refused with one sentence.
- `ToolPlan.message(text, finish_reason)` -> (content or None, tool_calls or None, finish_reason): a whole answer
  read; a constrained answer cut by max_tokens stays content (its JSON is incomplete).
- `ToolPlan.stream()` -> a `ToolStream`: `feed(text)` gives the chat delta that may go out now: content (auto:
  text held back while it may be the start of a `<tool_call>` tag; then each call whole, with its index, as soon as
  its block closes: `</tool_call>`, Kimi's `<|tool_call_end|>`), or for a named function its call, its id and
  name first, then its arguments as they come (as vLLM streams them; "required" sends nothing until the end);
  `finish(reason, tail)` the last delta (`tail`: text not fed yet; what was held back, the calls not sent yet) and
  the finish reason, as `message` reads the whole text. A streamed named call cut by max_tokens ends with partial arguments and reason "length"
  (the whole answer's message gives that text as content instead).
Each call is `{"id": "call_...", "type": "function", "function": {"name": ..., "arguments": JSON text}}`.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import RequestError
from ..grammar.output_format import StructuredOutput
from .markers import Markers

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HERMES = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
# Kimi-K2's markers (special tokens of its tokenizer)
SECTION_OPEN, SECTION_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_OPEN, CALL_ARGS, CALL_CLOSE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_KIMI_SECTION = re.compile(re.escape(SECTION_OPEN) + r"(.*?)(?:" + re.escape(SECTION_CLOSE) + r"|$)", re.DOTALL)
_KIMI_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(\S+?)\s*" + re.escape(CALL_ARGS) + r"\s*(.*?)\s*(?:"
                        + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


def _call(name: str, arguments: Any, call_id: str | None = None) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": args}}


@dataclass(frozen=True)
class ToolSyntax:
    """How a model writes calls into a free answer: "hermes" or "kimi" (module docstring); `special`: the texts of
    the tokenizer's special tokens, stripped from a Kimi answer's content (empty: kept)."""
    kind: str = "hermes"
    special: tuple[str, ...] = ()

    @property
    def open(self) -> str:
        """What opens calls: streamed content is sent up to it."""
        return SECTION_OPEN if self.kind == "kimi" else OPEN

    @property
    def close(self) -> str:
        """What ends one call: a streamed call goes out once its block ends with it."""
        return CALL_CLOSE if self.kind == "kimi" else CLOSE

    def extract(self, text: str) -> tuple[str, list[dict] | None]:
        """(the text outside the calls, the calls or None): a block that holds no valid call stays in the text."""
        return _kimi(text) if self.kind == "kimi" else _hermes(text)

    def clean(self, text: str) -> str:
        """Content as the client sees it: without the special tokens (a Kimi answer, decoded with them)."""
        return self._special.clean(text)

    def held(self, text: str) -> int:
        """The length of the longest tail of `text` that may still become `open` (or, Kimi, a special token:
        cleaned only once whole)."""
        return self._markers.held(text)

    @functools.cached_property
    def _special(self) -> Markers:
        return Markers(self.special)

    @functools.cached_property
    def _markers(self) -> Markers:
        return Markers((self.open, *self.special))


HERMES = ToolSyntax()


def tool_syntax(special_texts: Sequence[str]) -> ToolSyntax:
    """The syntax of a model whose tokenizer has these special tokens: Kimi-K2's where its call markers are among
    them, else Hermes'."""
    return ToolSyntax("kimi", tuple(special_texts)) if CALL_OPEN in special_texts else HERMES


def _function(tool: Any) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise RequestError("each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": "
                           "...}}")
    return fn


def _parameters(fn: dict) -> dict:
    params = fn.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict]  # as the request gave them: the chat template renders them
    mode: str  # "none", "auto", "required" or "named"
    name: str | None = None  # the named function
    structured: StructuredOutput | None = None  # the answer's constraint (required, named)
    syntax: ToolSyntax = HERMES  # how "auto" reads calls

    @property
    def decodes_special(self) -> bool:
        """Whether the answer must be decoded with its special tokens (Kimi's markers, "auto")."""
        return self.mode == "auto" and self.syntax.kind == "kimi"

    def message(self, text: str, finish_reason: str) -> tuple[str | None, list[dict] | None, str]:
        if self.mode == "none":
            return text, None, finish_reason
        if self.mode == "auto":
            rest, calls = self.syntax.extract(text)
            if not calls:
                return self.syntax.clean(text), None, finish_reason
            return self.syntax.clean(rest).strip() or None, calls, "tool_calls"
        try:  # the grammar held it to the calls' JSON, unless it was cut (max_tokens, a stop string, an abort)
            value = json.loads(text) if finish_reason == "stop" else None
        except json.JSONDecodeError:
            value = None
        if value is None:  # incomplete JSON stays text
            return text, None, finish_reason
        if self.mode == "named":  # the arguments as the model wrote them
            return None, [_call(self.name or "", text)], "tool_calls"
        try:
            return None, [_call(c["name"], c["parameters"]) for c in value], "tool_calls"
        except (KeyError, TypeError):  # valid JSON of another shape: only a cut answer could be one
            return text, None, finish_reason

    def stream(self) -> "ToolStream":
        return ToolStream(self)


@dataclass
class ToolStream:
    plan: ToolPlan
    sent: int = 0  # characters of the text already sent (as content, or as a named call's arguments)
    text: str = field(default="")
    call: dict | None = None  # a named function's call, once its first delta went out
    calls_sent: int = 0  # auto: the calls already sent (those whose blocks had closed)

    def feed(self, delta: str) -> dict:
        self.text += delta
        mode = self.plan.mode
        if mode == "none":
            return {"content": self._send(len(self.text))}
        if mode == "named":
            args = self._send(len(self.text))
            if self.call is None:
                self.call = _call(self.plan.name or "", "")
                return {"tool_calls": [{"index": 0, **self.call, "function": {"name": self.plan.name,
                                                                             "arguments": args}}]}
            return {"tool_calls": [{"index": 0, "function": {"arguments": args}}]} if args else {}
        if mode != "auto":
            return {}
        syntax = self.plan.syntax
        start = self.text.find(syntax.open, self.sent)
        if start >= 0:  # a call began: the content before it goes, then each call once its block closed
            delta: dict = {"content": syntax.clean(self._send(start))}
            calls = self._closed_calls()
            if calls:
                delta["tool_calls"] = calls
            return delta
        keep = syntax.held(self.text)  # a tail that may open a tag
        return {"content": syntax.clean(self._send(len(self.text) - keep))}

    def finish(self, finish_reason: str, tail: str = "") -> tuple[dict, str]:
        """(the last delta, the finish reason), after the text's `tail` not fed yet: what was held back, and the
        calls not sent yet (auto: those whose blocks had not closed). The content sent before a call is the text
        before its tag: streamed, the content may keep whitespace around the calls that the whole answer strips."""
        self.text += tail
        delta: dict = {}
        if self.plan.mode == "named":  # the call went out as the text came
            rest = self._send(len(self.text))
            if rest:
                delta["tool_calls"] = [{"index": 0, "function": {"arguments": rest}}]
            done = self.call is not None and self.plan.message(self.text, finish_reason)[1] is not None
            return delta, "tool_calls" if done else finish_reason
        if self.plan.mode == "auto":  # the text outside the calls, less what went out before the first tag
            syntax = self.plan.syntax
            outside, calls = syntax.extract(self.text)
            rest = syntax.clean(outside[self.sent:]).rstrip() if calls else syntax.clean(self.text[self.sent:])
            reason = "tool_calls" if calls else finish_reason
        else:
            _, calls, reason = self.plan.message(self.text, finish_reason)
            rest = self.text[self.sent:] if calls is None else ""
        if rest:
            delta["content"] = rest
        rest_calls = [{"index": k, **c} for k, c in enumerate(calls or []) if k >= self.calls_sent]
        if rest_calls:
            delta["tool_calls"] = rest_calls
        return delta, reason

    def _closed_calls(self) -> list[dict]:
        """auto: the calls read out of the text up to its last closed block that were not sent yet (indexed). A
        block's reading does not change with what follows it, so they are the whole answer's first calls."""
        syntax = self.plan.syntax
        end = self.text.rfind(syntax.close)
        if end < 0:
            return []
        calls = syntax.extract(self.text[: end + len(syntax.close)])[1] or []
        new = [{"index": self.calls_sent + k, **c} for k, c in enumerate(calls[self.calls_sent:])]
        self.calls_sent = len(calls)
        return new

    def _send(self, upto: int) -> str:
        out = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return out


def _hermes(text: str) -> tuple[str, list[dict] | None]:
    """Hermes-style calls read out of a free answer: (the text outside them, the calls or None). A block that is not
    a JSON object with a name stays in the text."""
    calls, spans = [], []
    for m in _HERMES.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append(_call(obj["name"], obj.get("arguments", obj.get("parameters", {}))))
            spans.append(m.span())
    if not calls:
        return text, None
    return _cut(text, spans), calls


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the spans (in order, disjoint)."""
    return "".join(text[a:b] for a, b in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(text)]))


def _kimi(text: str) -> tuple[str, list[dict] | None]:
    """Kimi-K2 calls read out of a free answer decoded with its special tokens: (the text outside the sections
    that held valid calls, the calls or None). A call's arguments must be JSON; its id is the function id."""
    calls, spans = [], []
    for section in _KIMI_SECTION.finditer(text):
        found = []
        for m in _KIMI_CALL.finditer(section.group(1)):
            fid, args = m.group(1), m.group(2)
            try:
                json.loads(args)
            except json.JSONDecodeError:
                continue
            name = fid.removeprefix("functions.").rsplit(":", 1)[0]
            found.append(_call(name, args, fid))
        if found:
            calls += found
            spans.append(section.span())
    return (_cut(text, spans), calls) if calls else (text, None)


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool = True,
               syntax: ToolSyntax = HERMES) -> ToolPlan | None:
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools")
        return None
    fns = [_function(t) for t in tools]
    names = [f["name"] for f in fns]
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type", "function") == "function" else None
        if name not in names:
            raise RequestError(f"tool_choice names the function {name!r}, which is not among the tools "
                               f"({', '.join(names)})")
        schema = _parameters(fns[names.index(name)])
        return ToolPlan(list(tools), "named", name, StructuredOutput.json_schema(schema))
    if choice in ("none", "auto"):
        return ToolPlan(list(tools), choice, syntax=syntax)
    if choice != "required":
        raise RequestError(f"tool_choice must be \"none\", \"auto\", \"required\" or a named function (got "
                           f"{choice!r})")
    one_of = [{"type": "object", "properties": {"name": {"const": f["name"]}, "parameters": _parameters(f)},
               "required": ["name", "parameters"], "additionalProperties": False} for f in fns]
    array: dict[str, Any] = {"type": "array", "items": {"anyOf": one_of}, "minItems": 1}
    if not parallel_tool_calls:
        array["maxItems"] = 1
    return ToolPlan(list(tools), "required", None, StructuredOutput.json_schema(array))
