"""`StructuredOutput`: what shape a request's answer must take (OpenAI's `response_format`, vLLM's `guided_*` /
`structured_outputs`, SGLang's `json_schema` / `regex` / `ebnf` all become one of these).

Kinds and their `spec` text:
- "json_schema": a JSON schema, as JSON text (a dict is accepted and serialised in its own key order: properties are
  generated in the schema's order);
- "json_object": any JSON object (OpenAI's {"type": "json_object"}); `spec` is empty;
- "regex": a regular expression the whole answer matches (Rust regex syntax, as llguidance reads it);
- "choice": exactly one of a list of strings (given as a list; kept as JSON text);
- "grammar": a context-free grammar, in Lark syntax or llama.cpp's GBNF (`root ::= ...`).

Frozen and hashable, so that equal requests share one compiled grammar (compiler.py). Validated at construction
(`RequestError`, one sentence); whether a regex or grammar compiles is checked when the engine takes the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import RequestError

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RequestError(f"unknown structured output kind {self.kind!r} (expected one of {', '.join(KINDS)})")
        spec = self.spec
        if self.kind == "json_schema":
            spec = _schema_text(spec)
        elif self.kind == "choice":
            spec = _choice_text(spec)
        elif self.kind == "json_object":
            spec = ""
        elif not isinstance(spec, str) or not spec.strip():
            raise RequestError(f"the {self.kind} of a structured output must be a non-empty string")
        object.__setattr__(self, "spec", spec)

    @staticmethod
    def json_schema(schema: dict[str, Any] | str) -> "StructuredOutput":
        return StructuredOutput("json_schema", schema)  # type: ignore[arg-type]

    @staticmethod
    def choice(options: Sequence[str]) -> "StructuredOutput":
        return StructuredOutput("choice", options)  # type: ignore[arg-type]


def _schema_text(schema: Any) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise RequestError(f"the JSON schema is not valid JSON: {e.msg} at character {e.pos}") from None
    if not isinstance(schema, (dict, bool)):
        raise RequestError(f"a JSON schema must be a JSON object (got {type(schema).__name__})")
    return json.dumps(schema)


def _choice_text(options: Any) -> str:
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError:
            raise RequestError("the choices of a structured output must be a list of strings") from None
    if (not isinstance(options, (list, tuple)) or not options
            or not all(isinstance(o, str) and o for o in options)):
        raise RequestError("the choices of a structured output must be a non-empty list of non-empty strings")
    return json.dumps(list(options))
