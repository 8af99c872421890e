"""Rendering chat templates the way transformers does, without importing transformers.

Contract: `render_chat_template(template, messages, add_generation_prompt, **variables)` renders a Jinja chat
template in an `ImmutableSandboxedEnvironment` with `trim_blocks`/`lstrip_blocks` and the `loopcontrols` extension,
and the helpers templates expect: `raise_exception(msg)`, a `tojson` filter that does not escape HTML (with
`ensure_ascii`, `indent`, `separators`, `sort_keys`), `strftime_now(fmt)`. Variables such as `bos_token`, `eos_token`
and `tools` are passed through. A template that does not parse raises `ConfigError`; one that refuses the messages
(`raise_exception`) raises `RequestError` with its message.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

from ..errors import ConfigError, RequestError


class _TemplateRefusal(Exception):
    """Raised by `raise_exception` inside a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRefusal(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & for HTML, which would change the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"the chat template is not valid Jinja ({e.message}, line {e.lineno})") from None


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
    import jinja2

    # OpenAI-style messages may carry None fields (content=None with tool calls); templates test for absence.
    clean = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    try:
        return _compile(template).render(messages=clean, add_generation_prompt=add_generation_prompt, **variables)
    except _TemplateRefusal as e:
        raise RequestError(f"the chat template refused these messages: {e}") from None
    except jinja2.TemplateError as e:
        raise RequestError(f"the chat template failed on these messages ({e})") from None
