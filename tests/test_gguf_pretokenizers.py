"""The GGUF tokenizer's pre-splits by `tokenizer.ggml.pre` for DeepSeek's and Kimi's files: DeepSeek-V3's three
regexes and DeepSeek-LLM's (V2's) six, applied in turn, against pieces worked out by hand from the regexes; and a
`kimi-k2` GGUF vocabulary, built from a tiny tiktoken model the way llama.cpp's converter builds it (byte-level
spellings, merges recovered by re-running BPE on each token), encoding exactly as our tiktoken tokenizer does."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from gguf_write import finish
from test_kimi_tokenizer import TEXTS, write_tiny_tokenizer

from eaglespec.loading import GGUFFile
from eaglespec.loading.gguf_tokenizer import PRE_TOKENIZER_SPLITS, tokenizer_from_gguf
from eaglespec.loading.tokenizer import bytes_to_unicode


def pieces(pre: str, text: str) -> list[str]:
    """The pre-tokenizer's pieces of `text` (before the byte-level spelling), as tokenizer_from_gguf wires it."""
    from tokenizers import Regex, pre_tokenizers

    seq = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated")
                                   for r in PRE_TOKENIZER_SPLITS[pre]])
    return [p for p, _ in seq.pre_tokenize_str(text)]


def test_deepseek_v3_splits():
    # 1-3 digit groups first; then Han / kana runs; then letters with their one leading non-letter, a punctuation
    # run with one leading space, newline runs, spaces
    assert pieces("deepseek-v3", "Hello world! 12345 你好世界abc .NET x\n\ny") == [
        "Hello", " world", "!", " ", "123", "45", " ", "你好世界", "abc", " .", "NET", " x", "\n\n", "y"]
    assert pieces("deepseek-v3", "カタカナとひらがな、and (x)") == ["カタカナとひらがな", "、", "and", " (", "x", ")"]
    assert pieces("deepseek-v3", "#include") == ["#include"]  # one ASCII punctuation mark joins the letters after it


def test_deepseek_llm_splits():
    # newlines alone; cased letters with one leading space; ASCII / full-width punctuation; trailing spaces; CJK runs;
    # digit runs of any length
    assert pieces("deepseek-llm", "Hello world! 12345 你好\n") == [
        "Hello", " world", "!", " ", "12345", " ", "你好", "\n"]
    # every later split cuts the earlier pieces again (tokenizers' Sequence, as llama.cpp): the punctuation class's
    # ":-~" holds the ASCII letters, so a letter run is cut where it leaves ASCII, and the CJK class's U+0800-U+4E00
    # holds "ℂ" (U+2102), cut from its space
    assert pieces("deepseek-llm", "Ωmega ℂ café 가나다  ") == ["Ω", "mega", " ", "ℂ", " caf", "é", " ", "가나다", "  "]


@pytest.mark.parametrize("pre, want", [
    # Mistral's tekken: case changes split letter runs, no contractions, single digits
    ("tekken", ["Hello", "World", " I", "'M", " ", "1", "2", "3", "4", "5", " x", "\n\n", "y", "!/", " 你好"]),
    # o200k: the same with contractions and 1-3 digits
    ("gpt-4o", ["Hello", "World", " I'M", " ", "123", "45", " x", "\n\n", "y", "!/", " 你好"]),
    # SmolLM / StarCoder: single digits, then GPT-2's split
    ("smollm", ["HelloWorld", " I", "'", "M", " ", "1", "2", "3", "4", "5", " x", "\n", "\n", "y", "!/", " 你好"]),
    ("deepseek-coder", ["HelloWorld", " I", "'", "M", " ", "1", "2", "3", "4", "5", " x", "\n", "\n", "y", "!/", " ",
                        "你好"]),
])
def test_other_known_splits(pre, want):
    assert pieces(pre, "HelloWorld I'M 12345 x\n\ny!/ 你好") == want


def test_an_unknown_pre_tokenizer_is_named(tmp_path):
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("newfangled")
    w.add_token_list(list(bytes_to_unicode().values()) + ["ab"])
    w.add_token_merges(["a b"])
    finish(w)
    with pytest.warns(UserWarning, match="its pre-tokenizer 'newfangled' is not one eaglespec knows, so GPT-2's split "
                                         "is used"):
        tok = tokenizer_from_gguf(GGUFFile(path))
    assert tok.encode("ab ab") == [256, 220, 256]  # GPT-2's pieces "ab", " ab": "ab", the space's byte, "ab"


@pytest.mark.parametrize("pre, bos", [("glm4", False), ("chatglm-bpe", False), ("llama-bpe", True)])
def test_glm4_vocabularies_get_no_bos_whatever_the_file_says(tmp_path, pre, bos):
    """llama.cpp adds no BOS to GLM-4's vocabularies (its chat template starts with "[gMASK]<sop>" itself), even
    where the file's add_bos_token says so; other vocabularies follow the flag. GLM-4's split is Llama 3's."""
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "glm4moe")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(list(bytes_to_unicode().values()) + ["ab", "[gMASK]"])
    w.add_token_types([1] * 257 + [3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(257)
    w.add_add_bos_token(True)
    finish(w)
    tok = tokenizer_from_gguf(GGUFFile(path))
    assert tok.encode("ab ab", add_special_tokens=True) == [257] * bos + [256, 220, 256]
    assert PRE_TOKENIZER_SPLITS[pre] == PRE_TOKENIZER_SPLITS["llama3"]


def bpe_parts(ranks: dict[bytes, int], token: bytes) -> list[bytes]:
    """BPE on `token` with merges of lower rank than its own: the pair it was made of (llama.cpp's converter's way
    of recovering the merges of a tiktoken vocabulary)."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < ranks[token] and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def write_kimi_gguf(path: Path, ranks: dict[bytes, int], specials: dict[str, int]) -> None:
    spell = bytes_to_unicode()
    n = len(ranks)
    by_id = {r: "".join(spell[b] for b in t) for t, r in ranks.items()}
    names = {i: s for s, i in specials.items()}
    tokens = [by_id[i] for i in range(n)] + [names.get(i, f"[PAD{i}]") for i in range(n, n + 256)]
    types = [1] * n + [3 if i in names else 5 for i in range(n, n + 256)]
    merges = []
    for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        parts = bpe_parts(ranks, t) if len(t) > 1 else []
        if len(parts) == 2:
            merges.append(" ".join("".join(spell[b] for b in p) for p in parts))
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(specials["[BOS]"])
    w.add_eos_token_id(specials["[EOS]"])
    finish(w)


@pytest.fixture(scope="module")
def kimi_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kimi")
    ref = write_tiny_tokenizer(folder / "tok")
    write_kimi_gguf(folder / "k.gguf", ref.mergeable_ranks, ref.special_tokens)
    return ref, tokenizer_from_gguf(GGUFFile(folder / "k.gguf"))


@pytest.mark.parametrize("text", TEXTS + ["ab你好CamelCase 12345 I'M HERE", "<|im_user|>user<|im_middle|>Hi<|im_end|>"])
def test_kimi_k2_gguf_encodes_as_the_tiktoken_tokenizer(kimi_pair, text):
    ref, tok = kimi_pair
    ids = tok.encode(text)
    assert ids == ref.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
