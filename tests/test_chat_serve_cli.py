"""`eaglespec chat` and `eaglespec serve` on the embedded SmolLM2 with its shipped drafter: the chat keeps (and
trims) the conversation and answers as plain greedy decoding does; `serve` starts the app on the engine the options
describe (uvicorn replaced by FastAPI's test client) and says how it runs; option mistakes are one line."""

from __future__ import annotations

import gc
import io
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import weakref

import pytest
from fastapi.testclient import TestClient
from test_cli import assert_one_line_error, cpu_forward_cost, run_cli

from eaglespec import api
from eaglespec.cli.chat import fit_history
from eaglespec.config import EngineConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import RequestError
from eaglespec.sampling_params import SamplingParams


PAIR = ("Name three primary colours.", "Write a haiku about rain.")


@pytest.fixture(scope="module")
def plain():
    """The embedded model as one-row commands (`generate`, `chat`) load it (CPU transforms included; on an x86-64
    CPU the 4-bit path), decoding plainly."""
    return api.load(None, draft=None, config=EngineConfig(max_batch_size=1))


def greedy(engine: Engine, messages: list[dict], max_new: int) -> str:
    return engine.generate([messages], SamplingParams(max_new_tokens=max_new))[0].text


def test_chat_keeps_the_conversation_and_resets(plain, capsys, monkeypatch):
    sys_msg = {"role": "system", "content": "Be brief."}
    q1, q2 = "What is the capital of France?", "And of Italy?"
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{q1}\n\n{q2}\n/reset\n{q2}\n/exit\nnever read\n"))
    code, out, err = run_cli(["chat", "--spec", "2,2,4", "--max-new-tokens", "12", "--system", "Be brief."], capsys)
    assert code == 0
    a1 = greedy(plain, [sys_msg, {"role": "user", "content": q1}], 12)
    a2 = greedy(plain, [sys_msg, {"role": "user", "content": q1}, {"role": "assistant", "content": a1},
                        {"role": "user", "content": q2}], 12)
    a3 = greedy(plain, [sys_msg, {"role": "user", "content": q2}], 12)
    assert out == f"{a1}\n{a2}\n{a3}\n"
    assert a2 != a3  # the history mattered
    assert "speculative, --spec 2,2,4" in err and err.count("accept length") == 3 and "a new conversation" in err
    # the start-up line names the weights that answer (the 4-bit path where `plain`, loaded as chat loads, took it)
    four_bit = getattr(plain.runner.target, "int4_weights", False)
    assert ("[eaglespec] chat on cpu (4-bit CPU weights), speculative" in err) == four_bit
    assert ("[eaglespec] chat on cpu, speculative" in err) != four_bit
    # the second turn reuses the first's cache entries (its prompt, answer and all); the third, after /reset, the
    # system prompt's
    cached = [int(m.group(1)) for m in re.finditer(r", (\d+) of \d+ prompt tokens cached", err)]
    assert len(cached) == 2 and cached[0] > cached[1] > 5


def test_chat_refuses_an_image_for_a_text_model_and_goes_on(plain, tmp_path, capsys, monkeypatch):
    from PIL import Image

    path = tmp_path / "img.png"
    Image.new("RGB", (16, 16), (200, 30, 30)).save(path)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/image {path}\nWhat is this?\nWhat is the capital of France?\n"))
    code, out, err = run_cli(["chat", "--no-spec", "--max-new-tokens", "8"], capsys)
    assert code == 0 and "eaglespec: error: LlamaForCausalLM does not take images" in err
    # the refused message is not in the conversation: the next answer is the plain one to the question alone, from a
    # fresh prefill as chat's new engine made it (in bf16 a prompt's suffix prefilled after a reused prefix rounds
    # otherwise than a whole prefill: `plain` holds earlier tests' prefixes)
    plain.forget_prefixes()
    assert out == greedy(plain, [{"role": "user", "content": "What is the capital of France?"}], 8) + "\n"


def test_chat_ends_at_the_end_of_input(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, out, err = run_cli(["chat", "--no-spec"], capsys)
    assert code == 0 and out == "" and "plain decoding" in err


def test_chat_trims_the_oldest_turns_to_fit_the_context(smollm2):
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1, max_seq_len=120))
    limit = eng.context_len - eng.runner.headroom()
    sys_msg = {"role": "system", "content": "Be brief."}
    turns = []
    for i in range(4):
        turns += [{"role": "user", "content": f"Question {i}: tell me about the number {i}."},
                  {"role": "assistant", "content": f"The number {i} is a number, one of many numbers we know."}]
    messages = [sys_msg, *turns, {"role": "user", "content": "And the number 7?"}]
    dropped, (ids, mm) = fit_history(eng, messages, 24)
    assert dropped > 0 and dropped % 2 == 0
    assert messages[0] == sys_msg and messages[-1]["content"] == "And the number 7?"
    assert messages[1:-1] == turns[dropped:]  # the newest exchanges kept, in order
    # the prompt handed back is the kept conversation's, as the answer streams it (tokenized once per turn)
    assert ids == eng.encode_prompt(messages) and mm is None and len(ids) + 24 <= limit
    too_long = [sys_msg, {"role": "user", "content": "word " * 200}]
    with pytest.raises(RequestError, match=f"but the model's context is {limit} tokens"):
        fit_history(eng, too_long, 24)


def test_chat_refuses_a_message_too_long_and_goes_on(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("word " * 9000 + "\nWhat is the capital of France?\n"))
    code, out, err = run_cli(["chat", "--no-spec", "--max-new-tokens", "8"], capsys)
    assert code == 0 and "eaglespec: error: this message makes a prompt of" in err and "Paris" in out


class FakeServer:
    """uvicorn.Server's part that `serve` uses: `run` (in the HTTP thread) calls `self.client_work` on a test client
    of the app, then returns, which ends the engine's loop on the main thread."""

    client_work = None

    def __init__(self, config) -> None:
        self.config, self.started, self.should_exit = config, False, False

    def run(self) -> None:
        if FakeServer.client_work is None:
            return  # as uvicorn does when it cannot bind the port: never started
        self.started = True
        with TestClient(self.config.app) as client:
            FakeServer.client_work(client)


def test_serve_runs_the_app_on_the_engine_the_options_describe(capsys, monkeypatch):
    """The app `serve` hands the HTTP server answers through the test client (greedy, as plain decoding) while the
    engine's loop runs on the main thread; the start-up line names the model, rows, sequence length and the
    speculation chosen for this machine. Two requests at once (plain steps while both run, spec_max_rows 1): both
    answers are plain greedy's (float32: `serve`'s engine of 4 rows is not on the 4-bit path by default,
    int4_weights.INT4_DEFAULT_MAX_ROWS)."""
    cpu_forward_cost(monkeypatch, 1.0)
    plain = api.load(None, draft=None, config=EngineConfig(max_batch_size=1, cpu_weights="dense"))
    seen: dict = {}

    def work(client) -> None:
        seen["models"] = client.get("/v1/models").json()
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12,
                "temperature": 0}
        seen["answer"] = client.post("/v1/chat/completions", json=body).json()
        pair: dict = {}

        def ask(q: str) -> None:
            b = {"messages": [{"role": "user", "content": q}], "max_tokens": 12, "temperature": 0}
            pair[q] = client.post("/v1/chat/completions", json=b).json()["choices"][0]["message"]["content"]

        threads = [threading.Thread(target=ask, args=(q,)) for q in PAIR]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        seen["pair"] = pair

    monkeypatch.setattr(FakeServer, "client_work", staticmethod(work))
    monkeypatch.setattr("uvicorn.Server", FakeServer)
    code, out, err = run_cli(["serve", "--port", "8011", "--max-seq-len", "512"], capsys)
    assert code == 0
    assert seen["models"]["data"][0]["id"] == "SmolLM2-135M-Instruct"
    answer = seen["answer"]["choices"][0]["message"]["content"]
    assert answer == greedy(plain, [{"role": "user", "content": "What is the capital of France?"}], 12)
    assert seen["answer"]["eaglespec"]["verify_steps"] > 0
    assert seen["pair"] == {q: greedy(plain, [{"role": "user", "content": q}], 12) for q in PAIR}
    # the CPU's default: 4 rows, speculating while one runs: greedy requests in the tree S3 K2 D6 (as these ran),
    # sampled ones (the default temperature is 1) in the chain of 2, steps under count penalties plainly
    assert ("serving SmolLM2-135M-Instruct at http://127.0.0.1:8011/v1 on cpu: 4 rows of 512 tokens, speculative, "
            "--spec 3,2,6;sampled=2,1,3;penalized=plain while at most 1 request runs (plain decoding steps beyond)"
            ) in err


def test_serve_takes_its_api_key_from_the_option_or_the_environment(capsys, monkeypatch):
    """`--api-key` (or EAGLESPEC_API_KEY): the /v1 routes need `Authorization: Bearer <key>`, /health does not."""
    seen: list = []

    def work(client) -> None:
        seen.append([client.get("/v1/models").status_code, client.get("/health").status_code,
                     client.get("/v1/models", headers={"Authorization": "Bearer k1"}).status_code])

    monkeypatch.setattr(FakeServer, "client_work", staticmethod(work))
    monkeypatch.setattr("uvicorn.Server", FakeServer)
    engines, load = [], api.load
    monkeypatch.setattr(api, "load", lambda *a, **k: engines.append(weakref.ref(e := load(*a, **k))) or e)
    assert run_cli(["serve", "--no-spec", "--api-key", "k1"], capsys)[0] == 0
    monkeypatch.setenv("EAGLESPEC_API_KEY", "k1")
    assert run_cli(["serve", "--no-spec"], capsys)[0] == 0
    monkeypatch.delenv("EAGLESPEC_API_KEY")
    assert run_cli(["serve", "--no-spec"], capsys)[0] == 0  # no key: open
    assert seen == [[401, 200, 200], [401, 200, 200], [200, 200, 200]]
    # each served engine is freed once its serve ends, though FastAPI's caches keep the apps' endpoints (and through
    # them the workers): otherwise a process serving again holds every engine before it
    gc.collect()
    assert len(engines) == 3 and all(ref() is None for ref in engines)


def test_serve_says_why_it_decodes_plainly_and_when_it_cannot_listen(capsys, monkeypatch):
    cpu_forward_cost(monkeypatch, 1.3)  # above the sampled threshold (1.2): the default temperature 1 decodes plainly
    monkeypatch.setattr(FakeServer, "client_work", None)
    monkeypatch.setattr("uvicorn.Server", FakeServer)
    warmed = []  # a CUDA engine's graphs, as the CPU has none: what serve asks for and says
    monkeypatch.setattr(Engine, "warmup", lambda self, sizes, greedy, logprobs, structured: warmed.append(
        (list(sizes), greedy, logprobs, structured)) or 7)
    code, out, err = run_cli(["serve", "--served-model-name", "smol"], capsys)
    assert warmed == [([1, 2, 3, 4], False, False, False)] and "captured 7 CUDA graphs in" in err
    assert "serving smol at" in err
    assert "no speculation: the shipped drafter is slower than plain decoding on cpu" in err
    assert code == 2 and err.strip().splitlines()[-1] == (
        "eaglespec: error: the HTTP server could not start on 127.0.0.1:8000 (the port in use?)")
    run_cli(["serve", "--no-warmup"], capsys)
    assert len(warmed) == 1
    run_cli(["serve", "--warmup-logprobs"], capsys)  # the log-probability forms too
    assert warmed[-1] == ([1, 2, 3, 4], False, True, False)
    run_cli(["serve", "--warmup-structured"], capsys)  # the structured-output forms too
    assert warmed[-1] == ([1, 2, 3, 4], False, False, True)
    # sampled steps' graphs (the default temperature's), then greedy ones', counted together
    code, out, err = run_cli(["serve", "--warmup-both-modes"], capsys)
    assert warmed[-2:] == [([1, 2, 3, 4], False, False, False), ([1, 2, 3, 4], True, False, False)]
    assert "captured 14 CUDA graphs in" in err


@pytest.mark.parametrize("args,needle", [
    (["--port", "0"], "--port must be in 1..65535"),
    (["--default-temperature", "-1"], "--default-temperature must be >= 0"),
    (["--stream-interval", "0"], "--stream-interval must be >= 1"),
    (["--log-stats-interval", "-1"], "--log-stats-interval must be >= 0"),
    (["--max-seq-len", "1"], "--max-seq-len must be >= 2"),
])
def test_serve_option_mistakes(args, needle, capsys):
    code, out, err = run_cli(["serve", *args], capsys)
    assert_one_line_error(code, err, needle)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "kill"])
def test_serve_shuts_down_on_ctrl_c_and_kill(sig, code):
    """A real `eaglespec serve` process (the engine's loop on its main thread, HTTP on another) ends within seconds
    on SIGINT and on SIGTERM (`docker stop`), with 128 + the signal."""
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "eaglespec", "serve", "--no-spec", "--port", str(port),
                             "--log-level", "warning"], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.1)
        proc.send_signal(sig)
        assert proc.wait(30) == code
    finally:
        if proc.poll() is None:
            proc.kill()
