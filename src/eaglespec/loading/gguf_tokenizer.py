"""A `Tokenizer` rebuilt from a GGUF file's metadata (a GGUF carries no tokenizer.json).

Contract: `tokenizer_from_gguf(gguf)` supports `tokenizer.ggml.model == "gpt2"` (byte-level BPE, as in SmolLM2,
Llama 3, Qwen, DeepSeek, Kimi-K2): a `tokenizers` BPE over `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, a
ByteLevel pre-tokenizer (add_prefix_space=False; before it the pre-split regexes of `tokenizer.ggml.pre` when it is
one we know, `PRE_TOKENIZER_SPLITS`), a ByteLevel decoder. Tokens typed CONTROL (3) become special added tokens,
USER_DEFINED (4) plain added tokens (kept whole when encoding, kept when decoding), as transformers and llama.cpp
treat them, under their own ids whatever characters they hold. Special ids come from
`tokenizer.ggml.{bos,eos,padding}_token_id`, the chat template from `tokenizer.chat_template`; BOS is prepended
(when asked for special tokens) as `tokenizer.ggml.add_bos_token` says. `tokenizer.ggml.model == "llama"`
(sentencepiece: Llama 2, Mistral, Mixtral files) is rebuilt by transformers' GGUF tokenizer converter (its merges from
the scores, byte fallback, "▁" spaces; a ConfigError when transformers is not installed), with BOS added unless the
file says not, as llama.cpp does. Any other tokenizer model raises `ConfigError` suggesting the Hugging Face folder.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import CheckpointError, ConfigError
from .gguf_reader import GGUFFile
from .tiktoken_tokenizer import PAT_STR as KIMI_PAT_STR
from .tokenizer import Tokenizer, bytes_to_unicode

CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Mistral's tekken (Nemo, Small 3): letter runs split at case changes, single digits
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# o200k (GPT-4o's, MiniMax-M2's, Llama 4's): tekken's with contractions and 1-3 digits
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek-LLM's (and DeepSeek-V2's) cased letters: code points written out where NFC would fold them into others
_DEEPSEEK_LETTERS = (
    "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽ"
    "ᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄ"
    "ῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿ"
    "ⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ"
    "\U00010400-\U0001044f𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃"
)
_DEEPSEEK_LLM_SPLITS = (
    "[\r\n]", "\\s?[" + _DEEPSEEK_LETTERS + "]+", "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$",
    "[一-龥ࠀ-一가-퟿]+", "\\p{N}+",
)
_DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}", "[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# tokenizer.ggml.pre -> the pre-split regexes, applied in turn (each piece split again by the next, matches kept as
# pieces: tokenizers' Split "isolated", as the models' tokenizer.json files say and llama.cpp's llama-vocab.cpp has
# them, in tokenizer.json's spelling where llama.cpp adapted one); absent: the GPT-2 split built into the ByteLevel
# pre-tokenizer (with a warning for a pre value not known to be GPT-2's). kimi-k2: Kimi's tiktoken pattern (llama.cpp
# runs it as a hand-written matcher).
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "llama3": (_LLAMA3_SPLIT,), "llama-v3": (_LLAMA3_SPLIT,), "llama-bpe": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,), "dbrx": (_LLAMA3_SPLIT,), "chatglm-bpe": (_LLAMA3_SPLIT,), "glm4": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,), "deepseek-r1-qwen": (_QWEN2_SPLIT,), "stablelm2": (_QWEN2_SPLIT,),
    "hunyuan": (_QWEN2_SPLIT,),
    "deepseek-llm": _DEEPSEEK_LLM_SPLITS, "deepseek-v3": _DEEPSEEK_V3_SPLITS, "kimi-k2": (KIMI_PAT_STR,),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    "tekken": (_TEKKEN_SPLIT,), "gpt-4o": (_GPT4O_SPLIT,), "minimax-m2": (_GPT4O_SPLIT,), "llama4": (_GPT4O_SPLIT,),
    # single digits first, then GPT-2's split (SmolLM's and StarCoder's tokenizer.json: Digits, then ByteLevel)
    **{pre: (r"\p{N}", _GPT2_SPLIT) for pre in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                               "minerva")},
}
# pre values of GLM-4's vocabulary, to which llama.cpp adds no BOS whatever the file says
GLM_PRES = frozenset({"glm4", "chatglm-bpe"})
# pre values whose split is GPT-2's own, the ByteLevel pre-tokenizer's regex
GPT2_PRES = frozenset({"default", "gpt2", "gpt-2", "mpt", "olmo", "jais", "trillion", "granite-docling"})


# tokenizer.ggml.* -> the key transformers' GGUF tokenizer converter reads it under
_CONVERTER_KEYS = {"model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores",
                   "token_type": "token_type", "merges": "merges", "bos_token_id": "bos_token_id",
                   "eos_token_id": "eos_token_id", "unknown_token_id": "unk_token_id",
                   "padding_token_id": "pad_token_id", "add_space_prefix": "add_prefix_space"}


def tokenizer_from_gguf(gguf: GGUFFile) -> Tokenizer:
    from tokenizers import processors

    m = gguf.metadata
    kind = m.get("tokenizer.ggml.model")
    tokens: list[str] = m.get("tokenizer.ggml.tokens") or []
    if kind == "gpt2":
        backend = _byte_level(gguf, tokens)
    elif kind == "llama":
        backend = _sentencepiece(gguf)
    else:
        raise ConfigError(
            f"{gguf.path}: GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2' and "
            "sentencepiece 'llama'); load the model's Hugging Face folder, whose tokenizer.json is read directly"
        )

    def token(key: str) -> str | None:
        i = m.get(f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    bos = token("bos_token_id")
    # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise (older files have no flag), and
    # never to GLM-4's (its chat template writes "[gMASK]<sop>" itself)
    add_bos = m.get("tokenizer.ggml.add_bos_token", kind == "llama") and m.get("tokenizer.ggml.pre") not in GLM_PRES
    backend.post_processor = None
    if add_bos and bos is not None:
        bos_id = int(m["tokenizer.ggml.bos_token_id"])
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    arch = m.get("general.architecture", "")
    ctx = m.get(f"{arch}.context_length")
    return Tokenizer(
        backend,
        bos_token=bos,
        eos_token=token("eos_token_id"),
        pad_token=token("padding_token_id"),
        chat_template=m.get("tokenizer.chat_template"),
        model_max_length=int(ctx) if ctx else None,
    )


def _byte_level(gguf: GGUFFile, tokens: list[str]) -> Any:
    """The `tokenizers` backend of a byte-level BPE vocabulary (see the module docstring)."""
    from tokenizers import AddedToken, Regex, decoders, pre_tokenizers
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE

    m = gguf.metadata
    merges: list[str] = m.get("tokenizer.ggml.merges") or []
    if not tokens or not merges:
        raise CheckpointError(f"{gguf.path} lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    types: list[int] = m.get("tokenizer.ggml.token_type") or [1] * len(tokens)

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # The vocabulary is spelled in the byte alphabet. Added tokens (CONTROL, USER_DEFINED) keep their text, as
    # tokenizer.json's vocabularies hold them (DeepSeek's "<｜User｜>": matched whole, never built by merges); any other
    # token outside the alphabet is re-spelled from its UTF-8 bytes, which is what its merges build.
    added = {CONTROL, USER_DEFINED}
    vocab = {
        t if set(t) <= alphabet or ty in added else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, (t, ty) in enumerate(zip(tokens, types))
    }
    pairs = [tuple(x.split(" ", 1)) for x in merges]
    bpe = BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
              fuse_unk=False)
    backend = Backend(bpe)
    pre = m.get("tokenizer.ggml.pre")
    splits = PRE_TOKENIZER_SPLITS.get(pre or "")
    if pre and splits is None and pre not in GPT2_PRES:
        warnings.warn(f"{gguf.path}: its pre-tokenizer {pre!r} is not one eaglespec knows, so GPT-2's split is used: "
                      "tokens may differ from the model's own tokenizer (its Hugging Face folder's tokenizer.json "
                      "has it)", stacklevel=2)
    if splits is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    backend.decoder = decoders.ByteLevel()
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
    return backend


def _sentencepiece(gguf: GGUFFile) -> Any:
    """The `tokenizers` backend of a sentencepiece vocabulary (Llama 2, Mistral, Mixtral files), as transformers'
    GGUF tokenizer converter builds it (the scores' merges, byte fallback, the "▁" spaces of its normalizer)."""
    try:  # transformers 5, then 4
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:
        try:
            from transformers.integrations.ggml import convert_gguf_tokenizer
        except ImportError:
            raise ConfigError(f"{gguf.path} has a sentencepiece tokenizer ('llama'), which is rebuilt with "
                              "transformers' GGUF tokenizer converter: install transformers, or load the model's "
                              "Hugging Face folder") from None
    m = gguf.metadata
    if not m.get("tokenizer.ggml.tokens") or not m.get("tokenizer.ggml.scores"):
        raise CheckpointError(f"{gguf.path} lacks tokenizer.ggml.tokens or tokenizer.ggml.scores")
    d = {name: m[f"tokenizer.ggml.{key}"] for key, name in _CONVERTER_KEYS.items() if f"tokenizer.ggml.{key}" in m}
    backend, _ = convert_gguf_tokenizer(m.get("general.architecture", "llama"), d)
    return backend
