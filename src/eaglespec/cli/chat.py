"""`eaglespec chat`: an interactive chat on the terminal, the chat template applied to the whole conversation.

Each line read from stdin is a user turn; the answer streams to stdout (a thinking model's reasoning to stderr, and
out of the history: answer_printer.py), a stats line (tok/s, acceptance length) to stderr. `/image PATH` attaches an image to the next message (a multimodal target such as Kimi-K2.5; the
conversation's images stay with their messages), `/reset` starts a new conversation, `/exit` (or end of input)
leaves. When the conversation outgrows the
model's context, the oldest turns are dropped (the system prompt stays) and stderr says how many; a single message
too long for the context is refused with one sentence and the chat goes on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .. import api
from ..engine.engine import Engine
from ..engine.gc_heap import freeze_heap
from ..errors import RequestError
from ..sampling_params import SamplingParams
from .answer_printer import AnswerPrinter
from .options import (add_model_options, add_sampling_options, answer_line, device_text, draft_arg, engine_config,
                      engine_summary, sampling_params, spec_config)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="an interactive chat (chat template applied)")
    add_model_options(p)
    add_sampling_options(p, max_new_tokens=512)
    p.add_argument("--system", default=None, help="a system prompt")


def flat_images(images: list[list] | None) -> list | None:
    """A conversation's images in prompt order (None: none)."""
    out = [im for per in images or [] for im in per]
    return out or None


def fit_history(engine: Engine, messages: list[dict], max_new_tokens: int,
                images: list[list] | None = None) -> tuple[int, tuple[list[int], object]]:
    """Drop the oldest exchanges (after a system prompt) until the prompt leaves `max_new_tokens` of the context, or
    only the last user message is left; returns how many messages were dropped and the prompt as `Engine.prepare`
    made it (ids, multimodal inputs), for `Engine.stream_prepared`. `images`: each message's images (a parallel
    list, dropped with its message; their expanded placeholders count). A last message that cannot fit even alone is
    `RequestError`."""
    limit = engine.context_len - engine.runner.headroom()
    first = 1 if messages and messages[0]["role"] == "system" else 0
    dropped = 0
    while True:
        prepared = engine.prepare(messages, True, flat_images(images))
        n = len(prepared[0])
        if n + max_new_tokens <= limit or len(messages) - first <= 1:
            break
        del messages[first: first + 2]  # the oldest user message and its answer
        if images is not None:
            del images[first: first + 2]
        dropped += 2
    if n >= limit:
        raise RequestError(f"this message makes a prompt of {n} tokens, but the model's context is {limit} tokens")
    return dropped, prepared


def answer(engine: Engine, prepared: tuple[list[int], object], params: SamplingParams) -> str:
    """Stream the answer to a prompt `fit_history` prepared to stdout (a thinking model's reasoning to stderr:
    answer_printer.py); returns its text without the reasoning, for the conversation's history."""
    t0 = time.perf_counter()
    printer = AnswerPrinter(engine.tokenizer, prepared[0], params)
    for delta in engine.stream_prepared(*prepared, printer.params):
        printer.write(delta)
    text = printer.finish()
    seconds = time.perf_counter() - t0
    sys.stdout.write("\n")
    sys.stdout.flush()
    req = engine.last_request
    n = len(req.output_ids)
    line = answer_line(n, seconds)
    if engine.speculative and req.stats.verify_steps:
        line += f", accept length {req.stats.accept_length_mean:.2f}"
    if req.reused:  # the conversation so far was in the cache already (prefix reuse: engine/scheduler.py)
        line += f", {req.reused} of {len(req.prompt_ids)} prompt tokens cached"
    print(line, file=sys.stderr)
    return text


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)  # validate before the (slow) model load
    engine = api.load(args.model, draft=draft_arg(args), spec=spec_config(args),
                      config=engine_config(args, max_batch_size=1), only=params)  # every turn's parameters alike
    if engine.tokenizer is None or not engine.tokenizer.has_chat_template:
        raise RequestError("this model's tokenizer has no chat template: use `eaglespec generate --no-chat-template`")
    freeze_heap()  # a session's garbage collections skip the model, the engine and the libraries (gc_heap.py)
    print(f"[eaglespec] chat on {device_text(engine)}, {engine_summary(engine, args)}; commands: /image PATH, /reset, "
          "/exit", file=sys.stderr)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages, images = list(system), [[] for _ in system]  # images: each message's, for a multimodal target
    pending: list = []  # images for the next message (/image PATH)
    while True:
        sys.stderr.write("> ")
        sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:  # end of input
            sys.stderr.write("\n")
            return 0
        text = line.rstrip("\n")
        command = text.strip()
        if command in ("/exit", "/quit"):
            return 0
        if command == "/reset":
            messages, images, pending = list(system), [[] for _ in system], []
            print("[eaglespec] a new conversation", file=sys.stderr)
            continue
        if command.startswith("/image"):
            path = command[len("/image"):].strip()
            if not path or not Path(path).is_file():
                print(f"eaglespec: error: /image needs an image file ({path or 'none given'} is not one)",
                      file=sys.stderr)
            else:
                pending.append(path)
                print(f"[eaglespec] {path} goes with the next message", file=sys.stderr)
            continue
        if not command:
            continue
        content: str | list[dict] = text
        if pending:  # the images first, where the template takes them, then the text
            content = [{"type": "image_url"} for _ in pending] + [{"type": "text", "text": text}]
        messages.append({"role": "user", "content": content})
        images.append(list(pending))
        try:
            dropped, prepared = fit_history(engine, messages, params.max_new_tokens, images)
        except RequestError as e:  # too long, or images for a model that takes none: this message is not sent
            messages.pop()
            images.pop()
            pending = []
            print(f"eaglespec: error: {e}", file=sys.stderr)
            continue
        pending = []
        if dropped:
            print(f"[eaglespec] dropped the oldest {dropped} messages to fit the model's context", file=sys.stderr)
        reply = answer(engine, prepared, params)
        messages.append({"role": "assistant", "content": reply})
        images.append([])
