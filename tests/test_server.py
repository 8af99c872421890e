"""`eaglespec serve`: the OpenAI-compatible app on the real SmolLM2 with the shipped drafter, through FastAPI's test
client. Greedy answers (plain JSON, streamed, concurrent) equal plain greedy decoding; every user mistake is a 400 (an
unknown model a 404) with one sentence, after which the server still serves; a cancelled request frees its row; a
failing engine answers 500, then 503."""

from __future__ import annotations

import gc
import json
import re
import threading
import weakref

import pytest
import torch
from fastapi.testclient import TestClient

from eaglespec.api import load_drafter
from eaglespec.assets import default_drafter_path
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.errors import ConfigError
from eaglespec.engine.engine import Engine
from eaglespec.sampling_params import SamplingParams
from eaglespec.server.app import create_app
from eaglespec.server.worker import EngineWorker

NAME = "SmolLM2-135M-Instruct"
QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about rain."]


@pytest.fixture(scope="module")
def drafter(smollm2):
    path = default_drafter_path()
    assert path is not None
    return load_drafter(path, "cpu", torch.float32)


@pytest.fixture(scope="module")
def plain(smollm2):
    return Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1))


def plain_answer(plain: Engine, prompt, max_new: int, chat: bool = True) -> str:
    return plain.generate([prompt], SamplingParams(max_new_tokens=max_new), chat=chat)[0].text


@pytest.fixture
def server(smollm2, drafter):
    """A speculative engine of 2 rows and 256 positions per sequence behind the app; greedy by default."""
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=2), drafter=drafter,
                 spec=SpecConfig(2, 2, 4))
    worker = EngineWorker(eng, rows=2, max_len=256).start()
    with TestClient(create_app(worker, NAME, default_temperature=0.0)) as client:
        client.worker = worker
        yield client
    worker.stop()
    smollm2.model.set_eagle3_layers_to_capture(None)  # the fixture model is shared


def chat_body(question: str, max_tokens: int = 16, **kw) -> dict:
    return {"model": NAME, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, **kw}


def png_data_url(seed: int = 0) -> str:
    """A small random RGB image as a data: URL (PNG: lossless, so the server decodes the same pixels)."""
    import base64
    import io

    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (24, 32, 3), generator=g, dtype=torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


PNG_URL = png_data_url()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def parts_body(*parts: dict) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}],
            "max_tokens": 4}


def sse_events(response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_models_and_health(server):
    assert server.get("/health").json() == {"status": "ok"}
    models = server.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [NAME]


def test_chat_completion_equals_plain_greedy(server, plain):
    r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 24))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == NAME and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == plain_answer(plain, QUESTIONS[0], 24)
    assert choice["finish_reason"] in ("stop", "length")
    use = body["usage"]
    assert use["total_tokens"] == use["prompt_tokens"] + use["completion_tokens"] and use["completion_tokens"] > 0
    assert body["eaglespec"]["verify_steps"] > 0  # it speculated
    # the system prompt and a prior exchange go through the chat template
    history = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello."}, {"role": "user", "content": QUESTIONS[1]}]
    r = server.post("/v1/chat/completions", json={"messages": history, "max_tokens": 12})
    assert r.json()["choices"][0]["message"]["content"] == plain_answer(plain, history, 12)


def test_streamed_chunks_join_to_the_answer(server, plain):
    with server.stream("POST", "/v1/chat/completions",
                       json=chat_body(QUESTIONS[2], 20, stream=True, stream_options={"include_usage": True})) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    final = chunks[-2]["choices"][0]
    assert final["delta"] == {} and final["finish_reason"] in ("stop", "length")
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    assert len(chunks[1:-2]) > 1 and text == plain_answer(plain, QUESTIONS[2], 20)


def test_a_stream_interval_sends_fewer_chunks_of_the_same_text(smollm2, drafter, plain):
    """`--stream-interval 8`: the first tokens go out at once, then a chunk every 8 or more tokens (fewer chunks for
    the HTTP thread, which shares the GIL with the engine's loop); the joined text is the plain greedy answer."""
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=2), drafter=drafter,
                 spec=SpecConfig(2, 2, 4))
    worker = EngineWorker(eng, rows=2, max_len=256, stream_interval=8).start()
    try:
        with TestClient(create_app(worker, NAME, default_temperature=0.0)) as client:
            with client.stream("POST", "/v1/chat/completions", json=chat_body(QUESTIONS[2], 40, stream=True)) as r:
                chunks = sse_events(r)[1:-2]  # the role chunk, the finish chunk and [DONE] aside
    finally:
        worker.stop()
        smollm2.model.set_eagle3_layers_to_capture(None)
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text == plain_answer(plain, QUESTIONS[2], 40)
    assert 2 <= len(chunks) <= 1 + 40 // 8  # the first tokens, then one chunk per 8 or more tokens
    with pytest.raises(ConfigError, match="--stream-interval must be >= 1"):
        EngineWorker(eng, rows=2, max_len=256, stream_interval=0)


def test_deltas_queued_behind_one_go_in_one_chunk():
    """A client read slower than the engine steps: the deltas already queued when a chunk is written go into that
    chunk, and the events behind them keep their order."""
    import asyncio
    from types import SimpleNamespace

    class QueuedWorker:  # every event of the answer is queued before the response is read
        alive = True
        tokenizer = None

        def submit(self, prompt, params, chat, max_tokens, stream, images, echo=False, tools=None, grammar=None):
            q: asyncio.Queue = asyncio.Queue()
            for event in [("accepted", 3), ("delta", "Hel", []), ("delta", "lo", []), ("delta", "!", []),
                          ("done", "stop", 3, None, 0, [])]:
                q.put_nowait(event)
            return SimpleNamespace(events=q, cancel=lambda: None)

    with TestClient(create_app(QueuedWorker(), NAME, default_temperature=0.0)) as client:
        with client.stream("POST", "/v1/chat/completions", json=chat_body("Hi", 3, stream=True)) as r:
            events = sse_events(r)
    assert [c["choices"][0]["delta"] for c in events[:-1]] == [{"role": "assistant", "content": ""},
                                                              {"content": "Hello!"}, {}]
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"


def test_an_api_key_guards_the_v1_routes():
    """`--api-key`: the /v1 routes answer 401 in OpenAI's error body without `Authorization: Bearer <key>` or with
    another key, and serve with it; /health and /metrics stay open, and count the refusals."""
    import asyncio
    from types import SimpleNamespace

    from eaglespec.server.metrics import ServerMetrics

    class AnsweringWorker:  # every request answered "Hi" at once
        alive = True
        tokenizer = None
        metrics = ServerMetrics(running=lambda: 0, waiting=lambda: 0)

        def submit(self, prompt, params, chat, max_tokens, stream, images, echo=False, tools=None, grammar=None):
            q: asyncio.Queue = asyncio.Queue()
            for event in [("accepted", 3), ("delta", "Hi", []), ("done", "stop", 1, None, 0, [])]:
                q.put_nowait(event)
            return SimpleNamespace(events=q, cancel=lambda: None)

    with TestClient(create_app(AnsweringWorker(), NAME, 0.0, api_key="sk-local")) as client:
        for headers in ({}, {"Authorization": "Bearer sk-other"}, {"Authorization": "sk-local"}):
            r = client.post("/v1/chat/completions", json=chat_body("Hello", 4), headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert "Authorization: Bearer <key>" in r.json()["error"]["message"]
        assert client.get("/v1/models").status_code == 401
        good = {"Authorization": "Bearer sk-local"}
        assert client.get("/v1/models", headers=good).json()["data"][0]["id"] == NAME
        r = client.post("/v1/chat/completions", json=chat_body("Hello", 4), headers=good)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hi"
        assert client.get("/health").status_code == 200
        assert metric_values(client.get("/metrics").text)['eaglespec_requests_rejected_total{status="401"}'] == 4


def test_n_choices_whole_and_streamed(server, plain):
    """`n` > 1: each choice runs as a request of its own (two rows here); greedy, every choice is plain greedy's
    answer. Whole: choices indexed 0..n-1, usage counting every choice's tokens, the speculative statistics merged.
    Streamed: a role chunk per choice, each choice's chunks (its index) joining to its answer, a finish chunk each,
    then one usage chunk."""
    want = plain_answer(plain, QUESTIONS[0], 12)
    r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 12, n=3)).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in r["choices"]] == [want] * 3
    single = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 12)).json()
    assert r["usage"]["completion_tokens"] == 3 * single["usage"]["completion_tokens"]
    assert r["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]  # the prompt counts once
    assert r["eaglespec"]["verify_steps"] == 3 * single["eaglespec"]["verify_steps"]
    with server.stream("POST", "/v1/chat/completions", json=chat_body(QUESTIONS[0], 12, n=2, stream=True,
                                                                     stream_options={"include_usage": True})) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"] * 2 // 3
    chunks = [e["choices"][0] for e in events[:-2]]
    assert [c["delta"] for c in chunks[:2]] == [{"role": "assistant", "content": ""}] * 2
    assert [c["index"] for c in chunks[:2]] == [0, 1]
    for i in (0, 1):
        mine = [c for c in chunks[2:] if c["index"] == i]
        assert "".join(c["delta"].get("content", "") for c in mine) == want
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == [r["choices"][i]["finish_reason"]]
    comp = server.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 6, "n": 2, "best_of": 2,
                                                "temperature": 0}).json()
    assert [c["index"] for c in comp["choices"]] == [0, 1] and comp["choices"][0]["text"] == comp["choices"][1]["text"]


def test_completions_take_raw_text_and_token_ids(server, plain, smollm2):
    prompt = "The three largest cities in Europe are"
    r = server.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    expected = plain_answer(plain, prompt, 12, chat=False)
    assert body["choices"][0]["text"] == expected and body["choices"][0]["finish_reason"] == "length"
    ids = smollm2.tokenizer.encode(prompt)
    by_ids = server.post("/v1/completions", json={"prompt": ids, "max_tokens": 12}).json()
    assert by_ids["choices"][0]["text"] == expected
    again = server.post("/v1/completions", json={"prompt": [prompt], "max_tokens": 12}).json()["usage"]
    assert again["prompt_tokens"] == body["usage"]["prompt_tokens"] == len(ids)
    assert again["completion_tokens"] == body["usage"]["completion_tokens"]
    # the same prompt again: a free row holds its entries (this CPU engine reuses prefixes), all but the last token's
    assert again["prompt_tokens_details"] == {"cached_tokens": len(ids) - 1}
    counted = [line for line in server.get("/metrics").text.splitlines()
               if line.startswith("eaglespec_prompt_tokens_cached_total")]
    assert len(counted) == 1 and float(counted[0].split()[-1]) >= len(ids) - 1
    with server.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 12, "stream": True}) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == expected


def test_completions_take_a_batch_of_prompts(server, plain, smollm2):
    """A batch of prompts (strings, or token id lists) in one completions request: n choices each, prompt p's choice
    j at index p * n + j, each plain greedy's answer to its own prompt; usage counts each prompt's tokens once and
    every choice's; streamed, every chunk names its choice."""
    prompts = ["The sky is", "Two plus two is", "My favourite food is"]
    want = [plain_answer(plain, p, 8, chat=False) for p in prompts]
    assert len(set(want)) == 3
    singles = [server.post("/v1/completions", json={"prompt": p, "max_tokens": 8}).json() for p in prompts]
    r = server.post("/v1/completions", json={"prompt": prompts, "max_tokens": 8, "n": 2}).json()
    assert [c["index"] for c in r["choices"]] == list(range(6))
    assert [c["text"] for c in r["choices"]] == [w for w in want for _ in range(2)]
    assert r["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert r["usage"]["completion_tokens"] == 2 * sum(s["usage"]["completion_tokens"] for s in singles)
    ids = [smollm2.tokenizer.encode(p) for p in prompts[:2]]
    by_ids = server.post("/v1/completions", json={"prompt": ids, "max_tokens": 8}).json()
    assert [c["text"] for c in by_ids["choices"]] == want[:2]
    with server.stream("POST", "/v1/completions", json={"prompt": prompts, "max_tokens": 8, "stream": True}) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]"
    chunks = [e["choices"][0] for e in events[:-1]]
    for i in range(3):
        assert "".join(c["text"] for c in chunks if c["index"] == i) == want[i]


def test_logprobs_in_both_layouts_whole_and_streamed(server, plain):
    """Chat `logprobs: true` + `top_logprobs`: one entry per completion token, its text and bytes, the target's raw
    log-probability (the plain engine's, computed without speculation) and the asked alternatives; streamed, the
    chunks' entries join to the whole answer's. Completions `logprobs: k`: tokens, token_logprobs, top_logprobs
    dicts and text offsets, continued across a stream's chunks. A request that did not ask gets null."""
    want = plain.generate([QUESTIONS[1]], SamplingParams(max_new_tokens=10, logprobs=2))[0]
    r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[1], 10, logprobs=True, top_logprobs=2)).json()
    choice = r["choices"][0]
    content = choice["logprobs"]["content"]
    assert choice["message"]["content"] == want.text and len(content) == r["usage"]["completion_tokens"] == 10
    assert "".join(e["token"] for e in content) == want.text
    for e, ref in zip(content, want.logprobs):
        assert e["logprob"] == pytest.approx(ref.logprob, abs=1e-4)
        assert e["bytes"] == list(e["token"].encode("utf-8"))
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"]  # greedy: the best
        assert e["top_logprobs"][1]["logprob"] == pytest.approx(ref.top[1][1], abs=1e-4)
    with server.stream("POST", "/v1/chat/completions", json=chat_body(QUESTIONS[1], 10, logprobs=True,
                                                                     stream=True)) as st:
        events = sse_events(st)
    streamed = [e for c in events[:-1] for e in ((c["choices"][0]["logprobs"] or {}).get("content") or [])]
    assert [(e["token"], e["top_logprobs"]) for e in streamed] == [(e["token"], []) for e in content]
    assert server.post("/v1/chat/completions", json=chat_body(QUESTIONS[1], 4)).json()["choices"][0]["logprobs"] is None

    prompt = "The sky is"
    comp = server.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "logprobs": 3}).json()["choices"][0]
    lp = comp["logprobs"]
    assert "".join(lp["tokens"]) == comp["text"] and len(lp["token_logprobs"]) == 8
    for d, v in zip(lp["top_logprobs"], lp["token_logprobs"]):  # greedy: each token is its position's best
        assert 1 <= len(d) <= 3 and max(d.values()) == pytest.approx(v, abs=1e-6)  # (texts may coincide: <= 3)
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:j]) for j in range(8)]
    with server.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "logprobs": 3,
                                                        "stream": True}) as st:
        chunks = [c["choices"][0]["logprobs"] for c in sse_events(st)[:-1]]
    assert [o for c in chunks if c for o in c["text_offset"]] == lp["text_offset"]
    assert [t for c in chunks if c for t in c["tokens"]] == lp["tokens"]


def test_echo_scores_the_prompt_as_evaluation_harnesses_ask(server, plain, smollm2):
    """Completions with `echo`: the prompt comes back first, and with `logprobs` its tokens lead the entries, scored
    by one forward (`Engine.score`; the first token has none, as OpenAI's). `max_tokens` 0 scores only. An
    lm-evaluation-harness log-likelihood request (a batch of prompts, echo, logprobs 1, max_tokens 1, greedy, a seed)
    is answered. Scores equal a reference forward's log-softmax."""
    from eaglespec.layers.context import ForwardContext

    prompt = "The capital of France is Paris"
    ids = smollm2.tokenizer.encode(prompt)
    with torch.no_grad():
        ref = smollm2.model(torch.tensor([ids]), ForwardContext.plain(1, len(ids))).logits[0].float().log_softmax(-1)
    r = server.post("/v1/completions", json={"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 2}).json()
    c = r["choices"][0]
    assert c["text"] == prompt and c["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 0
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(ids) == r["usage"]["prompt_tokens"] and "".join(lp["tokens"]) == prompt
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx([ref[j - 1, ids[j]].item() for j in range(1, len(ids))],
                                                      abs=1e-4)
    assert all(len(d) <= 2 for d in lp["top_logprobs"][1:])
    # echo and generation: the prompt, then the answer; the entries continue with the generated tokens
    want = plain_answer(plain, prompt, 4, chat=False)
    both = server.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, "echo": True,
                                                "logprobs": 0}).json()["choices"][0]
    assert both["text"] == prompt + want and len(both["logprobs"]["tokens"]) == len(ids) + 4
    assert both["logprobs"]["token_logprobs"][: len(ids)] == pytest.approx(lp["token_logprobs"], abs=1e-6)
    plain_echo = server.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4, "echo": True}).json()
    assert plain_echo["choices"][0]["text"] == prompt + want and plain_echo["choices"][0]["logprobs"] is None
    # streamed: the prompt leads the first chunk; text, entries and text offsets run on as in the whole answer
    for max_tokens, whole in ((4, both), (0, c)):  # with an answer, and scoring only
        body = {"prompt": prompt, "max_tokens": max_tokens, "echo": True, "logprobs": 0, "stream": True}
        with server.stream("POST", "/v1/completions", json=body) as st:
            events = sse_events(st)
        assert events[-1] == "[DONE]"
        chunks = [e["choices"][0] for e in events[:-1]]
        assert chunks[0]["text"].startswith(prompt) and "".join(x["text"] for x in chunks) == whole["text"]
        assert chunks[-1]["finish_reason"] == "length"
        got = [x["logprobs"] for x in chunks if x["logprobs"]]
        for key in ("tokens", "text_offset"):
            assert [v for x in got for v in x[key]] == whole["logprobs"][key]
        values = [v for x in got for v in x["token_logprobs"]]
        # (float32 rounding apart: the answer's prompt entries come from a row that already held them, prefix reuse)
        assert values[0] is None and values[1:] == pytest.approx(whole["logprobs"]["token_logprobs"][1:], abs=2e-5)
    # lm-evaluation-harness's log-likelihood request
    batch = {"prompt": [prompt, "Two plus two is four"], "max_tokens": 1, "echo": True, "logprobs": 1,
             "temperature": 0, "seed": 1234}
    out = server.post("/v1/completions", json=batch)
    assert out.status_code == 200, out.text
    assert [c["text"][: len(p)] for c, p in zip(out.json()["choices"], batch["prompt"])] == batch["prompt"]


def test_a_seeded_sampled_request_repeats_its_answer(server):
    """A sampled request with `seed` gets its own random stream (layers/row_draws.py): the same answer again, alone or
    beside other requests; its n choices draw from seed, seed + 1, ...; another seed, another answer."""
    body = chat_body(QUESTIONS[2], 12, temperature=1.0, seed=77)

    def text(b: dict) -> str:
        return server.post("/v1/chat/completions", json=b).json()["choices"][0]["message"]["content"]

    first = text(body)
    results: dict[int, str] = {}

    def ask(i: int) -> None:  # beside other sampled requests (unseeded), sharing the engine's rows
        results[i] = text(body if i == 0 else chat_body(QUESTIONS[i], 12, temperature=1.0))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == first
    choices = server.post("/v1/chat/completions", json={**body, "n": 2}).json()["choices"]
    assert choices[0]["message"]["content"] == first
    assert choices[1]["message"]["content"] == text({**body, "seed": 78})
    assert len({text({**body, "seed": s}) for s in (77, 79, 80)}) > 1


def test_penalties_and_logit_bias_equal_plain_decoding_under_them(server, plain):
    """OpenAI's frequency_penalty, presence_penalty and logit_bias, and vLLM's repetition_penalty, min_tokens and
    stop_token_ids: the speculative server's greedy answer is plain greedy decoding's under the same adjustments."""
    first = plain.generate([QUESTIONS[1]], SamplingParams(max_new_tokens=24))[0]
    banned = first.token_ids[2]
    kw = dict(frequency_penalty=0.8, presence_penalty=0.4, repetition_penalty=1.2, logit_bias={banned: -100.0},
              min_tokens=20)
    want = plain.generate([QUESTIONS[1]], SamplingParams(max_new_tokens=24, **kw))[0]
    assert want.text != first.text and banned not in want.token_ids
    body = chat_body(QUESTIONS[1], 24, **{**kw, "logit_bias": {str(banned): -100.0}})
    r = server.post("/v1/chat/completions", json={**body, "response_format": {"type": "text"}})  # text: accepted
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want.text
    # a stop token ends the answer where it first comes (not part of it)
    stop_at = first.token_ids[5]
    r = server.post("/v1/completions", json={"prompt": QUESTIONS[1], "max_tokens": 24, "stop_token_ids": [stop_at]})
    want = plain.generate([QUESTIONS[1]], SamplingParams(max_new_tokens=24, stop_token_ids=(stop_at,)), chat=False)[0]
    assert r.json()["choices"][0]["text"] == want.text and r.json()["choices"][0]["finish_reason"] == "stop"
    # a stop string kept in the text (vLLM's include_stop_str_in_output), whole and streamed
    stop = first.text[10:14]
    body = chat_body(QUESTIONS[1], 24, stop=[stop], include_stop_str_in_output=True)
    text = server.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    assert text == first.text[: first.text.index(stop) + len(stop)]
    streamed = [json.loads(line[6:]) for line in server.post("/v1/chat/completions", json={**body, "stream": True})
                .text.splitlines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in streamed if c["choices"]) == text


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                                       "required": ["timezone"], "additionalProperties": False}}}


PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                 "required": ["name", "age"], "additionalProperties": False}


def test_structured_outputs_in_each_spelling_equal_plain_decoding(server, plain):
    """OpenAI's response_format (json_schema, json_object), vLLM's guided_* and structured_outputs, SGLang's
    json_schema / regex: the speculative server's answer is plain constrained decoding's, whole and streamed."""
    from eaglespec.grammar import StructuredOutput

    question = "Give me a JSON object for a person named Alice who is 30 years old."
    want = plain.generate([question], SamplingParams(max_new_tokens=40,
                                                     structured=StructuredOutput.json_schema(PERSON_SCHEMA)))[0]
    assert json.loads(want.text) == {"name": "Alice", "age": 30}
    for fields in ({"response_format": {"type": "json_schema", "json_schema": {"name": "person",
                                                                               "schema": PERSON_SCHEMA}}},
                   {"guided_json": PERSON_SCHEMA}, {"structured_outputs": {"json": PERSON_SCHEMA}},
                   {"json_schema": json.dumps(PERSON_SCHEMA)}):
        r = server.post("/v1/chat/completions", json=chat_body(question, 40, **fields))
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == want.text and choice["finish_reason"] == "stop", fields
    with server.stream("POST", "/v1/chat/completions",
                       json=chat_body(question, 40, guided_json=PERSON_SCHEMA, stream=True)) as r:
        chunks = sse_events(r)[:-1]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == want.text
    # a regex on completions, and choices
    regex = r"(yes|no), because [a-z ]{1,30}\."
    want = plain.generate(["Is the sky blue?"], SamplingParams(max_new_tokens=30,
                                                               structured=StructuredOutput("regex", regex)))[0]
    r = server.post("/v1/chat/completions", json=chat_body("Is the sky blue?", 30, regex=regex))
    assert r.json()["choices"][0]["message"]["content"] == want.text
    assert re.fullmatch(regex, want.text)
    r = server.post("/v1/chat/completions", json=chat_body("Pick a colour.", 8, guided_choice=["red", "green", "blue"]))
    assert r.json()["choices"][0]["message"]["content"] in ("red", "green", "blue")
    r = server.post("/v1/completions", json={"prompt": "The answer, as JSON:", "max_tokens": 40,
                                             "response_format": {"type": "json_object"}})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("{")


def test_grammars_compile_off_the_engine_thread(server, monkeypatch):
    """A structured request's grammar compiles on the HTTP side (an executor thread), one per choice, not in the
    engine's loop, whose other requests would wait for a complex schema; a bad one is a 400 before it queues."""
    import threading

    from eaglespec.grammar.compiler import GrammarCompiler

    threads = []
    compile_ = GrammarCompiler.compile

    def recording(self, output):
        threads.append(threading.current_thread().name)
        return compile_(self, output)

    monkeypatch.setattr(GrammarCompiler, "compile", recording)
    r = server.post("/v1/chat/completions", json=chat_body("Pick one.", 6, n=2, guided_choice=["yes", "no"]))
    assert r.status_code == 200, r.text
    assert [c["message"]["content"] in ("yes", "no") for c in r.json()["choices"]] == [True, True]
    assert len(threads) == 2 and "eaglespec-engine" not in threads, threads
    r = server.post("/v1/chat/completions", json=chat_body("Pick one.", 6, guided_regex="(ab"))
    assert r.status_code == 400 and len(threads) == 3


def test_tool_calls_named_required_and_auto(server, plain):
    """tool_choice naming a function holds the answer to its parameters (the call's arguments: plain constrained
    decoding's JSON); "required" to an array of calls; "auto" reads calls out of a free answer (SmolLM2's template
    does not teach any, so it answers as plain decoding does); streamed, the call comes whole in the last chunk."""
    from eaglespec.grammar import StructuredOutput

    question = "What is the weather in Paris, in Celsius?"
    params = WEATHER_TOOL["function"]["parameters"]
    want = plain.generate([question], SamplingParams(max_new_tokens=40,
                                                     structured=StructuredOutput.json_schema(params)))[0].text
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = server.post("/v1/chat/completions", json=chat_body(question, 40, tools=[WEATHER_TOOL, TIME_TOOL],
                                                            tool_choice=named))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": want}
    assert json.loads(want)["city"] == "Paris"
    # streamed: no content; the call's name first, then its arguments as they come
    with server.stream("POST", "/v1/chat/completions",
                       json=chat_body(question, 40, tools=[WEATHER_TOOL], tool_choice=named, stream=True)) as r:
        chunks = sse_events(r)[:-1]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == ""
    calls = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert len(calls) > 2 and {t["index"] for t in calls} == {0}
    assert "".join(t["function"]["arguments"] for t in calls) == want
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # required: an array of calls, each of one of the tools
    r = server.post("/v1/chat/completions", json=chat_body("What time is it in Tokyo?", 60,
                                                            tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required"))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"], choice
    for call in choice["message"]["tool_calls"]:
        args = json.loads(call["function"]["arguments"])
        assert (call["function"]["name"], set(args)) in (("get_weather", {"city", "unit"}),
                                                         ("get_time", {"timezone"}))
    # auto: a free answer, read for calls
    r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 8, tools=[WEATHER_TOOL]))
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == plain_answer(plain, QUESTIONS[0], 8) and "tool_calls" not in choice["message"]
    # a conversation that holds a call and its result goes through the chat template
    history = [{"role": "user", "content": question},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                      "function": {"name": "get_weather",
                                                                                   "arguments": want}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = server.post("/v1/chat/completions", json={"messages": history, "max_tokens": 8, "tools": [WEATHER_TOOL]})
    assert r.status_code == 200, r.text


def test_skip_special_tokens_false_keeps_them_in_the_text(server, plain):
    """vLLM's skip_special_tokens: a special token the answer holds (here <|im_start|>, forced by logit_bias, EOS
    ignored) is in the text only when asked, whole and streamed."""
    body = chat_body(QUESTIONS[0], 3, logit_bias={"1": 100}, ignore_eos=True)
    r = server.post("/v1/chat/completions", json=body)
    assert r.json()["choices"][0]["message"]["content"] == ""
    r = server.post("/v1/chat/completions", json={**body, "skip_special_tokens": False})
    assert r.json()["choices"][0]["message"]["content"] == "<|im_start|>" * 3
    with server.stream("POST", "/v1/chat/completions",
                       json={**body, "skip_special_tokens": False, "stream": True}) as r:
        chunks = sse_events(r)[:-1]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "<|im_start|>" * 3


def test_tokenize_and_detokenize(server, smollm2):
    """vLLM's /tokenize (a text prompt as completions encode it, messages as chat completions do) and /detokenize."""
    tok = smollm2.tokenizer
    r = server.post("/tokenize", json={"model": NAME, "prompt": QUESTIONS[0]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode(QUESTIONS[0]) and body["count"] == len(body["tokens"])
    assert 0 < body["max_model_len"] <= 256
    chat = server.post("/tokenize", json={"messages": [{"role": "user", "content": QUESTIONS[0]}]}).json()
    assert chat["tokens"] == tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}]))
    # the chat's token count is what a chat completion reports as its prompt tokens
    use = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 2)).json()["usage"]
    assert use["prompt_tokens"] == chat["count"]
    back = server.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back == {"prompt": QUESTIONS[0]}
    for path, req, needle in [("/tokenize", {"prompt": "a", "messages": []}, "either a prompt or messages"),
                              ("/detokenize", {"tokens": [1, 49152]}, "token ids [49152] are outside"),
                              ("/tokenize", {"prompt": "a", "model": "gpt-4o"}, "does not exist")]:
        r = server.post(path, json=req)
        assert r.status_code in (400, 404) and needle in r.json()["error"]["message"], r.text


def test_concurrent_requests_equal_their_plain_answers(server, plain):
    """Three clients at once on two rows: continuous batching (one waits for a row) changes no answer."""
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[i], 16))
        results[i] = r.json()["choices"][0]["message"]["content"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == {i: plain_answer(plain, q, 16) for i, q in enumerate(QUESTIONS)}


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/chat/completions", chat_body("hi", temperature=-1), 400, "temperature must be >= 0"),
    ("/v1/chat/completions", chat_body("hi", top_p=0), 400, "top_p"),
    ("/v1/chat/completions", chat_body("hi", n=0), 400, "n must be between 1 and 64 (got 0)"),
    ("/v1/chat/completions", chat_body("hi", n=65), 400, "n must be between 1 and 64 (got 65)"),
    ("/v1/completions", {"prompt": "a", "n": 2, "best_of": 3}, 400, "best_of=3: this server does not rank choices"),
    ("/v1/chat/completions", chat_body("hi", seed=-3, temperature=0.7), 400, "seed must be between 0 and 2**63 - 1"),
    ("/v1/chat/completions", chat_body("hi", max_tokens=0), 400, "max_tokens must be >= 1"),
    ("/v1/chat/completions", chat_body("hi", max_tokens=1000), 400, "exceed this server's 256 tokens per sequence"),
    ("/v1/chat/completions", chat_body("hi", top_logprobs=2), 400, "top_logprobs needs logprobs: true"),
    ("/v1/chat/completions", chat_body("hi", logprobs=True, top_logprobs=21), 400,
     "logprobs must be between 0 and 20 (got 21)"),
    ("/v1/completions", {"prompt": "a", "logprobs": -1}, 400, "logprobs must be between 0 and 20 (got -1)"),
    ("/v1/chat/completions", chat_body("hi", frequency_penalty=2.5), 400,
     "frequency_penalty must be between -2 and 2 (got 2.5)"),
    ("/v1/chat/completions", chat_body("hi", logit_bias={"the": 5}), 400,
     "logit_bias keys must be token ids (got 'the')"),
    ("/v1/chat/completions", chat_body("hi", logit_bias={"49152": 5}), 400,
     "token ids [49152] (logit_bias, stop_token_ids, allowed_token_ids) are outside the model's vocabulary of 49152 "
     "tokens"),
    ("/v1/chat/completions", chat_body("hi", guided_json={"type": "object"}, response_format={"type": "json_object"}),
     400, "a request may ask for one structured output (got guided_json and response_format)"),
    ("/v1/chat/completions", chat_body("hi", guided_regex="(ab"), 400,
     "the structured output's regex does not compile"),
    ("/v1/chat/completions", chat_body("hi", structured_outputs={"structural_tag": "x"}), 400,
     "structured_outputs 'structural_tag' is not supported by this server"),
    ("/v1/chat/completions", chat_body("hi", response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     400, "response_format json_schema needs json_schema.schema"),
    ("/v1/chat/completions", chat_body("hi", guided_choice=["a"], ignore_eos=True), 400,
     "ignore_eos cannot be combined with a structured output"),
    ("/v1/chat/completions", chat_body("hi", use_beam_search=True), 400, "use_beam_search is not supported"),
    ("/v1/chat/completions", chat_body("hi", bad_words=["the"]), 400, "bad_words is not supported"),
    ("/v1/completions", {"prompt": "a", "prompt_logprobs": 1}, 400,
     "prompt_logprobs is not supported by this server (completions: echo with logprobs scores the prompt)"),
    ("/v1/chat/completions", chat_body("hi", min_tokens=20), 400,
     "min_tokens (20) must not exceed max_new_tokens (16)"),
    ("/v1/chat/completions", chat_body("hi", response_format={"type": "structural_tag"}), 400,
     "response_format 'structural_tag' is not supported by this server (text, json_object and json_schema are)"),
    ("/v1/chat/completions", chat_body("hi", functions=[{"name": "f"}]), 400,
     "functions and function_call are the deprecated forms of tools and tool_choice: send those"),
    ("/v1/chat/completions", chat_body("hi", tools=[{"type": "function", "function": {}}]), 400,
     "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..."),
    ("/v1/chat/completions", chat_body("hi", tools=[WEATHER_TOOL], tool_choice={"type": "function",
                                                                               "function": {"name": "g"}}), 400,
     "tool_choice names the function 'g', which is not among the tools (get_weather)"),
    ("/v1/chat/completions", chat_body("hi", tools=[WEATHER_TOOL], tool_choice="sometimes"), 400,
     "tool_choice must be \"none\", \"auto\", \"required\" or a named function (got 'sometimes')"),
    ("/v1/chat/completions", chat_body("hi", tool_choice="required"), 400, "tool_choice needs tools"),
    ("/v1/chat/completions", chat_body("hi", tools=[WEATHER_TOOL], tool_choice="required",
                                       response_format={"type": "json_object"}), 400,
     "tool_choice required cannot be combined with a structured output"),
    ("/v1/chat/completions", chat_body("hi", prediction={"type": "content", "content": "x"}), 400,
     "prediction (predicted outputs) is not supported by this server"),
    ("/v1/chat/completions", chat_body("word " * 300), 400, "but this server's sequences hold 256 tokens"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages must not be empty"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("/v1/chat/completions", parts_body({"type": "input_audio"}), 400, "content of type input_audio is not supported"),
    ("/v1/chat/completions", parts_body({"type": "image_url"}), 400, "an image_url part needs its image_url.url"),
    ("/v1/chat/completions", parts_body(image_part("https://example.com/cat.png")), 400,
     "an image_url must be a data: URL with base64 data"),
    ("/v1/chat/completions", parts_body(image_part("data:image/png;base64,bm90IGFuIGltYWdl")), 400,
     "an image_url's data could not be read as an image"),
    ("/v1/chat/completions", parts_body(image_part(PNG_URL)), 400, "LlamaForCausalLM does not take images"),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages: Field required"),
    ("/v1/chat/completions", chat_body("hi", model="gpt-4o"), 404, "the model 'gpt-4o' does not exist"),
    ("/v1/completions", {"prompt": "", "max_tokens": 4}, 400, "the prompt is empty"),
    ("/v1/completions", {"prompt": ["a", ""], "max_tokens": 4}, 400, "a prompt in the batch is empty"),
    ("/v1/completions", {"prompt": ["a"] * 33, "n": 32, "max_tokens": 4}, 400,
     "33 prompts x n=32 make 1056 choices: this server takes at most 1024 per request"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens must be >= 1 (got 0)"),
])
def test_bad_requests_get_one_sentence_and_the_server_keeps_serving(server, plain, path, body, status, needle):
    r = server.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"], err["message"]
    assert err["type"] == "invalid_request_error"
    ok = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 6))
    assert ok.status_code == 200
    assert ok.json()["choices"][0]["message"]["content"] == plain_answer(plain, QUESTIONS[0], 6)


def test_malformed_json_is_a_400(server):
    r = server.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "invalid request" in r.json()["error"]["message"]


def test_a_cancelled_request_frees_its_row(server, plain):
    """Cancel (the client went away) mid-answer: the request finishes as "abort" and its row serves the next ones,
    whose answers are unchanged. Outside an event loop the ticket's events are a plain queue."""
    worker = server.worker
    ticket = worker.submit([{"role": "user", "content": QUESTIONS[2]}], SamplingParams(max_new_tokens=200))
    assert ticket.events.get(timeout=60)[0] == "accepted"
    first = ticket.events.get(timeout=60)
    assert first[0] == "delta"
    ticket.cancel()
    while (event := ticket.events.get(timeout=60))[0] != "done":
        pass
    assert event[1] == "abort" and event[2] < 200
    assert worker.engine.scheduler.running == [] and sorted(worker.engine.scheduler.free) == [0, 1]
    r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[1], 10))
    assert r.json()["choices"][0]["message"]["content"] == plain_answer(plain, QUESTIONS[1], 10)


def test_a_request_nobody_streams_is_decoded_once(server, plain):
    """A non-streaming request skips the per-step detokenizing (host time a busy GPU engine has not got): its text
    comes as one delta at the end, the same text."""
    ticket = server.worker.submit([{"role": "user", "content": QUESTIONS[0]}], SamplingParams(max_new_tokens=12),
                                  stream=False)
    events = [ticket.events.get(timeout=60)]
    while events[-1][0] not in ("done", "error"):
        events.append(ticket.events.get(timeout=60))
    assert ticket.request._detok is None
    assert [e[0] for e in events] == ["accepted", "delta", "done"]
    assert events[1][1] == plain_answer(plain, QUESTIONS[0], 12)


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_metrics_count_what_the_server_did(server):
    """`GET /metrics` (Prometheus' text format): requests by finish reason, prompt and generated tokens as the
    answers' usage says, a refused request by status, first-token and request latencies, the speculative steps and
    accepted draft tokens that give the answers' acceptance lengths, and an empty queue at rest."""
    bodies = [chat_body(q, n) for q, n in zip(QUESTIONS, (8, 12, 16))]
    answers = [server.post("/v1/chat/completions", json=b).json() for b in bodies]
    assert server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 10, n=0)).status_code == 400
    r = server.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = metric_values(r.text)
    reasons = [a["choices"][0]["finish_reason"] for a in answers]
    assert sum(v for k, v in m.items() if k.startswith("eaglespec_requests_total{")) == 3
    assert m[f'eaglespec_requests_total{{finish_reason="{reasons[0]}"}}'] == reasons.count(reasons[0])
    assert m["eaglespec_prompt_tokens_total"] == sum(a["usage"]["prompt_tokens"] for a in answers)
    assert m["eaglespec_generation_tokens_total"] == sum(a["usage"]["completion_tokens"] for a in answers)
    assert m['eaglespec_requests_rejected_total{status="400"}'] == 1  # n = 0: refused by the app's checks
    assert m["eaglespec_time_to_first_token_seconds_count"] == 3 and m["eaglespec_request_seconds_count"] == 3
    assert 0 < m["eaglespec_time_to_first_token_seconds_sum"] <= m["eaglespec_request_seconds_sum"]
    steps = sum(a["eaglespec"]["verify_steps"] for a in answers)
    accepted = sum(a["eaglespec"]["verify_steps"] * (a["eaglespec"]["accept_length_mean"] - 1) for a in answers)
    assert m["eaglespec_spec_verify_steps_total"] == steps > 0
    assert m["eaglespec_spec_accepted_tokens_total"] == pytest.approx(accepted, abs=0.01 * steps)
    assert m["eaglespec_requests_running"] == 0 and m["eaglespec_requests_waiting"] == 0
    too_long = chat_body("word " * 400, 8)  # past the server's 256 positions: refused by the worker
    assert server.post("/v1/chat/completions", json=too_long).status_code == 400
    assert server.post("/v1/chat/completions", json={**chat_body("Hi"), "model": "other"}).status_code == 404
    m = metric_values(server.get("/metrics").text)
    assert m['eaglespec_requests_rejected_total{status="400"}'] == 2
    assert m['eaglespec_requests_rejected_total{status="404"}'] == 1
    assert m["eaglespec_prompt_tokens_total"] == sum(a["usage"]["prompt_tokens"] for a in answers)  # none admitted


def test_the_stats_line_gives_the_rates_of_its_span():
    """`ServerMetrics.summary`: rates since the last line (requests finished, tokens generated, prompt tokens
    admitted), the queue, and the acceptance length of the span's speculative steps; nothing new, no line."""
    from eaglespec.server.metrics import ServerMetrics
    from eaglespec.spec.stats import SpecStats

    m = ServerMetrics(running=lambda: 2, waiting=lambda: 1)
    gc.disable()  # a collection of a millisecond or more inside the span would add its pause to the lines
    start = m._since
    m.accepted(10)
    stats = SpecStats()
    for tau in (3, 2, 4):  # 6 draft tokens accepted in 3 steps: acceptance length 3.00
        stats.add(tau, 3)
    m.finished("stop", 20, 0.5, stats)
    assert m.summary(now=start + 2) == ("0.5 req/s, 10 generated tok/s, 5 prompt tok/s; running 2, waiting 1; "
                                        "accept length 3.00")
    assert m.summary(now=start + 4) is None  # the span stays open: the next line covers 3 s
    m.finished("length", 30, 0.5, None)
    assert m.summary(now=start + 5) == "0.3 req/s, 10 generated tok/s, 0 prompt tok/s; running 2, waiting 1"
    gc.enable()


def test_garbage_collections_are_timed_into_the_metrics_and_the_stats_line():
    """Every collection's pause goes into `gc_pause_seconds{generation}` and the span's stats line (the engine's
    loop stalls for it, engine/gc_heap.py); the hook holds the metrics weakly and a later ServerMetrics drops it."""
    from eaglespec.server.metrics import ServerMetrics

    m = ServerMetrics(running=lambda: 0, waiting=lambda: 0)
    hook = gc.callbacks[-1]
    kept = [[i] for i in range(300_000)]  # a heap a full collection takes milliseconds to walk
    gc.collect()
    values = metric_values(m.render()[0].decode())
    assert values['eaglespec_gc_pause_seconds_count{generation="2"}'] >= 1
    assert values['eaglespec_gc_pause_seconds_sum{generation="2"}'] > 0
    m.accepted(1)
    assert "; garbage collection " in m.summary()
    del kept
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None and hook in gc.callbacks  # a no-op until the next ServerMetrics
    ServerMetrics(running=lambda: 0, waiting=lambda: 0)
    assert hook not in gc.callbacks


def test_the_worker_prints_the_stats_line(smollm2, capfd):
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1))
    worker = EngineWorker(eng, rows=1, max_len=128, log_interval=0.05).start()
    try:
        ticket = worker.submit([{"role": "user", "content": QUESTIONS[0]}], SamplingParams(max_new_tokens=6))
        while ticket.events.get(timeout=60)[0] != "done":
            pass
        err = ""
        for _ in range(40):  # the loop logs within log_interval of its next turn (an idle turn waits 0.5 s)
            err += capfd.readouterr().err
            if "running 0" in err:
                break
            threading.Event().wait(0.1)
    finally:
        worker.stop()
    # a line while it ran (its prompt admitted), then one with it finished
    last = [line for line in err.splitlines() if line.startswith("[eaglespec] ")][-1]
    assert "req/s, " in last and " generated tok/s" in last and last.endswith("running 0, waiting 0")
    with pytest.raises(ConfigError, match="--log-stats-interval must be >= 0"):
        EngineWorker(eng, rows=1, max_len=128, log_interval=-1)


def test_a_failing_engine_answers_500_then_503(server, monkeypatch):
    def broken() -> list:
        raise RuntimeError("device lost")

    monkeypatch.setattr(server.worker.engine, "step", broken)
    r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 6))
    assert r.status_code == 500 and "internal error in the engine: RuntimeError: device lost" in r.text
    assert r.json()["error"]["type"] == "server_error"
    assert server.get("/health").status_code == 503
    r = server.post("/v1/chat/completions", json=chat_body(QUESTIONS[0], 6))
    assert r.status_code == 503 and "the engine has stopped" in r.json()["error"]["message"]
