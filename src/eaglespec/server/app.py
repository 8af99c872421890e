"""The FastAPI app of `eaglespec serve`: OpenAI's chat/completions, completions and models, with streaming.

Contract of `create_app(worker, model_name, default_temperature, api_key)`:
- `GET /v1/models`: the one served model; `GET /health`: 200 while the engine runs, 503 once it has stopped;
  `GET /metrics`: the worker's counters in Prometheus' text format (server/metrics.py).
- `POST /v1/chat/completions` (the chat template applied to `messages`) and `POST /v1/completions` (a raw text prompt
  or token ids): the whole answer as JSON, or with `"stream": true` server-sent events, one chunk per committed text
  delta, then a chunk with the finish reason, then (with `stream_options.include_usage`) a usage chunk, then
  `data: [DONE]`. The usage's `prompt_tokens_details.cached_tokens` counts the prompt tokens whose cache entries a
  row already held (engine/scheduler.py's prefix reuse: a conversation's next turn on an eager engine), not
  prefilled. A request without `temperature` samples at `default_temperature` (OpenAI's default is 1). `n`
  choices run as n requests of the worker: indexed choices, usage over all of them; streamed, a role chunk per
  choice (chat) and every chunk naming its choice's index, the usage chunk after the last choice finished. A
  completions request may carry a batch of prompts (strings or token id lists): n choices each, prompt p's choice j
  at index p * n + j, the usage's prompt tokens over every prompt. Log-probabilities, when asked for, come in each
  choice's (or chunk's) `logprobs` (schemas.py: `chat_logprobs`, `completion_logprobs`); a streamed completion's
  text offsets run on across its chunks. A completion with `echo` starts with its prompt, whose tokens lead its
  log-probabilities (scored by one forward: `Engine.score`); streamed, the prompt is the first chunk's text (with
  the first deltas when they are already queued). `max_tokens` 0 with `echo` scores the prompt only, as evaluation
  harnesses ask for log-likelihoods.
- Images come as `image_url` parts holding data: URLs, for a multimodal target.
- `tools` reach the chat template, and the answer is read for calls (tool_calls.py): `tool_choice` "required" or a
  named function holds it to the calls' JSON (a structured output), "auto" reads Hermes-style `<tool_call>` blocks
  out of a free answer; the message then has `tool_calls` (content null when there is none besides) and the finish
  reason "tool_calls". Streamed, content goes out as it comes (auto holds back a tail that may open a tag), a named
  function's arguments as they come, auto's calls each whole once its block closes, "required"'s in the last chunk.
- A thinking model (its tokenizer holds `<think>` and `</think>` as special tokens: reasoning.py) has its chat
  answers decoded with their special tokens and split: the `<think>` blocks (from the start, when the prompt ended
  inside one) as the message's (or delta's) `reasoning_content`, unless `include_reasoning` is false, the rest as
  the content (read for tool calls first), both cleaned of special tokens; the usage counts the blocks' tokens as
  `completion_tokens_details.reasoning_tokens`. `skip_special_tokens: false` and answers held to a structured
  output are not split.
- `POST /tokenize` (vLLM's): a text `prompt` as /v1/completions encodes it, or `messages` as /v1/chat/completions
  does -> {count, max_model_len (the positions a sequence may hold), tokens}; `POST /detokenize`: {tokens} ->
  {prompt} (special tokens kept). Both on the HTTP thread, beside the engine's loop.
- With `api_key` the /v1 routes answer 401 (OpenAI's body, code invalid_api_key) unless the request carries
  `Authorization: Bearer <api_key>`; /health and /metrics stay open, for probes and scrapers.
- Any user mistake answers HTTP 400 with OpenAI's error body and one sentence (a malformed body, a sampling value out
  of range, a prompt too long for the server's sequences, a feature this server does not have, an image for a
  text-only model); an unknown `model` 404; a stopped engine 503; the server keeps serving the other requests.
- A client that disconnects has its request's choices aborted (`Ticket.cancel`), so their rows free at the next
  step; a choice that fails aborts the others.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
from dataclasses import replace
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..engine.prompts import encode_prompt
from ..errors import EaglespecError
from ..sampling_params import SamplingParams
from . import schemas
from .reasoning import ReasoningStream, reasoning_syntax
from .tool_calls import HERMES, ToolPlan, ToolStream, tool_syntax
from .worker import EngineWorker, Ticket

def _choice(params: SamplingParams, j: int) -> SamplingParams:
    """Choice j's parameters: a seeded request's choices draw from seed, seed + 1, ... (the same seed would give n
    copies of one answer)."""
    return params if params.seed is None or j == 0 else replace(params, seed=(params.seed + j) % (1 << 63))


def cached_per_prompt(cached: list[int], n: int) -> int:
    """The usage's cached prompt tokens from each choice's (n choices per prompt, in order), counted once per prompt
    as its prompt tokens are: the fewest any of its choices reused."""
    return sum(min(cached[p : p + n]) for p in range(0, len(cached), n))


# a choice's events that carry text and log-probability entries: an echoed prompt ("prompt") first, then "delta"s
TEXT_EVENTS = ("delta", "prompt")


class _Indexed:
    """A choice's event queue read as (index 0, event), the shape `sse` reads several choices' merged queue in."""

    def __init__(self, events: asyncio.Queue) -> None:
        self.events = events

    async def get(self) -> tuple[int, tuple]:
        return 0, await self.events.get()

    def get_nowait(self) -> tuple[int, tuple]:
        return 0, self.events.get_nowait()

    def empty(self) -> bool:
        return self.events.empty()


class HTTPError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def create_app(worker: EngineWorker, model_name: str, default_temperature: float = 1.0,
               api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="eaglespec", description="EAGLE-3 speculative decoding, OpenAI-compatible")

    async def authorized(authorization: str | None = Header(default=None)) -> None:
        """With `api_key`, the /v1 routes take `Authorization: Bearer <api_key>` only (compared in constant time)."""
        if api_key is None:
            return
        given = authorization[len("Bearer "):] if authorization and authorization.startswith("Bearer ") else ""
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise HTTPError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' with "
                                 "the key this server was started with (--api-key)", "invalid_api_key")

    v1 = [Depends(authorized)]

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        worker.metrics.rejected(exc.status)  # every refusal comes here (the worker's too, raised by `start`)
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        return JSONResponse(schemas.error_body(exc.message, kind, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        worker.metrics.rejected(400)
        return JSONResponse(schemas.error_body(_validation_message(exc)), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        if worker.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "stopped", "error": worker.failure}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = worker.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models", dependencies=v1)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "eaglespec"}]}

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise HTTPError(404, f"the model {name!r} does not exist: this server serves {model_name!r}",
                            "model_not_found")

    async def start(body: schemas.SampledRequest, prompts: list[Any], chat: bool, images: list,
                    plan: ToolPlan | None = None) -> tuple[list[Ticket], int, bool]:
        """Submit the request's n choices of each prompt (each a request of the engine), in index order; wait until
        the worker accepts them (their prompts' tokens, summed over the prompts) or refuses one (an HTTPError, the
        others cancelled). `plan`: the request's tools (their definitions to the chat template; answers whose
        calls are special tokens decoded with them, `ToolPlan.decodes_special`). The last value: whether the
        answers' reasoning is read apart (a thinking model's chat answer, free, its special tokens not asked for:
        decoded with them, for the markers)."""
        check_model(body.model)
        params = user_input(lambda: body.sampling(default_temperature))
        reads = chat and thinking is not None and params.skip_special_tokens and params.structured is None
        if (plan is not None and plan.decodes_special) or reads:
            params = replace(params, skip_special_tokens=False)
        tools = plan.tools if plan is not None else None
        echo = bool(getattr(body, "echo", False))  # completions only
        n = len(prompts) * body.n
        grammars = [None] * n
        if params.structured is not None:  # compiled here, off the engine's loop (a complex schema takes up to ~1 s)
            loop = asyncio.get_running_loop()
            compile_one = functools.partial(worker.engine.compile_grammar, params)
            try:
                grammars = await asyncio.gather(*(loop.run_in_executor(None, compile_one) for _ in range(n)))
            except EaglespecError as e:
                raise HTTPError(400, str(e)) from None
        tickets = [worker.submit(prompt, _choice(params, j), chat=chat, max_tokens=body.requested_tokens,
                                 stream=body.stream, images=images, echo=echo, tools=tools,
                                 grammar=grammars[p * body.n + j])
                   for p, prompt in enumerate(prompts) for j in range(body.n)]
        try:
            events = [await t.events.get() for t in tickets]
        except BaseException:  # the client went away before the worker took the request
            cancel(tickets)
            raise
        for event in events:
            if event[0] == "error":
                cancel(tickets)
                raise HTTPError(event[2], event[1])
        return tickets, sum(e[1] for e in events[::body.n]), reads  # each prompt's tokens once, whatever n

    def cancel(tickets: list[Ticket]) -> None:
        for t in tickets:
            t.cancel()

    async def collect(ticket: Ticket) -> tuple[str, str, int, Any, list, int, list[int]]:
        """A choice's (text, finish reason, completion tokens, speculative statistics, logprob entries, cached prompt
        tokens, output token ids)."""
        text: list[str] = []
        entries: list = []
        while True:
            event = await ticket.events.get()
            if event[0] in TEXT_EVENTS:  # an echoed prompt comes first: its text and entries lead
                text.append(event[1])
                entries += event[2]
            elif event[0] == "done":
                return "".join(text), event[1], event[2], event[3], entries, event[4], event[5]
            else:
                raise HTTPError(event[2], event[1])

    async def collect_all(tickets: list[Ticket]) -> list[tuple[str, str, int, Any, list, int, list[int]]]:
        try:
            return list(await asyncio.gather(*(collect(t) for t in tickets)))
        except BaseException:  # the client went away (cancelled) or the engine failed: no choice runs on
            cancel(tickets)
            raise

    def merged_events(tickets: list[Ticket]) -> tuple[Any, list[asyncio.Task]]:
        """One queue of (choice index, event) over the tickets' queues: the ticket's own, wrapped, for one choice;
        for several, one forwarding task each (returned, to be cancelled with the stream)."""
        if len(tickets) == 1:
            return _Indexed(tickets[0].events), []
        merged: asyncio.Queue = asyncio.Queue()

        async def forward(i: int, t: Ticket) -> None:
            while True:
                event = await t.events.get()
                merged.put_nowait((i, event))
                if event[0] not in TEXT_EVENTS:
                    return

        return merged, [asyncio.create_task(forward(i, t)) for i, t in enumerate(tickets)]

    def sse(tickets: list[Ticket], rid: str, obj: str, prompt_tokens: int, include_usage: bool,
            chunk: Callable[[int, str | None, str | None, list], dict], first: Callable[[int], dict] | None,
            n: int = 1, reasoning: Callable[[int, list[int]], int] | None = None) -> StreamingResponse:
        """`reasoning(i, output ids)`: choice i's reasoning tokens, for the usage (None: not counted)."""
        async def events() -> AsyncIterator[str]:
            source, tasks = merged_events(tickets)
            finished, done, completion_tokens = False, 0, 0
            cached, thought = [0] * len(tickets), 0
            try:
                if first is not None:
                    for i in range(len(tickets)):
                        yield f"data: {json.dumps(first(i))}\n\n"
                behind = None  # an event taken while merging deltas, handled next
                while True:
                    (i, event), behind = behind or await source.get(), None
                    if event[0] in TEXT_EVENTS:
                        # the deltas of this choice queued behind this one go in the same chunk: a client read
                        # slower than the engine steps gets fewer, larger chunks instead of falling behind
                        text, entries = [event[1]], list(event[2])
                        while not source.empty():
                            j, event = nxt = source.get_nowait()
                            if j != i or event[0] not in TEXT_EVENTS:
                                behind = nxt
                                break
                            text.append(event[1])
                            entries += event[2]
                        yield f"data: {json.dumps(chunk(i, ''.join(text), None, entries))}\n\n"
                    elif event[0] == "done":
                        yield f"data: {json.dumps(chunk(i, None, event[1], []))}\n\n"
                        done, completion_tokens = done + 1, completion_tokens + event[2]
                        cached[i] = event[4]
                        thought += reasoning(i, event[5]) if reasoning is not None else 0
                        if done == len(tickets):
                            finished = True
                            if include_usage:
                                use = schemas.usage(prompt_tokens, completion_tokens, cached_per_prompt(cached, n),
                                                    thought if reasoning is not None else None)
                                yield f"data: {json.dumps(schemas.usage_chunk(rid, obj, model_name, use))}\n\n"
                            break
                    else:  # the headers are sent: the error goes in the stream, as OpenAI's does
                        kind = "server_error" if event[2] >= 500 else "invalid_request_error"
                        yield f"data: {json.dumps(schemas.error_body(event[1], kind))}\n\n"
                        break
                yield "data: [DONE]\n\n"
            finally:
                for task in tasks:
                    task.cancel()
                if not finished:  # the client disconnected mid-stream, or a choice failed: none runs on
                    cancel(tickets)

        return StreamingResponse(events(), media_type="text/event-stream")

    def user_input(parse: Callable[[], Any]) -> Any:
        try:
            return parse()
        except EaglespecError as e:
            raise HTTPError(400, str(e)) from None

    tokenizer = worker.tokenizer
    # how "auto" tools read calls out of answers: Kimi-K2's special-token markers, or Hermes' tags
    syntax = tool_syntax(tokenizer.special_texts()) if tokenizer is not None else HERMES
    # a thinking model's `<think>` blocks, read apart from its chat answers (reasoning.py); None for other models
    thinking = reasoning_syntax(tokenizer.special_texts()) if tokenizer is not None else None

    @functools.lru_cache(maxsize=1 << 16)
    def token_text(i: int) -> str:
        """A token's own text, as log-probabilities name it (its id, for a model without a tokenizer)."""
        return tokenizer.decode([i], skip_special_tokens=False) if tokenizer is not None else str(i)

    async def respond(body: schemas.SampledRequest, prompts: list[Any], chat: bool,
                      images: list | None = None, plan: ToolPlan | None = None) -> Any:
        """One request of either endpoint: the whole answer, or its stream (`chat`: chat completion bodies), with
        n choices of each prompt (chat: one prompt, its messages; `plan`: its tools, server/tool_calls.py)."""
        tickets, n_prompt, reads = await start(body, prompts, chat, images or [], plan)
        rid = schemas.new_id("chatcmpl" if chat else "cmpl")
        wants_lp = bool(body.logprobs) if chat else body.logprobs is not None  # type: ignore[attr-defined]
        # a thinking model's answers: each choice's split (its prompt may have opened a block), and whether the
        # reasoning goes out (vLLM's include_reasoning) or is dropped
        think = thinking if reads else None
        inside = [think.opened(t.prompt_ids or (), tokenizer.token_to_id) for t in tickets] if think else []
        shows = bool(getattr(body, "include_reasoning", True))

        def thought(i: int, ids: list[int]) -> int:
            """Choice i's reasoning tokens (its answer read apart: `think`)."""
            assert think is not None
            return think.tokens(ids, inside[i], tokenizer.token_to_id)

        def lp_body(entries: list, offset: int = 0) -> dict | None:
            if not wants_lp:
                return None
            if chat:
                return schemas.chat_logprobs(entries, token_text)
            return schemas.completion_logprobs(entries, token_text, offset)

        if body.stream:
            offsets = [0] * len(tickets)  # a streamed completion's text offsets run on across its chunks
            readers = [plan.stream() for _ in tickets] if plan is not None else None  # with tools: each choice's

            splits = [think.stream(inside[i]) for i in range(len(tickets))] if think else None

            def chunk(i: int, text: str | None, finish: str | None, entries: list) -> dict:
                lp = lp_body(entries, offsets[i]) if entries else None
                if lp is not None and not chat:
                    offsets[i] += sum(len(t) for t in lp["tokens"])
                if splits is not None:
                    return reasoning_chunk(splits[i], i, text, finish, lp)
                if chat and readers is not None:
                    return tool_chunk(readers[i], i, text, finish, lp)
                if chat:
                    return schemas.chat_chunk(rid, model_name, {} if text is None else {"content": text}, finish, i,
                                              lp)
                return schemas.completion_chunk(rid, model_name, text or "", finish, i, lp)

            def tool_chunk(reader: ToolStream, i: int, text: str | None, finish: str | None, lp: dict | None) -> dict:
                """A chunk of a choice read for tools (tool_calls.ToolStream): the content, or a named call's
                arguments, that may go now; at the end what was held back, and the calls not sent yet."""
                if finish is None:
                    return schemas.chat_chunk(rid, model_name, reader.feed(text or ""), None, i, lp)
                delta, finish = reader.finish(finish)
                return schemas.chat_chunk(rid, model_name, delta, finish, i, lp)

            def reasoning_chunk(split: ReasoningStream, i: int, text: str | None, finish: str | None,
                                lp: dict | None) -> dict:
                """A chunk of a thinking model's choice: the reasoning that may go now as `reasoning_content`, the
                rest as content (through the tool reader, with tools), cleaned of special tokens; at the end what
                either held back."""
                assert think is not None
                reasoning, rest = split.feed(text or "") if finish is None else split.finish()
                if readers is None:
                    delta = {"content": rest} if rest else {}
                elif finish is None:
                    delta = readers[i].feed(rest)
                else:
                    delta, finish = readers[i].finish(finish, tail=rest)
                if "content" in delta:
                    delta["content"] = think.clean(delta["content"])
                    if not delta["content"]:
                        del delta["content"]
                if reasoning and shows:
                    delta = {"reasoning_content": reasoning, **delta}
                return schemas.chat_chunk(rid, model_name, delta, finish, i, lp)

            def first(i: int) -> dict:
                return schemas.chat_chunk(rid, model_name, {"role": "assistant", "content": ""}, index=i)

            obj = "chat.completion.chunk" if chat else "text_completion"
            return sse(tickets, rid, obj, n_prompt, body.include_usage, chunk, first if chat else None, body.n,
                       thought if think else None)
        results = await collect_all(tickets)
        use = schemas.usage(n_prompt, sum(r[2] for r in results), cached_per_prompt([r[5] for r in results], body.n),
                            sum(thought(i, r[6]) for i, r in enumerate(results)) if think else None)
        spec = schemas.spec_summary([r[3] for r in results])
        choices = [(r[0], r[1], lp_body(r[4])) for r in results]
        if chat and think is not None:  # each answer's reasoning read apart, its rest the message
            split = [think.split(text, inside[i]) for i, (text, _, _) in enumerate(choices)]
            choices = [(rest, finish, lp) for (_, rest), (_, finish, lp) in zip(split, choices)]
            reasoning = [r if shows else None for r, _ in split]
            return schemas.chat_response(rid, model_name, choices, use, spec, plan, reasoning, think.clean)
        if chat:
            return schemas.chat_response(rid, model_name, choices, use, spec, plan)
        return schemas.completion_response(rid, model_name, choices, use, spec)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat_completions(body: schemas.ChatCompletionRequest) -> Any:
        messages, images = user_input(body.chat)
        return await respond(body, [messages], chat=True, images=images,
                             plan=user_input(lambda: body.tool_plan(syntax)))

    @app.post("/v1/completions", dependencies=v1)
    async def completions(body: schemas.CompletionRequest) -> Any:
        return await respond(body, user_input(body.prompts), chat=False)

    @app.post("/tokenize", dependencies=v1)
    async def tokenize(body: schemas.TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        prompt, chat = user_input(body.to_prompt)
        ids = user_input(lambda: encode_prompt(tokenizer, prompt, chat, body.tools if chat else None))
        eng = worker.engine  # the positions a sequence may hold: the worker's reserve, less the drafts' headroom
        limit = min(worker.max_len, eng.context_len - eng.runner.headroom())
        return {"count": len(ids), "max_model_len": limit, "tokens": ids}

    @app.post("/detokenize", dependencies=v1)
    async def detokenize(body: schemas.DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        if tokenizer is None:
            raise HTTPError(400, "this model has no tokenizer")
        V = worker.engine.target_config.vocab_size
        outside = sorted({t for t in body.tokens if not 0 <= t < V})
        if outside:
            raise HTTPError(400, f"token ids {outside} are outside the model's vocabulary of {V} tokens")
        return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)}

    return app
