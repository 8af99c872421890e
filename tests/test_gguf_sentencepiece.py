"""Sentencepiece GGUF vocabularies (`tokenizer.ggml.model` "llama": Llama 2, Mistral, Mixtral files) written here as
llama.cpp writes them (pieces with their scores, "<0xNN>" byte tokens, CONTROL <s> </s>, no merges), read by our
loader and by transformers' own GGUF tokenizer: the same ids with and without BOS, the same text back, byte fallback
for characters the vocabulary lacks, special tokens kept whole."""

from __future__ import annotations

import gguf
import pytest
from test_loading_gguf import write_tiny_gguf

from eaglespec.loading import load_model

# the pieces after <unk> <s> </s> and the 256 bytes, best first (a piece's score: the merge order)
PIECES = ["▁", "e", "l", "o", "h", "w", "r", "d", "t", "a", "s", "i", "n", "▁t", "he", "ll", "▁h", "▁w", "or", "ld",
          "▁the", "llo", "▁he", "▁wor", "▁hello", "▁world", "in", "▁a", "is", "▁is", "an", "▁an", "nd", "▁and"]


def spm_vocabulary(w: gguf.GGUFWriter) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(PIECES))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(PIECES))  # UNKNOWN, CONTROL, BYTE, NORMAL
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")


TEXTS = ["hello world", "the world is hello and the", " hello", "hello\nworld", "héllo wörld", "</s>hello<s>", ""]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("spm")
    vocab = 3 + 256 + len(PIECES)
    write_tiny_gguf(folder / "m.gguf", vocab=vocab, extra=spm_vocabulary)
    ours = load_model(folder / "m.gguf").tokenizer
    ref = AutoTokenizer.from_pretrained(str(folder), gguf_file="m.gguf")
    return ours, ref


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers(pair, text):
    ours, ref = pair
    for special in (False, True):
        assert ours.encode(text, add_special_tokens=special) == ref(text, add_special_tokens=special).input_ids
    ids = ours.encode(text)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def test_pieces_bytes_and_specials(pair):
    ours, _ = pair
    assert ours.encode("hello world") == [3 + 256 + PIECES.index("▁hello"), 3 + 256 + PIECES.index("▁world")]
    assert ours.encode("é") == [3 + 256 + PIECES.index("▁"), 3 + 0xC3, 3 + 0xA9]  # byte fallback: é is C3 A9
    assert ours.encode("hello", add_special_tokens=True)[0] == 1  # llama.cpp's default: BOS for sentencepiece
    assert ours.encode("</s>") == [2]  # a CONTROL token in the text: one id
    assert ours.decode(ours.encode("héllo wörld")) == "héllo wörld"
    assert ours.bos_token_id == 1 and 2 in ours.eos_token_ids
    assert ours.apply_chat_template([{"role": "user", "content": "hi"}]) == "<s>[INST] hi [/INST]"


def test_a_file_that_turns_bos_off(tmp_path):
    def no_bos(w: gguf.GGUFWriter) -> None:
        spm_vocabulary(w)
        w.add_add_bos_token(False)

    write_tiny_gguf(tmp_path / "m.gguf", vocab=3 + 256 + len(PIECES), extra=no_bos)
    tok = load_model(tmp_path / "m.gguf").tokenizer
    assert tok.encode("hello", add_special_tokens=True) == [3 + 256 + PIECES.index("▁hello")]
