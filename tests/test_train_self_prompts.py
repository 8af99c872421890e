"""Prompts written by the target itself (train/self_prompts.py): the template prefix, the filter, generation with the
real SmolLM2 and its cache, and the CLI's checks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from eaglespec.train.self_prompts import SelfPromptConfig, keep_prompt, self_prompts, user_prefix


def test_user_prefix_ends_where_the_user_text_begins(smollm2):
    tok = smollm2.tokenizer
    text = tok.decode(user_prefix(tok), skip_special_tokens=False)
    assert text.endswith("<|im_start|>user\n") and "<|im_start|>system" in text  # SmolLM2 adds its system prompt
    full = tok.apply_chat_template([{"role": "user", "content": "Hello there"}])
    assert full.startswith(text)


@pytest.mark.parametrize("text,finished,ok", [
    ("Can you explain photosynthesis in simple terms?", True, True),
    ("Can you explain photosynthesis in simple terms?", False, False),  # cut by the token limit
    ("Hi there", True, False),  # too short
    ("word " * 401, True, False),  # too long
    ("Explain this: " + "\x00\x01\x02" * 20, True, False),  # mostly unprintable
])
def test_keep_prompt(text, finished, ok):
    assert keep_prompt(text, finished) is ok


def test_generation_and_cache(smollm2, tmp_path, monkeypatch):
    """The real SmolLM2 writes prompts; the kept ones are cached and a second call reads them without generating;
    a call asking for more continues from the cache."""
    torch.manual_seed(0)
    cfg = SelfPromptConfig(n=3, max_new_tokens=48, batch_size=8, max_rounds=2)
    convs = self_prompts(smollm2.model, smollm2.tokenizer, cfg, tmp_path, "smollm2", progress=False)
    assert 1 <= len(convs) <= 3  # a 135M model at T = 1 writes a usable prompt in well under 8 x 2 tries
    for c in convs:
        assert [m["role"] for m in c] == ["user", "assistant"] and keep_prompt(c[0]["content"], True)
    assert len({c[0]["content"] for c in convs}) == len(convs)  # no duplicates
    (cache,) = tmp_path.glob("prompts-*.jsonl")
    lines = [json.loads(x) for x in cache.read_text().splitlines()]
    assert set(lines[0]) == {"rounds"} and 1 <= lines[0]["rounds"] <= 2
    assert [x["prompt"] for x in lines[1:]][: len(convs)] == [c[0]["content"] for c in convs]
    import eaglespec.engine.engine as engine_mod

    def no_generation(*a, **k):
        raise AssertionError("generated although the cache holds enough prompts")

    monkeypatch.setattr(engine_mod.Engine, "generate", no_generation)
    again = self_prompts(smollm2.model, smollm2.tokenizer, cfg, tmp_path, "smollm2", progress=False)
    assert again == convs


@pytest.mark.parametrize("extra,message", [
    (["--self-prompts", "4", "--no-regenerate"], "--self-prompts needs regeneration"),
    (["--self-prompts", "-1"], "--self-prompts must be >= 0"),
    (["--self-prompts", "4", "--self-prompt-top-p", "0"], "top_p"),
    (["--self-prompts", "4", "--self-prompts", "-2"], "--self-prompts must be >= 0 (got -2)"),
    (["--self-prompt-openers", "Write"], "--self-prompt-openers steers --self-prompts, which is not given"),
    (["--self-prompts", "4", "--self-prompts", "4", "--self-prompt-openers", "Write"],
     "give one --self-prompt-openers per --self-prompts, in the same order (got 1 for 2 sets"),
    (["--self-prompts", "4", "--self-prompt-openers", "Write, Solve", "--self-prompts", "2",
      "--self-prompt-openers", "Write,Solve"], "--self-prompts sets 1 and 2 have the same openers (Write,Solve)"),
    (["--self-prompts", "4", "--self-prompts", "2"], "sets 1 and 2 have the same openers (none)"),
    (["--self-prompt-answer-temperature", "1"],
     "--self-prompt-answer-temperature sets how --self-prompts are answered, which is not given"),
    (["--self-prompts", "4", "--self-prompt-answer-temperature", "-1"], "temperature"),
])
def test_cli_checks(tmp_path, capsys, extra, message):
    """Bad self-prompt options fail with one line before the model is loaded."""
    from eaglespec.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("eaglespec: error: ") and message in err


def test_prompt_nll_separates_text_from_salad(smollm2):
    """The likelihood filter's score: a coherent request is far likelier to the target than its words shuffled."""
    from eaglespec.train.self_prompts import prompt_nll

    tok = smollm2.tokenizer
    prefix = user_prefix(tok)
    good = "Can you give me some tips for planning a trip to Hawaii with my family?"
    words = good.split()
    salad = " ".join(words[i] for i in (7, 2, 11, 0, 13, 4, 9, 1, 12, 5, 3, 10, 6, 8))
    nll_good = prompt_nll(smollm2.model, prefix, tok.encode(good) + [tok.eos_token_ids[0]])
    nll_salad = prompt_nll(smollm2.model, prefix, tok.encode(salad) + [tok.eos_token_ids[0]])
    assert nll_good < 3.0 < nll_salad


def test_openers_steer_the_prompts(smollm2, tmp_path):
    """With openers every kept prompt starts with one of them (the target continues the user turn after it)."""
    cfg = SelfPromptConfig(n=3, max_new_tokens=48, batch_size=6, max_rounds=2, openers=("Write", "Solve"))
    convs = self_prompts(smollm2.model, smollm2.tokenizer, cfg, tmp_path, "smollm2", progress=False)
    assert convs and all(c[0]["content"].startswith(("Write", "Solve")) for c in convs)
    assert all(len(c[0]["content"].split()) >= 3 for c in convs)


def test_batched_nll_equals_one_at_a_time(smollm2):
    """The batched, right-padded scoring gives each sequence its own forward's value."""
    from eaglespec.train.self_prompts import prompt_nll, prompt_nlls

    tok = smollm2.tokenizer
    prefix = user_prefix(tok)
    texts = ["Write a short poem about the sea.", "Can you explain how vaccines work in simple terms please?",
             "Solve 12 + 30."]
    pairs = [(prefix, tok.encode(t)) for t in texts]
    batched = prompt_nlls(smollm2.model, pairs, rows=2)
    single = [prompt_nll(smollm2.model, p, t) for p, t in pairs]
    assert batched == pytest.approx(single, abs=1e-4)


def test_rounds_share_a_generate_call(smollm2, tmp_path, monkeypatch):
    """Up to ROUNDS_PER_CALL rounds of `batch_size` requests go to one generate call over `batch_size` rows (a row
    takes the next request as soon as its prompt ends), never more requests than prompts still missing; the cache
    counts rounds, not calls."""
    import eaglespec.engine.engine as engine_mod
    from eaglespec.train.self_prompts import ROUNDS_PER_CALL

    calls: list[tuple[int, int]] = []

    def fake_generate(self, prompts, params, chat=True):
        calls.append((len(prompts), self.config.max_batch_size))
        base = sum(c[0] for c in calls[:-1])
        return [SimpleNamespace(text=f" a poem about the sea, number {base + i}.", finish_reason="stop",
                                token_ids=[1, 2, 3]) for i in range(len(prompts))]

    monkeypatch.setattr(engine_mod.Engine, "generate", fake_generate)
    cfg = SelfPromptConfig(n=10, batch_size=2, max_nll=None, openers=("Write",))
    convs = self_prompts(smollm2.model, smollm2.tokenizer, cfg, tmp_path, "smollm2", progress=False)
    assert ROUNDS_PER_CALL == 4 and calls == [(8, 2), (2, 2)]
    assert len(convs) == 10 and convs[0][0]["content"] == "Write a poem about the sea, number 0."
    (cache,) = tmp_path.glob("prompts-*.jsonl")
    assert json.loads(cache.read_text().splitlines()[0]) == {"rounds": 5}
