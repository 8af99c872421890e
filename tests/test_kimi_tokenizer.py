"""The Kimi tiktoken tokenizer on a tiny `tiktoken.model` written here: round trips, special tokens, chat template, eos
ids, the folder round trip, streaming, and agreement with tiktoken driven by Kimi's pattern directly."""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from eaglespec.loading.tiktoken_tokenizer import PAT_STR, TiktokenTokenizer
from eaglespec.loading.tokenizer import bytes_to_unicode
from eaglespec.loading.tokenizer import has_tokenizer, load_tokenizer

CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs. "
    "Hello world! Hello there, what is the capital of France? The capital of France is Paris. "
    "numbers 12345 and 678, code: def f(x): return x + 1\n\nthe end of the text is here.\n"
)

# The real layout (offsets from the first special id, 163584 in Kimi-K2.5); unnamed ids stay reserved.
SPECIAL_OFFSETS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 6: "<|start_header_id|>",
    7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>", 11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>", 17: "<|im_middle|>", 18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>",
    21: "<|media_pad|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}

KIMI_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def train_bpe(corpus: str, merges: int) -> dict[bytes, int]:
    """A consistent tiny BPE: the 256 bytes, then `merges` most frequent adjacent pairs, in merge order."""
    ranks = {bytes([i]): i for i in range(256)}
    seqs = [[bytes([b]) for b in w.encode()] for w in re.findall(r" ?[A-Za-z]+| ?\d+| ?[^\sA-Za-z\d]+|\s+", corpus)]
    for _ in range(merges):
        pairs = Counter((a, b) for s in seqs for a, b in zip(s, s[1:]) if a + b not in ranks)
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        ranks[a + b] = len(ranks)
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i : i + 2] = [a + b]
                i += 1
    return ranks


def write_tiny_tokenizer(folder: Path, merges: int = 64, template: str = KIMI_TEMPLATE) -> TiktokenTokenizer:
    """tiktoken.model + tokenizer_config.json (added_tokens_decoder, bos/eos/pad, chat_template) + generation_config."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = train_bpe(CORPUS, merges)
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])]
    (folder / "tiktoken.model").write_text("\n".join(lines) + "\n")
    n = len(ranks)
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "added_tokens_decoder": {str(n + k): {"content": v, "special": True} for k, v in SPECIAL_OFFSETS.items()},
        "chat_template": template,
        "model_max_length": 1048576,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": n + 2}))
    return TiktokenTokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> TiktokenTokenizer:
    folder = tmp_path_factory.mktemp("kimi_tok")
    write_tiny_tokenizer(folder)
    loaded = load_tokenizer(folder)
    assert isinstance(loaded, TiktokenTokenizer) and has_tokenizer(folder)
    return loaded


TEXTS = [
    "The quick brown fox.",
    "Hello world! What is the capital of France?",
    "  leading and trailing spaces   ",
    "line one\nline two\r\n\n\ttabbed",
    "numbers 1234567 and 3.14159, CamelCaseWord I'm we'll",
    "Unicode: naïve café — 你好，世界！ 日本語 🙂👍🏽",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.num_base_tokens for i in ids)  # no special id from plain text


def test_bpe_merges_are_used(tok):
    ids = tok.encode("the the the")
    assert len(ids) < len("the the the")  # merged, not one id per byte
    assert tok.decode(ids) == "the the the"


def test_matches_tiktoken_with_kimi_pattern(tok):
    import tiktoken

    ref = tiktoken.Encoding("ref", pat_str=PAT_STR, mergeable_ranks=tok.mergeable_ranks,
                            special_tokens=tok.special_tokens)
    for text in TEXTS + ["<|im_user|>user<|im_middle|>Hi<|im_end|>"]:
        assert tok.encode(text) == ref.encode(text, allowed_special="all")


def test_pretokenizer_splits_like_kimi(tok):
    # Han runs are their own pieces; letters split at a lower -> upper change; digits in groups of three
    import regex

    pieces = regex.findall(PAT_STR, "ab你好CamelCase 12345", flags=regex.V1)
    assert pieces == ["ab", "你好", "Camel", "Case", " ", "123", "45"]


def test_special_tokens(tok):
    n = tok.num_base_tokens
    assert tok.vocab_size == n + 256
    text = "<|im_user|>user<|im_middle|>Hi there<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    ids = tok.encode(text)
    user = tok.encode("user")
    assert ids[: len(user) + 2] == [n + 3, *user, n + 17] and n + 2 in ids and ids[-1] == n + 22
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "userHi thereassistant"
    assert tok.token_to_id("<|media_pad|>") == n + 21 and tok.id_to_token(n + 21) == "<|media_pad|>"
    assert tok.id_to_token(n + 100) == f"<|reserved_token_{n + 100}|>"
    assert tok.bos_token_id == n and tok.pad_token_id == n + 255
    # byte-level spelling of base tokens, as the original's get_vocab()
    the = tok.encode(" the")
    assert len(the) == 1 and tok.id_to_token(the[0]) == "".join(bytes_to_unicode()[b] for b in b" the")
    assert tok.token_to_id(tok.id_to_token(the[0])) == the[0]
    assert tok.encode("Hi", add_special_tokens=True) == tok.encode("Hi")  # Kimi adds no BOS by default
    assert tok.decode([tok.vocab_size + 5, *tok.encode("ok")]) == "ok"  # ids past the vocabulary decode to nothing


def test_eos_ids(tok):
    n = tok.num_base_tokens
    assert tok.eos_token_ids == (n + 1, n + 2)  # [EOS], <|im_end|> (also generation_config's eos)
    assert tok.eos_token_id == n + 1


def test_chat_template_kimi_format(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs)
    assert text == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
    )
    assert tok.apply_chat_template(msgs[1:], add_generation_prompt=False) == "<|im_user|>user<|im_middle|>Hi<|im_end|>"
    ids = tok.encode(text)
    assert ids[-1] == tok.token_to_id("<|im_middle|>")


def test_save_and_reload(tok, tmp_path):
    tok.save(tmp_path / "copy")
    again = load_tokenizer(tmp_path / "copy")
    assert isinstance(again, TiktokenTokenizer)
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    assert again.special_tokens == tok.special_tokens
    assert again.chat_template == tok.chat_template
    assert (again.bos_token, again.eos_token, again.pad_token) == ("[BOS]", "[EOS]", "[PAD]")


def test_streaming_detokenizer_holds_back_half_characters(tok):
    text = "Unicode 你好 🙂 done"
    ids = tok.encode(text)
    det = tok.detokenizer()
    deltas = [det.add(i) for i in ids] + [det.finish()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_bad_tiktoken_model_is_a_clear_error(tmp_path):
    from eaglespec.errors import CheckpointError

    (tmp_path / "tiktoken.model").write_text("not-base64-at-all\n")
    with pytest.raises(CheckpointError, match="line 1"):
        load_tokenizer(tmp_path)
