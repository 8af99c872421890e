"""server/tool_calls.py: OpenAI's tools and tool_choice as structured outputs, and the parsers of Hermes-style and
Kimi-K2 calls (the server's end-to-end tests are in test_server.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from eaglespec.errors import RequestError
from eaglespec.server.tool_calls import (CALL_ARGS, CALL_CLOSE, CALL_OPEN, HERMES, OPEN, SECTION_CLOSE, SECTION_OPEN,
                                         plan_tools, tool_syntax)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: any object


def test_plans_by_tool_choice():
    assert plan_tools(None, None) is None and plan_tools([], "auto") is None
    auto = plan_tools([WEATHER], None)
    assert auto.mode == "auto" and auto.structured is None and auto.tools == [WEATHER]
    assert plan_tools([WEATHER], "none").mode == "none"
    named = plan_tools([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert named.mode == "named" and named.name == "get_time"
    assert json.loads(named.structured.spec) == {"type": "object", "properties": {}}
    required = plan_tools([WEATHER, TIME], "required")
    schema = json.loads(required.structured.spec)
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [o["properties"]["name"]["const"] for o in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER["function"]["parameters"]
    assert json.loads(plan_tools([WEATHER], "required", parallel_tool_calls=False).structured.spec)["maxItems"] == 1


@pytest.mark.parametrize("tools,choice,message", [
    (None, "required", "tool_choice needs tools"),
    ([{"type": "function", "function": {"description": "x"}}], None, "each tool must be"),
    ([{"type": "retrieval"}], None, "each tool must be"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}},
     "tool_choice names the function 'nope', which is not among the tools (get_weather)"),
    ([WEATHER], "always", "tool_choice must be \"none\", \"auto\", \"required\" or a named function"),
])
def test_bad_tools_are_refused(tools, choice, message):
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_tools(tools, choice)


def test_constrained_answers_become_calls():
    named = plan_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    content, calls, finish = named.message('{"city": "Paris"}', "stop")
    assert content is None and finish == "tool_calls"
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    # cut by max_tokens, or by a stop string: the JSON is incomplete, so it stays text
    assert named.message('{"city": "Pa', "length") == ('{"city": "Pa', None, "length")
    assert named.message('{"city": "Pa', "stop") == ('{"city": "Pa', None, "stop")
    required = plan_tools([WEATHER, TIME], "required")
    _, calls, finish = required.message('[{"name": "get_time", "parameters": {}}, '
                                        '{"name": "get_weather", "parameters": {"city": "Oslo"}}]', "stop")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_time", {}), ("get_weather", {"city": "Oslo"})]
    assert len({c["id"] for c in calls}) == 2


def test_auto_reads_hermes_calls_out_of_the_text():
    auto = plan_tools([WEATHER, TIME], "auto")
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    content, calls, finish = auto.message(text, "stop")
    assert content == "Let me check." and finish == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    # no calls, or a block that is not a call: the text is the content
    assert auto.message("It is sunny.", "stop") == ("It is sunny.", None, "stop")
    broken = "<tool_call>{not json}</tool_call>"
    assert auto.message(broken, "stop") == (broken, None, "stop")
    # a call cut at the end (no closing tag) still reads when its JSON is whole
    _, calls, _ = auto.message('<tool_call>{"name": "get_time", "arguments": {}}', "length")
    assert calls[0]["function"]["name"] == "get_time"
    # "none": text only
    assert plan_tools([WEATHER], "none").message(text, "stop") == (text, None, "stop")


def test_streams_hold_back_what_may_open_a_call():
    auto = plan_tools([WEATHER], "auto").stream()
    assert auto.feed("Let me") == {"content": "Let me"}
    assert auto.feed(" check <") == {"content": " check "}  # "<" may open a tag
    assert auto.feed("b>") == {"content": "<b>"}  # it did not
    assert auto.feed(" ok <tool") == {"content": " ok "}
    assert auto.feed('_call>{"name": "get_weather", "arguments": {"city": "Rome"}}') == {"content": ""}
    delta = auto.feed("</tool_call> Done.")  # the block closed: its call goes now, whole
    assert delta["content"] == "" and len(delta["tool_calls"]) == 1
    call = delta["tool_calls"][0]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
    delta, finish = auto.finish("stop")
    assert delta == {"content": " Done."} and finish == "tool_calls"  # the text after it; the call went already
    # without calls the held-back tail comes at the end
    plain = plan_tools([WEATHER], "auto").stream()
    assert plain.feed("a <tool") == {"content": "a "}
    assert plain.finish("length") == ({"content": "<tool"}, "length")
    assert OPEN == "<tool_call>"
    # "required": nothing until the end, then the calls
    required = plan_tools([WEATHER], "required").stream()
    assert required.feed('[{"name": "get_weather", ') == {}
    assert required.feed('"parameters": {"city": "Oslo"}}]') == {}
    delta, finish = required.finish("stop")
    assert finish == "tool_calls" and delta["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_named_call_streams_its_arguments():
    """As vLLM streams them: the call's id, type and name first, then its arguments piece by piece; the client's
    concatenation is the whole answer's arguments."""
    named = plan_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}}).stream()
    first = named.feed('{"city": ')
    (head,) = first["tool_calls"]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"] == {"name": "get_weather", "arguments": '{"city": '}
    assert named.feed("") == {}
    assert named.feed('"Paris"}') == {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}
    assert named.finish("stop") == ({}, "tool_calls")
    cut = plan_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}}).stream()
    cut.feed('{"ci')
    assert cut.finish("length") == ({}, "length")  # partial arguments, as the reason says


def test_tools_reach_the_chat_template(smollm2):
    """`tools` go to the template as its `tools` variable (a template that renders them shows them), and the
    messages of an earlier call (assistant tool_calls, a tool result) pass through."""
    import copy

    from eaglespec.engine.prompts import encode_prompt

    tok = copy.copy(smollm2.tokenizer)  # the session's tokenizer stays as it is
    tok.chat_template = ("{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
                         "{% for m in messages %}{{ m.role }}:{{ m.content or '' }}"
                         "{% for c in m.tool_calls or [] %}({{ c.function.name }}){% endfor %};{% endfor %}")
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    ids = encode_prompt(tok, messages, True, tools=[WEATHER, TIME])
    assert tok.decode(ids) == "[get_weather][get_time]user:hi;assistant:(get_weather);tool:sunny;"
    assert tok.decode(encode_prompt(tok, messages[:1], True)) == "user:hi;"


# --- Kimi-K2's calls: special-token markers ----------------------------------------------------------------------
KIMI_SPECIAL = ("<|im_end|>", "<think>", "</think>", SECTION_OPEN, SECTION_CLOSE, CALL_OPEN, CALL_ARGS, CALL_CLOSE)
KIMI_ANSWER = ("<think>The user wants weather.</think>Let me check.<|tool_calls_section_begin|>"
               '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
               "<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"
               "<|tool_call_end|><|tool_calls_section_end|>")


def test_the_syntax_is_read_off_the_tokenizers_special_tokens():
    assert tool_syntax(KIMI_SPECIAL).kind == "kimi" and tool_syntax(("<|im_start|>", "<|im_end|>")) == HERMES
    assert plan_tools([WEATHER], "auto", syntax=tool_syntax(KIMI_SPECIAL)).decodes_special
    assert not plan_tools([WEATHER], "auto").decodes_special  # Hermes' tags are text
    named = plan_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}},
                       syntax=tool_syntax(KIMI_SPECIAL))
    assert not named.decodes_special  # held to the arguments' JSON: no markers to read


def test_auto_reads_kimi_calls_and_cleans_the_content():
    auto = plan_tools([WEATHER, TIME], "auto", syntax=tool_syntax(KIMI_SPECIAL))
    content, calls, finish = auto.message(KIMI_ANSWER, "stop")
    assert content == "The user wants weather.Let me check." and finish == "tool_calls"
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("functions.get_weather:0", "get_weather", {"city": "Paris"}), ("functions.get_time:1", "get_time", {})]
    # no calls: the content without special tokens; a call whose arguments are not JSON is not read
    assert auto.message("<think>hm</think>Sunny.<|im_end|>", "stop") == ("hmSunny.", None, "stop")
    broken = f"{SECTION_OPEN}{CALL_OPEN}functions.get_time:0{CALL_ARGS}{{oops{CALL_CLOSE}{SECTION_CLOSE}"
    assert auto.message(broken, "stop") == ("functions.get_time:0{oops", None, "stop")
    # cut by max_tokens after a whole call: the call still reads
    cut = KIMI_ANSWER[: KIMI_ANSWER.index(CALL_OPEN + "functions.get_time")]
    assert [c["function"]["name"] for c in auto.message(cut, "length")[1]] == ["get_weather"]
    # a request that keeps special tokens (skip_special_tokens false) gets them in the content
    keep = plan_tools([WEATHER], "auto", syntax=replace(tool_syntax(KIMI_SPECIAL), special=()))
    assert keep.message("<think>hm</think>Sunny.", "stop")[0] == "<think>hm</think>Sunny."


def test_kimi_streams_hold_back_markers_and_clean_special_tokens():
    stream = plan_tools([WEATHER, TIME], "auto", syntax=tool_syntax(KIMI_SPECIAL)).stream()
    sent = []
    calls = []
    for piece in ("<think>", "The user", " wants weather.", "</think>", "Let me check.", "<|tool_calls_sec",
                  KIMI_ANSWER[KIMI_ANSWER.index("tion_begin|>"):]):
        delta = stream.feed(piece)
        assert set(delta) <= {"content", "tool_calls"} and "<" not in delta["content"]
        sent.append(delta["content"])
        calls += delta.get("tool_calls", [])
    assert "".join(sent) == "The user wants weather.Let me check."
    assert [(c["index"], c["id"]) for c in calls] == [(0, "functions.get_weather:0"), (1, "functions.get_time:1")]
    assert stream.finish("stop") == ({}, "tool_calls")  # both calls went out with the piece that closed them
    plain = plan_tools([WEATHER], "auto", syntax=tool_syntax(KIMI_SPECIAL)).stream()
    assert plain.feed("Sunny <|im_") == {"content": "Sunny "}  # may be a special token: held
    assert plain.finish("stop") == ({"content": "<|im_"}, "stop")  # it never became one: text after all


HERMES_TWO = ('Checking both. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


@pytest.mark.parametrize("syntax, answer", [(HERMES, HERMES_TWO), (tool_syntax(KIMI_SPECIAL), KIMI_ANSWER)],
                         ids=["hermes", "kimi"])
def test_streamed_auto_calls_go_out_as_their_blocks_close(syntax, answer):
    """Fed in pieces of every size, an auto answer's calls each go out once, whole and indexed, in the delta whose
    text closes its block (both answers close theirs, so none is left for `finish`); together they are the whole
    answer's calls, and the content is its content."""
    plan = plan_tools([WEATHER, TIME], "auto", syntax=syntax)
    content, whole, reason = plan.message(answer, "stop")
    assert reason == "tool_calls" and len(whole) == 2
    closes = [i + len(syntax.close) for i in range(len(answer)) if answer.startswith(syntax.close, i)]
    for size in range(1, len(answer) + 1):
        stream, sent, calls, fed = plan.stream(), [], [], 0
        for at in range(0, len(answer), size):
            delta = stream.feed(answer[at : at + size])
            fed = at + size
            sent.append(delta.get("content", ""))
            for c in delta.get("tool_calls", []):
                calls.append(c)
                assert closes[c["index"]] <= fed < closes[c["index"]] + size  # at the piece that closed it
        last, finish = stream.finish("stop")
        assert "tool_calls" not in last
        sent.append(last.get("content", ""))
        assert finish == "tool_calls" and [c["index"] for c in calls] == [0, 1]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole]
        assert "".join(sent).strip() == (content or "")


def test_kimi_calls_round_trip_through_kimis_tokenizer(tmp_path):
    """The answer's ids decoded with their special tokens (as the server decodes an auto answer of a Kimi model)
    read as the calls; decoded without them the markers are gone (why the server keeps them)."""
    from test_kimi_tokenizer import write_tiny_tokenizer

    tok = write_tiny_tokenizer(tmp_path / "kimi")
    syntax = tool_syntax(tok.special_texts())
    assert syntax.kind == "kimi" and len(syntax.special) == 256
    ids = tok.encode(KIMI_ANSWER)
    assert tok.decode(ids, skip_special_tokens=False) == KIMI_ANSWER
    content, calls, _ = plan_tools([WEATHER, TIME], "auto", syntax=syntax).message(
        tok.decode(ids, skip_special_tokens=False), "stop")
    assert content == "The user wants weather.Let me check." and len(calls) == 2
    assert plan_tools([WEATHER], "auto", syntax=syntax).message(tok.decode(ids), "stop")[1] is None


def test_a_kimi_server_decodes_auto_answers_with_special_tokens(tmp_path, monkeypatch):
    """The server reads the syntax off its tokenizer: with Kimi's, an "auto" answer is decoded with its special
    tokens (for the markers) and its content cleaned of them again (here <think>, forced by logit_bias: read as
    reasoning, server/reasoning.py), unless the request keeps them; without tools too (for the reasoning's
    markers)."""
    from fastapi.testclient import TestClient
    from test_kimi_tokenizer import write_tiny_tokenizer
    from tiny import tiny_llama

    from eaglespec.config import EngineConfig
    from eaglespec.engine.engine import Engine
    from eaglespec.server.app import create_app
    from eaglespec.server.worker import EngineWorker

    tok = write_tiny_tokenizer(tmp_path / "kimi")
    eng = Engine(tiny_llama(vocab=tok.vocab_size), tok, EngineConfig(max_batch_size=1))
    seen = []
    add = Engine.add_prepared
    monkeypatch.setattr(Engine, "add_prepared", lambda self, ids, mm, params, **k: seen.append(params) or add(
        self, ids, mm, params, **k))
    think = tok.special_tokens["<think>"]
    body = {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 3, "ignore_eos": True,
            "logit_bias": {str(think): 100}, "tools": [WEATHER]}
    worker = EngineWorker(eng, rows=1, max_len=64).start()
    try:
        with TestClient(create_app(worker, "kimi", default_temperature=0.0)) as client:
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "" and not seen[-1].skip_special_tokens
            r = client.post("/v1/chat/completions", json={**body, "skip_special_tokens": False})
            assert r.json()["choices"][0]["message"]["content"] == "<think>" * 3
            r = client.post("/v1/chat/completions", json={**body, "tools": None})
            assert r.json()["choices"][0]["message"]["content"] == "" and not seen[-1].skip_special_tokens
    finally:
        worker.stop()
