"""The OpenAI-compatible request bodies `eaglespec serve` accepts, and the response bodies it returns.

Contract: `ChatCompletionRequest` / `CompletionRequest` parse a request body (unknown fields are ignored, as OpenAI's
clients send many); `.sampling(default_temperature)` turns one into `SamplingParams` (max_tokens None: the server
picks the room left in its cache) and raises `RequestError` with one sentence for what this server does not do
(more than MAX_N choices, or MAX_CHOICES over a completion's prompts, the deprecated functions, OpenAI's predicted
outputs, vLLM's beam search, bad_words,
prompt_logprobs, truncate_prompt_tokens, suffix, best_of other than n, images other
than data: URLs),
rather than ignoring it. A sampled request's `seed` becomes its own random stream (`SamplingParams.seed`); a greedy
request's changes nothing. OpenAI's `frequency_penalty`, `presence_penalty` and `logit_bias` (token id strings to
biases), and vLLM's `repetition_penalty`, `min_p`, `min_tokens`, `stop_token_ids` and `allowed_token_ids`, adjust
the logits (layers/logit_adjust.py); out-of-range values are refused with SamplingParams' sentence. A structured
output (OpenAI's `response_format` json_object / json_schema, vLLM's `guided_*` and `structured_outputs`, SGLang's
`json_schema`, `regex` and `ebnf`: structured_fields.py) holds the answer to its grammar. Images
(`image_url` parts) reach the target as decoded PIL images in message order; a target that takes none refuses them
(`Engine.prepare`).
The `*_response` / `*_chunk` helpers build the JSON bodies (`id`, `object`, `created`, `model`, `choices`, `usage`),
with the speculative statistics (of all choices, merged) under the extra key `eaglespec` where there were
speculative steps. Log-probabilities (chat: `logprobs: true` and `top_logprobs` k; completions: `logprobs` k) are
the target's raw ones (before temperature, top-k, top-p), in OpenAI's two layouts (`chat_logprobs`,
`completion_logprobs`); a token's text is its own decoding, and its bytes that text's UTF-8.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict

from ..errors import RequestError
from ..sampling_params import SamplingParams
from .structured_fields import structured_output
from .tool_calls import HERMES, ToolPlan, ToolSyntax, plan_tools

Stop = Union[str, list[str], None]
MAX_N = 64  # choices per prompt: each is a request of its own in the engine's queue
MAX_CHOICES = 1024  # choices of one completions request over all its prompts (prompts x n)
STRUCTURED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                     "structured_outputs", "json_schema", "regex", "ebnf")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ImageURL(_Body):
    url: str


class ContentPart(_Body):
    type: str
    text: str | None = None
    image_url: ImageURL | None = None


def decode_image(url: str) -> Any:
    """A `data:image/...;base64,...` URL -> an RGB PIL image (the server fetches nothing from the network)."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    head, sep, data = url.partition(",")
    if not (head.startswith("data:image/") and head.endswith(";base64") and sep):
        raise RequestError("an image_url must be a data: URL with base64 data (data:image/png;base64,...); this "
                           "server fetches nothing")
    try:
        return Image.open(io.BytesIO(base64.b64decode(data, validate=True))).convert("RGB")
    except (binascii.Error, UnidentifiedImageError, OSError) as e:
        raise RequestError(f"an image_url's data could not be read as an image ({e})") from None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    # a conversation's earlier tool calls and their results, for the chat template as the client sent them
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None  # an earlier answer's reasoning (server/reasoning.py), as the client kept it

    def parts(self, images: list) -> str | list[dict]:
        """The content for the chat template: text, or (with images, appended to `images` in order) OpenAI-style
        parts, which a multimodal target turns into its image placeholders where they stand."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        kinds = sorted({p.type for p in self.content if p.type not in ("text", "image_url")})
        if kinds:
            raise RequestError(f"message content of type {', '.join(kinds)} is not supported by this server "
                               "(text and image_url only)")
        if not any(p.type == "image_url" for p in self.content):
            return "".join(p.text or "" for p in self.content)
        out: list[dict] = []
        for p in self.content:
            if p.type == "text":
                out.append({"type": "text", "text": p.text or ""})
            else:
                if p.image_url is None:
                    raise RequestError("an image_url part needs its image_url.url")
                images.append(decode_image(p.image_url.url))
                out.append({"type": "image_url"})
        return out


def template_messages(messages: list[ChatMessage]) -> tuple[list[dict[str, Any]], list]:
    """The messages for the chat template ("developer" is the newer name of "system") and their images, in order
    (decoded from data: URLs; empty for text). A conversation's tool calls, tool results and reasoning pass through
    as the client sent them (a thinking model's template may render earlier reasoning: Kimi-K2.5's interleaves it
    with tool calls)."""
    if not messages:
        raise RequestError("messages must not be empty")
    images: list = []
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.parts(images)}
        msg.update({k: v for k in ("tool_calls", "tool_call_id", "name", "reasoning_content")
                    if (v := getattr(m, k)) is not None})
        out.append(msg)
    return out, images


class StreamOptions(_Body):
    include_usage: bool = False


class SampledRequest(_Body):
    """The fields both endpoints share."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # an extension (vLLM, SGLang): 0 or -1 = off
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (a string, as JSON keys are) -> bias in [-100, 100]
    ignore_eos: bool = False  # extensions (vLLM, SGLang):
    repetition_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    # other vLLM fields this server does not do: refused when set away from their defaults, not ignored
    use_beam_search: bool = False
    length_penalty: float = 1.0
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True  # vLLM's: false keeps special tokens in the text (SamplingParams)
    # structured outputs (structured_fields.py): OpenAI's (also on completions, as vLLM takes it), vLLM's, SGLang's
    response_format: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None

    def _checks(self) -> None:
        if not 1 <= self.n <= MAX_N:
            raise RequestError(f"n must be between 1 and {MAX_N} (got {self.n})")
        refused = {"use_beam_search": self.use_beam_search, "length_penalty": self.length_penalty != 1,
                   "bad_words": bool(self.bad_words), "truncate_prompt_tokens": self.truncate_prompt_tokens is not None,
                   "prompt_logprobs": self.prompt_logprobs is not None}
        for name, asked in refused.items():
            if asked:
                hint = " (completions: echo with logprobs scores the prompt)" if name == "prompt_logprobs" else ""
                raise RequestError(f"{name} is not supported by this server{hint}")

    def _logit_bias(self) -> dict[int, float]:
        out = {}
        for key, bias in (self.logit_bias or {}).items():
            try:
                out[int(key)] = bias
            except ValueError:
                raise RequestError(f"logit_bias keys must be token ids (got {key!r})") from None
        return out

    def _params(self, max_tokens: int | None, default_temperature: float,
                logprobs: int | None = None) -> SamplingParams:
        self._checks()
        if max_tokens is not None and max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1 (got {max_tokens})")
        temperature = default_temperature if self.temperature is None else self.temperature
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        top_k = self.top_k if self.top_k is not None and self.top_k > 0 else 0
        return SamplingParams(
            # the server replaces it when the request gave none (`max_tokens`)
            max_new_tokens=max_tokens or max(1, self.min_tokens),
            temperature=temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=top_k, stop=stop, ignore_eos=self.ignore_eos,
            logprobs=logprobs, seed=self.seed if temperature > 0 else None,  # a greedy request has nothing to seed
            frequency_penalty=self.frequency_penalty or 0.0, presence_penalty=self.presence_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=self._logit_bias(), min_p=self.min_p or 0.0, min_tokens=self.min_tokens,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            allowed_token_ids=tuple(self.allowed_token_ids) if self.allowed_token_ids is not None else None,
            structured=structured_output({name: getattr(self, name) for name in STRUCTURED_FIELDS}))

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SampledRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    include_reasoning: bool = True  # vLLM's: a thinking model's reasoning_content comes back (server/reasoning.py)
    tools: list[Any] | None = None  # OpenAI's tool definitions (tool_calls.py)
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    functions: list[Any] | None = None  # the older name of tools: refused, pointing to tools
    function_call: Any = None
    prediction: dict[str, Any] | None = None  # OpenAI's predicted outputs: refused, not ignored

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def tool_plan(self, syntax: ToolSyntax = HERMES) -> ToolPlan | None:
        """How the answer is read for tools (tool_calls.py; `syntax`: how the model writes calls), or None without
        tools."""
        if self.functions or self.function_call is not None:
            raise RequestError("functions and function_call are the deprecated forms of tools and tool_choice: send "
                               "those")
        if not self.skip_special_tokens:  # the client asked for them: the content keeps them
            syntax = replace(syntax, special=())
        return plan_tools(self.tools, self.tool_choice, self.parallel_tool_calls, syntax)

    def sampling(self, default_temperature: float) -> SamplingParams:
        plan = self.tool_plan()
        if self.prediction:
            raise RequestError("prediction (predicted outputs) is not supported by this server")
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true")
        params = self._params(self.requested_tokens, default_temperature,
                              (self.top_logprobs or 0) if self.logprobs else None)
        if plan is not None and plan.structured is not None:  # required / named: the answer is held to the calls
            if params.structured is not None:
                raise RequestError(f"tool_choice {plan.mode} cannot be combined with a structured output (both "
                                   "decide the answer's shape)")
            params = replace(params, structured=plan.structured)
        return params

    def chat(self) -> tuple[list[dict[str, Any]], list]:
        return template_messages(self.messages)


class CompletionRequest(SampledRequest):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    @property
    def requested_tokens(self) -> int | None:
        return self.max_tokens

    def sampling(self, default_temperature: float) -> SamplingParams:
        if self.suffix:
            raise RequestError("suffix is not supported by this server")
        if self.best_of not in (None, self.n):
            raise RequestError(f"best_of={self.best_of}: this server does not rank choices (it returns n of n)")
        # max_tokens 0 with echo: the prompt scored, nothing generated (the worker ends the request after its score)
        scoring = self.echo and self.max_tokens == 0
        return self._params(None if scoring else self.max_tokens, default_temperature, self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts, each a text or token ids: one (a string, or a list of ids) or a batch (a list of
        strings, or of id lists), whose choices come prompt by prompt (prompt p's choice j has index p * n + j)."""
        p = self.prompt
        batch: list[str | list[int]]
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            batch = list(p)
        else:
            batch = [p]  # type: ignore[list-item]
        if not batch or any(len(x) == 0 for x in batch):
            raise RequestError("the prompt is empty" if len(batch) <= 1 else "a prompt in the batch is empty")
        if len(batch) * self.n > MAX_CHOICES:
            raise RequestError(f"{len(batch)} prompts x n={self.n} make {len(batch) * self.n} choices: this server "
                               f"takes at most {MAX_CHOICES} per request")
        return batch


class TokenizeRequest(_Body):
    """vLLM's `POST /tokenize`: a text prompt (as /v1/completions encodes it) or chat messages (as /v1/chat/completions
    does: the chat template with the generation prompt, and `tools` as the chat template renders them), exactly one
    of them; text only."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Any] | None = None

    def to_prompt(self) -> tuple[Any, bool]:
        """(the prompt for `encode_prompt`, whether it is a chat)."""
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("tokenize takes either a prompt or messages")
        if self.messages is None:
            return self.prompt, False
        messages, images = template_messages(self.messages)
        if images:
            raise RequestError("tokenize takes text messages only (no images)")
        return messages, True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


# --- responses -------------------------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
          reasoning_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens`: prompt tokens whose cache entries were reused (prefix
    reuse, engine/scheduler.py), not prefilled; `completion_tokens_details.reasoning_tokens` (a thinking model's
    chat answers, read apart: server/reasoning.py): the completion tokens spent reasoning."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def _envelope(rid: str, obj: str, model: str, choices: list[dict], **extra: Any) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": choices, **extra}


def chat_response(rid: str, model: str, choices: list[tuple[str, str, dict | None]], use: dict,
                  spec: dict | None, plan: ToolPlan | None = None, reasoning: list[str | None] | None = None,
                  clean: Callable[[str], str] | None = None) -> dict:
    """`choices`: (text, finish_reason, logprobs body or None) per choice, in index order; with tools, each answer
    read by the plan (its content, tool_calls and finish reason). `reasoning`: each choice's `reasoning_content`
    (None: none); `clean`: what the content is cleaned with (a thinking model's answer, decoded with its special
    tokens: server/reasoning.py)."""
    out = []
    for i, (text, finish, lp) in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning is not None and reasoning[i] is not None:
            message["reasoning_content"] = reasoning[i]
        if plan is not None:
            message["content"], calls, finish = plan.message(text, finish)
            if calls:
                message["tool_calls"] = calls
        if clean is not None and message["content"] is not None:
            message["content"] = clean(message["content"])
        out.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
    return _envelope(rid, "chat.completion", model, out, usage=use, **({"eaglespec": spec} if spec else {}))


def chat_chunk(rid: str, model: str, delta: dict, finish_reason: str | None = None, index: int = 0,
               logprobs: dict | None = None) -> dict:
    return _envelope(rid, "chat.completion.chunk", model,
                     [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}])


def completion_response(rid: str, model: str, choices: list[tuple[str, str, dict | None]], use: dict,
                        spec: dict | None) -> dict:
    """`choices`: (text, finish_reason, logprobs body or None) per choice, in index order."""
    out = [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
           for i, (text, finish, lp) in enumerate(choices)]
    return _envelope(rid, "text_completion", model, out, usage=use, **({"eaglespec": spec} if spec else {}))


def completion_chunk(rid: str, model: str, text: str, finish_reason: str | None = None, index: int = 0,
                     logprobs: dict | None = None) -> dict:
    return _envelope(rid, "text_completion", model,
                     [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}])


def _token_entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: list, token_text: Callable[[int], str]) -> dict:
    """`entries` (`TokenLogprob`s) -> a chat choice's `logprobs`: {"content": [{token, logprob, bytes,
    top_logprobs: [{token, logprob, bytes}]}]}."""
    return {"content": [{**_token_entry(token_text(e.token), e.logprob),
                         "top_logprobs": [_token_entry(token_text(i), lp) for i, lp in e.top]} for e in entries]}


def completion_logprobs(entries: list, token_text: Callable[[int], str], offset: int = 0) -> dict:
    """`entries` -> a completion choice's `logprobs`: {tokens, token_logprobs, top_logprobs ([{text: logprob}] per
    token), text_offset (each token's start in the text, counting from `offset`: a stream's earlier chunks)}; an
    echoed prompt's first token has null log-probability and alternatives, as OpenAI's."""
    texts = [token_text(e.token) for e in entries]
    starts = []
    for t in texts:
        starts.append(offset)
        offset += len(t)
    return {"tokens": texts, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else {token_text(i): lp for i, lp in e.top} for e in entries],
            "text_offset": starts}


def spec_summary(stats: list) -> dict | None:
    """The speculative statistics of a request's choices (`SpecStats` or None each), merged, as the `eaglespec` key."""
    from ..spec.stats import SpecStats

    merged = SpecStats()
    for s in stats:
        if s is not None:
            merged.merge(s)
    return merged.to_dict() if merged.verify_steps else None


def usage_chunk(rid: str, obj: str, model: str, use: dict) -> dict:
    return _envelope(rid, obj, model, [], usage=use)


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
