"""The structured-output fields of a request body, as OpenAI, vLLM and SGLang spell them, read into one
`StructuredOutput` (grammar/output_format.py).

Contract: `structured_output(fields)`, fields: the request's set fields by name, of these:
- OpenAI's `response_format`: {"type": "text"} (nothing), {"type": "json_object"}, or {"type": "json_schema",
  "json_schema": {"name": ..., "schema": {...}, "strict": ...}} (the schema is what counts);
- vLLM's `guided_json` (a schema, as an object or JSON text), `guided_regex`, `guided_choice` (a list of strings),
  `guided_grammar` (Lark or GBNF), and `structured_outputs` ({"json" | "regex" | "choice" | "grammar" |
  "json_object": ...}, one of them);
- SGLang's `json_schema` (JSON text or an object), `regex` and `ebnf`.
At most one of them may ask for a structure (two are refused, naming both), and a form this server does not read
(response_format "structural_tag", structured_outputs' other keys) is refused by name; returns None when none asks.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import RequestError
from ..grammar.output_format import StructuredOutput

_VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
_FIELDS = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar", "json_schema": "json_schema", "regex": "regex", "ebnf": "grammar"}


def structured_output(fields: Mapping[str, Any]) -> StructuredOutput | None:
    asked = {name: out for name, value in fields.items() if (out := _read(name, value)) is not None}
    if len(asked) > 1:
        raise RequestError(f"a request may ask for one structured output (got {' and '.join(sorted(asked))})")
    return next(iter(asked.values()), None)


def _read(name: str, value: Any) -> StructuredOutput | None:
    if value is None:
        return None
    if name == "response_format":
        return _response_format(value)
    if name == "structured_outputs":
        return _vllm_structured(value)
    if name not in _FIELDS:
        raise AssertionError(f"not a structured-output field: {name}")
    return StructuredOutput(_FIELDS[name], value)


def _response_format(rf: Any) -> StructuredOutput | None:
    if not isinstance(rf, Mapping):
        raise RequestError("response_format must be an object such as {\"type\": \"json_object\"}")
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            raise RequestError("response_format json_schema needs json_schema.schema (the JSON schema itself)")
        return StructuredOutput.json_schema(schema)
    raise RequestError(f"response_format {kind!r} is not supported by this server (text, json_object and "
                       "json_schema are)")


def _vllm_structured(so: Any) -> StructuredOutput | None:
    if not isinstance(so, Mapping):
        raise RequestError("structured_outputs must be an object such as {\"regex\": \"...\"}")
    set_keys = [k for k, v in so.items() if v not in (None, False)]
    unknown = [k for k in set_keys if k not in _VLLM_KEYS and k != "json_object"]
    if unknown:
        raise RequestError(f"structured_outputs {unknown[0]!r} is not supported by this server (json, regex, "
                           "choice, grammar and json_object are)")
    if len(set_keys) > 1:
        raise RequestError(f"structured_outputs may ask for one structure (got {' and '.join(sorted(set_keys))})")
    if not set_keys:
        return None
    key = set_keys[0]
    return StructuredOutput("json_object") if key == "json_object" else StructuredOutput(_VLLM_KEYS[key], so[key])
