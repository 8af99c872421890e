"""`eaglespec serve` through the official `openai` Python client, over a real HTTP server (uvicorn on a free port) on
the real SmolLM2 with the shipped drafter: models, chat completions (whole and streamed with usage), completions,
the speculative statistics as an extra field, and the client's own exceptions for a refused request and a wrong
API key. What a user's code runs is what this checks: the bodies parse as OpenAI's SDK expects them."""

from __future__ import annotations

import json
import socket
import threading
import time

import openai
import pytest
import torch
import uvicorn

from eaglespec.api import load_drafter
from eaglespec.assets import default_drafter_path
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.sampling_params import SamplingParams
from eaglespec.server.app import create_app
from eaglespec.server.worker import EngineWorker

NAME = "SmolLM2-135M-Instruct"
KEY = "sk-eaglespec-test"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def base_url(smollm2):
    path = default_drafter_path()
    assert path is not None
    engine = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=2),
                    drafter=load_drafter(path, "cpu", torch.float32), spec=SpecConfig(2, 2, 4))
    worker = EngineWorker(engine, rows=2, max_len=256).start()
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(worker, NAME, 0.0, api_key=KEY), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(10)
    worker.stop()
    smollm2.model.set_eagle3_layers_to_capture(None)  # the fixture model is shared


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expected(smollm2):
    plain = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1))
    return plain.generate([QUESTION], SamplingParams(max_new_tokens=16))[0].text


def test_models_and_a_chat_completion(client, expected):
    assert [m.id for m in client.models.list().data] == [NAME]
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}], max_tokens=16,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == expected
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    assert r.model_extra["eaglespec"]["verify_steps"] > 0  # the speculative statistics, an extra field


def test_a_streamed_chat_completion_with_usage(client, expected):
    stream = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}],
                                            max_completion_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_two_choices(client, expected):
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}], max_tokens=16,
                                       temperature=0, n=2)
    assert [(c.index, c.message.content) for c in r.choices] == [(0, expected), (1, expected)]
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}], max_tokens=16,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content  # parsed into the client's own types
    assert "".join(t.token for t in content) == expected and len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob <= 0 for t in content)


def test_a_completion(client, smollm2):
    plain = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1))
    prompt = "The three largest cities in Europe are"
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert r.choices[0].text == plain.generate([prompt], SamplingParams(max_new_tokens=12), chat=False)[0].text
    batch = [prompt, "Two plus two is"]  # a batch of prompts, as batch clients send them
    r = client.completions.create(model=NAME, prompt=batch, max_tokens=6, temperature=0)
    want = [o.text for o in plain.generate(batch, SamplingParams(max_new_tokens=6), chat=False)]
    assert [(c.index, c.text) for c in r.choices] == [(0, want[0]), (1, want[1])]


def test_penalties_and_vllm_extras_through_the_client(client, smollm2):
    """OpenAI's penalties and logit_bias as the client sends them (the bias keyed by token id), and vLLM's fields
    through `extra_body`: the answer is plain greedy decoding's under the same adjustments."""
    plain = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1))
    first = plain.generate([QUESTION], SamplingParams(max_new_tokens=16))[0].token_ids
    kw = dict(frequency_penalty=0.6, presence_penalty=0.3, logit_bias={first[1]: -100.0})
    extra = dict(repetition_penalty=1.1, min_tokens=12)
    want = plain.generate([QUESTION], SamplingParams(max_new_tokens=16, **kw, **extra))[0].text
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": QUESTION}], max_tokens=16,
                                       temperature=0, frequency_penalty=0.6, presence_penalty=0.3,
                                       logit_bias={str(first[1]): -100}, extra_body=extra)
    assert r.choices[0].message.content == want


def test_structured_outputs_through_the_clients_parse(client, smollm2):
    """The client's `parse` with a pydantic model (a strict json_schema response_format, as OpenAI's SDK writes it)
    gets the model back, filled as plain constrained decoding fills it."""
    from pydantic import BaseModel

    from eaglespec.grammar import StructuredOutput

    class Person(BaseModel):
        name: str
        age: int

    question = "Give me a JSON object for a person named Alice who is 30 years old."
    plain = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1))
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    want = plain.generate([question], SamplingParams(max_new_tokens=40,
                                                     structured=StructuredOutput.json_schema(schema)))[0].text
    r = client.chat.completions.parse(model=NAME, messages=[{"role": "user", "content": question}], max_tokens=40,
                                      temperature=0, response_format=Person)
    assert r.choices[0].message.content == want
    assert r.choices[0].message.parsed == Person(name="Alice", age=30)


def test_tool_calls_through_the_client(client):
    """A named tool_choice and "required" as the SDK sends them: typed tool calls back, whole and streamed."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}},
                                                            "required": ["city"], "additionalProperties": False}}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=30, temperature=0, tools=[tool],
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=30, temperature=0,
                                                 tools=[tool], tool_choice="required", stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather"
    assert json.loads(deltas[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # a named call streams its arguments: the SDK's stream helper puts them together
    with client.chat.completions.stream(model=NAME, messages=messages, max_tokens=30, temperature=0, tools=[tool],
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}}
                                        ) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


def test_the_clients_exceptions(client, base_url):
    with pytest.raises(openai.BadRequestError, match="n must be between 1 and 64"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, n=100)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    wrong = openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="API key"):
        wrong.models.list()
