"""What a request's prompt may be, and its token ids.

`Prompt`: text, chat messages ([{"role": ..., "content": ...}]) or token ids.
`encode_prompt(tokenizer, prompt, chat)`: text goes through the tokenizer's chat template as one user message when
`chat` and the tokenizer has one (raw text otherwise); messages need a chat template; ids pass as they are. A model
without a tokenizer takes ids only. `tools` (OpenAI's tool definitions) reach the chat template as its `tools`
variable, for templates that render them. Each mistake is the user's error (`RequestError`), with the way out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union

from ..errors import RequestError

if TYPE_CHECKING:
    from ..loading.tokenizer import BaseTokenizer

Prompt = Union[str, Sequence[int], Sequence[dict]]


def encode_prompt(tokenizer: "BaseTokenizer | None", prompt: Prompt, chat: bool = True,
                  tools: Sequence[dict] | None = None) -> list[int]:
    """Text, messages, or token ids -> ids (module docstring)."""
    extra = {"tools": list(tools)} if tools else {}
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestError("this model has no tokenizer: pass token ids")
        if chat and tokenizer.has_chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], **extra)
        else:
            text = prompt
        return tokenizer.encode(text)
    items = list(prompt)
    if items and isinstance(items[0], dict):
        if tokenizer is None or not tokenizer.has_chat_template:
            raise RequestError("chat messages need a tokenizer with a chat template")
        return tokenizer.encode(tokenizer.apply_chat_template(items, **extra))
    return [int(t) for t in items]
