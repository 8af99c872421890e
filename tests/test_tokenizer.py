"""Tokenizers: our GGUF tokenizer against transformers' (encode, decode, chat template), streaming detokenization,
save / load round trips, folder conventions, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from gguf_write import finish

from eaglespec.errors import ConfigError, RequestError
from eaglespec.loading import IncrementalDetokenizer, Tokenizer, load_tokenizer
from eaglespec.loading.chat_template import render_chat_template

TEXTS = [
    "Hello world",
    " leading space",
    "  two spaces\n\nnew lines\t tab \r\n crlf",
    "Ünïcödé façade naïve — “quotes” ‘x’ ẞ Ωmega ﬁ",
    "日本語のテキストと中文字符, 한국어",
    "emoji 😀🚀👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "digits 1234567890 3.14159 1e-5 0x1F -42",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>a/b<file_sep>",
    "almost <|im_start|without end",
    "I'm can't they'll we've",
    "",
    " ",
    "\n",
    "x" * 60 + " " + "yz" * 30,
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": 'Hi <b>&</b> "quoted" 😀'},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Again, in 日本語"},
    ],
]


@pytest.fixture(scope="module")
def tok(smollm2):
    return smollm2.tokenizer


@pytest.fixture(scope="module")
def hf_tok(smollm2_gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


def test_special_tokens(tok, hf_tok):
    assert tok.vocab_size == len(hf_tok) == 49152
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.bos_token_id == hf_tok.bos_token_id == 1
    assert tok.eos_token_ids == (2,) and tok.eos_token_id == hf_tok.eos_token_id == 2
    assert tok.pad_token_id == hf_tok.pad_token_id == 2
    assert tok.token_to_id("<|im_start|>") == 1 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.has_chat_template


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok, hf_tok, text):
    ids = tok.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert tok.encode(text, add_special_tokens=True) == hf_tok.encode(text)
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf_tok.decode(ids, skip_special_tokens=skip)
    assert tok.decode(ids, skip_special_tokens=False) == text  # byte-level BPE is lossless


def test_special_tokens_in_text_are_single_ids(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids) == "user\nhi"  # skip_special_tokens by default


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf_tok, messages, add_generation_prompt):
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    ref = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == ref
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt


@pytest.mark.parametrize("step", [1, 2, 3, 7])
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_incremental_detokenizer(tok, step, skip_special_tokens):
    text = "<|im_start|>Café 日本語 😀🚀👍🏽 👨‍👩‍👧 ok!\n" + TEXTS[3] + TEXTS[5] + "<|im_end|>"
    ids = tok.encode(text)
    assert any(tok.decode([i]).endswith("\ufffd") for i in ids)  # some ids hold half a character
    detok = tok.detokenizer(skip_special_tokens=skip_special_tokens)
    assert isinstance(detok, IncrementalDetokenizer)
    deltas = [detok.add(ids[i : i + step]) for i in range(0, len(ids), step)]
    deltas.append(detok.finish())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip_special_tokens) == detok.text
    assert not any(d.endswith("\ufffd") for d in deltas)
    assert sum(1 for d in deltas if d) > len(ids) // (2 * step)  # really streamed, not held to the end


def test_incremental_detokenizer_flushes_an_incomplete_tail(tok):
    ids = tok.encode("a😀")
    detok = IncrementalDetokenizer(tok)
    held = [detok.add(i) for i in ids[:-1]]
    assert "".join(held) == "a"  # the emoji's first bytes are held back
    assert detok.finish() == tok.decode(ids[:-1])[1:]  # flushed as decode would show it (U+FFFD)
    assert detok.finish() == ""


def test_save_and_reload(tok, tmp_path):
    tok.save(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).is_file()
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == "<|im_start|>" and cfg["eos_token"] == "<|im_end|>"
    assert cfg["chat_template"] == tok.chat_template
    again = load_tokenizer(tmp_path)
    assert isinstance(again, Tokenizer)
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    assert (again.bos_token_id, again.eos_token_ids, again.pad_token_id) == (1, (2,), 2)
    assert again.apply_chat_template(CONVERSATIONS[1]) == tok.apply_chat_template(CONVERSATIONS[1])


def test_folder_conventions(tok, tmp_path):
    """chat_template as a list of named templates, AddedToken dicts, and generation_config eos ids."""
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|im_start|>", "special": True},
        "eos_token": "<|endoftext|>",
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"},
        ],
    }))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 5]}))
    t = load_tokenizer(tmp_path)
    assert t.bos_token_id == 1
    assert t.eos_token_ids == (0, 2, 5)  # eos, the chat end token <|im_end|>, generation_config's
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    assert load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "y"}]) == "Jy"


def test_harmony_vocabularies_do_not_stop_at_end_of_message(tmp_path):
    """gpt-oss's harmony format: <|end|> closes a message (its reasoning, before the answer), <|return|> and <|call|>
    the turn; Phi-3's <|end|> closes the turn."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import WordLevel

    def ids_of(tokens: list[str], generation_eos: list[int]) -> tuple[int, ...]:
        backend = Backend(WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=tokens[0]))
        backend.save(str(tmp_path / "tokenizer.json"))
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": tokens[1]}))
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
        return load_tokenizer(tmp_path).eos_token_ids

    harmony = ["<unk>", "<|return|>", "<|end|>", "<|call|>", "<|endoftext|>"]
    assert ids_of(harmony, [1, 4, 3]) == (1, 4, 3)  # not 2
    assert ids_of(["<unk>", "<|endoftext|>", "<|end|>"], [1]) == (1, 2)  # Phi-3's


def test_chat_template_helpers_and_errors():
    tpl = "{{ messages | tojson }}{% if x is defined %}{{ raise_exception('no x allowed') }}{% endif %}"
    assert render_chat_template(tpl, [{"role": "user", "content": "<&>é", "name": None}]) == (
        '[{"role": "user", "content": "<&>é"}]'  # no HTML escaping, no ASCII escaping, None fields dropped
    )
    with pytest.raises(RequestError, match="no x allowed"):
        render_chat_template(tpl, [], x=1)
    with pytest.raises(ConfigError, match="not valid Jinja"):
        render_chat_template("{% for %}", [])
    year = render_chat_template("{{ strftime_now('%Y') }}", [])
    assert year.isdigit() and len(year) == 4
    loop = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m['content'] }}{% endfor %}"
    assert render_chat_template(loop, [{"content": "a"}, {"content": "b"}]) == "a"


def test_no_chat_template(tok, tmp_path):
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    t = load_tokenizer(tmp_path)
    assert not t.has_chat_template
    with pytest.raises(ConfigError, match="no chat template"):
        t.apply_chat_template([{"role": "user", "content": "x"}])


def test_unsupported_gguf_tokenizer_model(tmp_path):
    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("bert")  # WordPiece: no decoder model writes it
    w.add_token_list(["[UNK]", "[CLS]", "[SEP]", "a"])
    finish(w)
    with pytest.raises(ConfigError, match="GGUF tokenizer model 'bert' is not supported.*Hugging Face folder"):
        load_tokenizer(path)


def test_transformers_is_not_imported(smollm2_gguf):
    code = (
        "import sys, eaglespec.loading as L\n"
        f"t = L.load_tokenizer({str(smollm2_gguf)!r})\n"
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}]); t.decode(t.encode('hi'))\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("eos", [False, True], ids=["length", "eos"])
def test_request_without_streamed_text_ends_with_the_same_text(tok, eos):
    """SamplingParams(detokenize=False) (regeneration): no per-token detokenization, and the text at the end equals
    the streamed one (multi-byte characters, special tokens skipped, EOS not part of it); stop strings need it."""
    from eaglespec.engine.request import Request
    from eaglespec.sampling_params import SamplingParams

    ids = tok.encode("Café 日本語 😀🚀👍🏽 ok!\n" + TEXTS[3]) + ([2, 5, 6] if eos else [])
    texts = []
    # streamed (a step's tokens detokenized in one call), not streamed (Engine.generate), detokenize=False
    for detok, stream in ((True, True), (True, False), (False, True)):
        q = Request(0, [1], SamplingParams(max_new_tokens=len(ids) if not eos else 10_000, detokenize=detok), (2,), tok,
                    stream=stream)
        for i in range(0, len(ids), 3):
            q.append(ids[i : i + 3])
            if q._detok is not None and not q.finished:  # streamed text so far: what the tokens decode to
                assert tok.decode(q.output_ids, skip_special_tokens=True).startswith(q.text)
        assert q.finished and q.finish_reason == ("stop" if eos else "length")
        assert (q._detok is None) != (detok and stream)
        texts.append(q.text)
    assert texts[0] == texts[1] == texts[2] and texts[0].startswith("Café 日本語 😀")
    with pytest.raises(RequestError, match="stop strings need detokenize=True"):
        SamplingParams(stop=("x",), detokenize=False)
