"""The FastAPI app of `eaglespec serve`: OpenAI's chat/completions, completions and models, with streaming.

Contract of `create_app(worker, model_name, default_temperature)`:
- `GET /v1/models`: the one served model; `GET /health`: 200 while the engine runs, 503 once it has stopped;
  `GET /metrics`: the worker's counters in Prometheus' text format (server/metrics.py).
- `POST /v1/chat/completions` (the chat template applied to `messages`) and `POST /v1/completions` (a raw text prompt
  or token ids): the whole answer as JSON, or with `"stream": true` server-sent events, one chunk per committed text
  delta, then a chunk with the finish reason, then (with `stream_options.include_usage`) a usage chunk, then
  `data: [DONE]`. A request without `temperature` samples at `default_temperature` (OpenAI's default is 1).
- Images come as `image_url` parts holding data: URLs, for a multimodal target.
- With `api_key` the /v1 routes answer 401 (OpenAI's body, code invalid_api_key) unless the request carries
  `Authorization: Bearer <api_key>`; /health and /metrics stay open, for probes and scrapers.
- Any user mistake answers HTTP 400 with OpenAI's error body and one sentence (a malformed body, a sampling value out
  of range, a prompt too long for the server's sequences, a feature this server does not have, an image for a
  text-only model); an unknown `model` 404; a stopped engine 503; the server keeps serving the other requests.
- A streaming client that disconnects has its request aborted (`Ticket.cancel`), so its row frees at the next step.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..errors import EaglespecError
from . import schemas
from .worker import EngineWorker, Ticket


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

    async def start(body: schemas.SampledRequest, prompt: Any, chat: bool, images: list) -> tuple[Ticket, int]:
        """Submit; wait until the worker accepts the request (its prompt tokens) or refuses it (an HTTPError)."""
        check_model(body.model)
        params = user_input(lambda: body.sampling(default_temperature))
        ticket = worker.submit(prompt, params, chat=chat, max_tokens=body.requested_tokens, stream=body.stream,
                               images=images)
        try:
            event = await ticket.events.get()
        except BaseException:  # the client went away before the worker took the request
            ticket.cancel()
            raise
        if event[0] == "error":
            raise HTTPError(event[2], event[1])
        return ticket, event[1]

    async def collect(ticket: Ticket) -> tuple[str, str, int, dict | None]:
        text = []
        try:
            while True:
                event = await ticket.events.get()
                if event[0] == "delta":
                    text.append(event[1])
                elif event[0] == "done":
                    return "".join(text), event[1], event[2], event[3]
                else:
                    raise HTTPError(event[2], event[1])
        except BaseException:  # the client went away (cancelled) or the engine failed
            ticket.cancel()
            raise

    def sse(ticket: Ticket, rid: str, obj: str, prompt_tokens: int, include_usage: bool,
            chunk: Callable[[str | None, str | None], dict], first: dict | None) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            finished = False
            try:
                if first is not None:
                    yield f"data: {json.dumps(first)}\n\n"
                behind = None  # an event taken while merging deltas, handled next
                while True:
                    event, behind = behind or await ticket.events.get(), None
                    if event[0] == "delta":
                        # the deltas queued behind this one go in the same chunk: a client read slower than the
                        # engine steps gets fewer, larger chunks instead of falling behind one chunk per step
                        text = [event[1]]
                        while not ticket.events.empty():
                            event = ticket.events.get_nowait()
                            if event[0] != "delta":
                                behind = event
                                break
                            text.append(event[1])
                        yield f"data: {json.dumps(chunk(''.join(text), None))}\n\n"
                    elif event[0] == "done":
                        finished = True
                        yield f"data: {json.dumps(chunk(None, event[1]))}\n\n"
                        if include_usage:
                            use = schemas.usage(prompt_tokens, event[2])
                            yield f"data: {json.dumps(schemas.usage_chunk(rid, obj, model_name, use))}\n\n"
                        break
                    else:  # the headers are sent: the error goes in the stream, as OpenAI's does
                        finished = True
                        kind = "server_error" if event[2] >= 500 else "invalid_request_error"
                        yield f"data: {json.dumps(schemas.error_body(event[1], kind))}\n\n"
                        break
                yield "data: [DONE]\n\n"
            finally:
                if not finished:  # the client disconnected mid-stream
                    ticket.cancel()

        return StreamingResponse(events(), media_type="text/event-stream")

    def user_input(parse: Callable[[], Any]) -> Any:
        try:
            return parse()
        except EaglespecError as e:
            raise HTTPError(400, str(e)) from None

    async def respond(body: schemas.SampledRequest, prompt: Any, chat: bool, images: list | None = None) -> Any:
        """One request of either endpoint: the whole answer, or its stream (`chat`: chat completion bodies)."""
        ticket, n_prompt = await start(body, prompt, chat, images or [])
        rid = schemas.new_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            def chunk(text: str | None, finish: str | None) -> dict:
                if chat:
                    return schemas.chat_chunk(rid, model_name, {} if text is None else {"content": text}, finish)
                return schemas.completion_chunk(rid, model_name, text or "", finish)
            first = schemas.chat_chunk(rid, model_name, {"role": "assistant", "content": ""}) if chat else None
            obj = "chat.completion.chunk" if chat else "text_completion"
            return sse(ticket, rid, obj, n_prompt, body.include_usage, chunk, first)
        text, finish, n_out, spec = await collect(ticket)
        build = schemas.chat_response if chat else schemas.completion_response
        return build(rid, model_name, text, finish, schemas.usage(n_prompt, n_out), spec)

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat_completions(body: schemas.ChatCompletionRequest) -> Any:
        messages, images = user_input(body.chat)
        return await respond(body, messages, chat=True, images=images)

    @app.post("/v1/completions", dependencies=v1)
    async def completions(body: schemas.CompletionRequest) -> Any:
        return await respond(body, user_input(body.text_or_ids), chat=False)

    return app
