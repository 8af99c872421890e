"""server/reasoning.py: a thinking model's `<think>` blocks read apart from its chat answers as `reasoning_content`,
whole and streamed, alone and with Kimi-K2's tool calls; the server decodes such answers with their special tokens
and cleans the content of them."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from test_kimi_tokenizer import KIMI_TEMPLATE, write_tiny_tokenizer
from test_server import sse_events
from test_tool_calls import KIMI_SPECIAL, WEATHER

from eaglespec.server.app import create_app
from eaglespec.server.metrics import ServerMetrics
from eaglespec.server.reasoning import ReasoningSyntax, reasoning_syntax

THINK = ReasoningSyntax(KIMI_SPECIAL)


@pytest.mark.parametrize("text,inside,want", [
    ("<think>The user wants weather.</think>It is sunny.", False, ("The user wants weather.", "It is sunny.")),
    ("The user wants weather.</think>It is sunny.", True, ("The user wants weather.", "It is sunny.")),
    ("It is sunny.", False, (None, "It is sunny.")),
    ("Still thinking", True, ("Still thinking", "")),  # cut (max_tokens) inside the block: all reasoning
    ("<think>a<|im_end|>b</think>c<|im_end|>", False, ("ab", "c<|im_end|>")),  # the rest keeps its special tokens
    ("<think>a</think>b<think>c</think>d", False, ("ac", "bd")),
    ("x</think>y", False, (None, "x</think>y")),  # a close without an open, outside: not reasoning
])
def test_split(text, inside, want):
    assert THINK.split(text, inside) == want
    assert THINK.clean(THINK.split(text, inside)[1]) == THINK.clean(want[1])


@pytest.mark.parametrize("text,inside", [
    ("<think>The user wants weather.</think>It is sunny.", False), ("wants</think>sunny<|im_end|>", True),
    ("<think>a</think>b<think>c</think>d", False), ("no markers <thin at all", False)])
def test_streamed_pieces_join_to_the_split_and_never_show_a_marker_in_part(text, inside):
    for step in (1, 2, 3, 7):
        stream = THINK.stream(inside)
        reasoning, rest = "", ""
        for k in range(0, len(text), step):
            r, c = stream.feed(text[k:k + step])
            for piece in (r, c):  # nothing that a later delta could turn into a marker goes out early
                assert not any(piece.endswith(m[:n]) for m in ("<think>", "</think>", *KIMI_SPECIAL)
                               for n in range(1, len(m))) or text.endswith("<thin at all")
            reasoning, rest = reasoning + r, rest + c
        r, c = stream.finish()
        want = THINK.split(text, inside)
        assert (reasoning + r, rest + c) == ((want[0] or ""), want[1])


def test_the_prompt_may_open_the_block_and_the_syntax_comes_from_the_tokenizer(tmp_path):
    ids = {"<think>": 22, "</think>": 23}
    assert THINK.opened([1, 2, 22], ids.get) and THINK.opened([22, 23, 5, 22, 7], ids.get)
    assert not THINK.opened([1, 22, 23], ids.get) and not THINK.opened([1, 2], ids.get)
    tok = write_tiny_tokenizer(tmp_path / "kimi")
    assert reasoning_syntax(tok.special_texts()) is not None
    assert reasoning_syntax(("<|im_end|>", "<think>")) is None and reasoning_syntax(()) is None


class ScriptedWorker:
    """Every request answered with the same deltas (decoded with special tokens, as the server asks of a thinking
    model); records the parameters it was given."""
    alive = True
    metrics = ServerMetrics(running=lambda: 0, waiting=lambda: 0)

    def __init__(self, tokenizer, deltas: list[str], prompt_ids: list[int]) -> None:
        self.tokenizer, self.deltas, self.prompt_ids, self.params = tokenizer, deltas, prompt_ids, []

    def submit(self, prompt, params, chat, max_tokens, stream, images, echo=False, tools=None, grammar=None):
        self.params.append(params)
        q: asyncio.Queue = asyncio.Queue()
        text = self.deltas if stream else ["".join(self.deltas)]  # a whole answer: one delta at the end
        for event in [("accepted", 3), *[("delta", d, []) for d in text], ("done", "stop", 9, None, 0, [])]:
            q.put_nowait(event)
        return SimpleNamespace(events=q, cancel=lambda: None, prompt_ids=self.prompt_ids)


ANSWER = ["<think>", "The user", " wants weather.</th", "ink>It is", " sunny.", "<|im_end|>"]
CALL = ["<think>Need a tool.</think>", "Let me check.", "<|tool_calls_section_begin|><|tool_call_begin|>",
        "functions.get_weather:0<|tool_call_argument_begin|>", '{"city": "Paris"}', "<|tool_call_end|>",
        "<|tool_calls_section_end|>"]


def ask(client, stream: bool = False, **kw) -> tuple[dict, dict]:
    """(the message or the streamed deltas joined by field, the last choice) of one chat request."""
    body = {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 9, "stream": stream, **kw}
    if not stream:
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        return choice["message"], choice
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[1:-1]]
    joined: dict = {}
    for d in deltas:
        for key in ("reasoning_content", "content"):
            if d.get(key):
                joined[key] = joined.get(key, "") + d[key]
        joined.setdefault("tool_calls", []).extend(d.get("tool_calls", []))
    return joined, events[-2]["choices"][0]


def test_the_server_reads_reasoning_apart_whole_and_streamed(tmp_path):
    """A thinking model's answer (Kimi's tokenizer: `<think>` and `</think>` are special tokens) comes as
    reasoning_content and content, both cleaned of special tokens, whole and streamed alike; the request decodes
    with its special tokens; include_reasoning false drops the reasoning; skip_special_tokens false keeps the raw
    text as content; a completion is left alone."""
    tok = write_tiny_tokenizer(tmp_path / "kimi")
    worker = ScriptedWorker(tok, ANSWER, prompt_ids=[1, 2, 3])
    with TestClient(create_app(worker, "kimi", default_temperature=0.0)) as client:
        for stream in (False, True):
            message, choice = ask(client, stream)
            assert message["reasoning_content"] == "The user wants weather." and message["content"] == "It is sunny."
            assert choice["finish_reason"] == "stop" and not worker.params[-1].skip_special_tokens
            message, _ = ask(client, stream, include_reasoning=False)
            assert "reasoning_content" not in message and message["content"] == "It is sunny."
            message, _ = ask(client, stream, skip_special_tokens=False)
            assert "reasoning_content" not in message and message["content"] == "".join(ANSWER)
        r = client.post("/v1/completions", json={"prompt": "Weather?", "max_tokens": 9}).json()
        assert r["choices"][0]["text"] == "".join(ANSWER) and worker.params[-1].skip_special_tokens


def test_a_prompt_that_opens_the_block_starts_the_answer_as_reasoning(tmp_path):
    """A template that writes `<think>` into the generation prompt (Kimi-K2.5's thinking mode): the answer's text up
    to `</think>` is reasoning though it has no `<think>` of its own."""
    tok = write_tiny_tokenizer(tmp_path / "kimi")
    opened = tok.encode("<|im_assistant|>assistant<|im_middle|><think>")
    worker = ScriptedWorker(tok, ANSWER[1:], prompt_ids=opened)
    with TestClient(create_app(worker, "kimi", default_temperature=0.0)) as client:
        for stream in (False, True):
            message, _ = ask(client, stream)
            assert message["reasoning_content"] == "The user wants weather." and message["content"] == "It is sunny."


def test_reasoning_then_kimi_tool_calls(tmp_path):
    """Reasoning, then content, then a Kimi call section: reasoning_content, the content and the call, whole and
    streamed, finish reason tool_calls."""
    tok = write_tiny_tokenizer(tmp_path / "kimi")
    worker = ScriptedWorker(tok, CALL, prompt_ids=[1, 2, 3])
    with TestClient(create_app(worker, "kimi", default_temperature=0.0)) as client:
        for stream in (False, True):
            message, choice = ask(client, stream, tools=[WEATHER])
            assert message["reasoning_content"] == "Need a tool." and message["content"] == "Let me check."
            (call,) = message["tool_calls"]
            assert call["id"] == "functions.get_weather:0" and call["function"]["name"] == "get_weather"
            assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
            assert choice["finish_reason"] == "tool_calls"


def test_a_real_engine_with_a_template_that_opens_the_block(tmp_path):
    """End to end through the worker: a tiny model whose template opens `<think>`, its answer forced to `</think>`
    tokens (logit_bias): the first closes the block the prompt opened (empty reasoning, one reasoning token: its
    marker), the others are special tokens cleaned from the content; with the stock template the same answer has no
    reasoning (none of its tokens counted), whole and streamed."""
    from tiny import tiny_llama

    from eaglespec.config import EngineConfig
    from eaglespec.engine.engine import Engine
    from eaglespec.server.worker import EngineWorker

    for opens in (True, False):
        template = KIMI_TEMPLATE
        if opens:
            template = template.replace("{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>",
                                        "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|><think>")
        tok = write_tiny_tokenizer(tmp_path / f"kimi{opens}", template=template)
        eng = Engine(tiny_llama(vocab=tok.vocab_size), tok, EngineConfig(max_batch_size=1))
        close = tok.special_tokens["</think>"]
        worker = EngineWorker(eng, rows=1, max_len=64).start()
        try:
            with TestClient(create_app(worker, "kimi", default_temperature=0.0)) as client:
                forced = {"ignore_eos": True, "max_tokens": 3, "logit_bias": {str(close): 100}}
                message, _ = ask(client, **forced)
                body = {"messages": [{"role": "user", "content": "Weather?"}], **forced}
                whole = client.post("/v1/chat/completions", json=body).json()["usage"]
                body.update(stream=True, stream_options={"include_usage": True})
                with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    streamed = sse_events(r)[-2]["usage"]
        finally:
            worker.stop()
        assert message["content"] == ""
        assert ("reasoning_content" in message) == opens and message.get("reasoning_content", "") == ""
        assert whole["completion_tokens"] == 3 and whole == streamed
        assert whole["completion_tokens_details"] == {"reasoning_tokens": 1 if opens else 0}


def test_reasoning_tokens_are_each_blocks_markers_included(tmp_path):
    """`ReasoningSyntax.tokens`: every token from a block's `<think>` (or the answer's start, inside one) to its
    `</think>`, both counted; an unclosed block runs to the end; none outside."""
    tok = write_tiny_tokenizer(tmp_path / "kimi")
    syntax = reasoning_syntax(tok.special_texts())
    o, c = tok.special_tokens["<think>"], tok.special_tokens["</think>"]
    a, b = 11, 12  # plain tokens
    count = lambda ids, inside=False: syntax.tokens(ids, inside, tok.token_to_id)  # noqa: E731
    assert count([o, a, a, c, b, b]) == 4 and count([a, a, c, b], inside=True) == 3
    assert count([b, o, a, c, b, o, a]) == 5  # two blocks, the second unclosed
    assert count([a, c, b]) == 0 and count([]) == 0 and count([a], inside=True) == 1


def test_the_cli_prints_reasoning_to_stderr_and_the_answer_to_stdout(tmp_path, capsys):
    """`generate` and `chat` print through AnswerPrinter: a thinking model's reasoning to stderr (then a blank line
    once the answer starts), the answer, cleaned of special tokens, to stdout and as the text kept; the request runs
    with its special tokens (for the markers). A tokenizer without the markers, a request that keeps its special
    tokens, or one held to a structured output print as they come."""
    from eaglespec.cli.answer_printer import AnswerPrinter
    from eaglespec.grammar import StructuredOutput
    from eaglespec.sampling_params import SamplingParams

    tok = write_tiny_tokenizer(tmp_path / "kimi")
    printer = AnswerPrinter(tok, [1, 2], SamplingParams())
    assert not printer.params.skip_special_tokens
    for delta in ANSWER:
        printer.write(delta)
    assert printer.finish() == "It is sunny."
    out = capsys.readouterr()
    assert out.out == "It is sunny." and out.err == "The user wants weather.\n\n"
    opened = AnswerPrinter(tok, tok.encode("<|im_middle|><think>"), SamplingParams())
    for delta in ANSWER[1:]:
        opened.write(delta)
    assert opened.finish() == "It is sunny." and capsys.readouterr().err == "The user wants weather.\n\n"
    for params in (SamplingParams(), SamplingParams(skip_special_tokens=False),
                   SamplingParams(structured=StructuredOutput.json_schema({"type": "object"}))):
        printer = AnswerPrinter(tok if params != SamplingParams() else None, [], params)
        assert printer.syntax is None and printer.params == params
        for delta in ANSWER:
            printer.write(delta)
        assert printer.finish() == "".join(ANSWER) and capsys.readouterr().out == "".join(ANSWER)


def test_an_earlier_answers_reasoning_reaches_the_chat_template():
    """A client that sends an earlier answer back with its reasoning_content: the chat template gets it on that
    message (a thinking model's template may render it), and nothing on the others."""
    from eaglespec.server.schemas import ChatCompletionRequest, template_messages

    body = ChatCompletionRequest(messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "Greet."},
        {"role": "user", "content": "Again?"}])
    messages, _ = template_messages(body.messages)
    assert messages == [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello", "reasoning_content": "Greet."},
                        {"role": "user", "content": "Again?"}]
