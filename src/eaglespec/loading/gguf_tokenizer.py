"""A `Tokenizer` rebuilt from a GGUF file's metadata (a GGUF carries no tokenizer.json).

Contract: `tokenizer_from_gguf(gguf)` supports `tokenizer.ggml.model == "gpt2"` (byte-level BPE, as in SmolLM2,
Llama 3, Qwen): a `tokenizers` BPE over `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, a ByteLevel
pre-tokenizer (add_prefix_space=False; the pre-split regex of `tokenizer.ggml.pre` when it is one we know), a
ByteLevel decoder. Tokens typed CONTROL (3) become special added tokens, USER_DEFINED (4) plain added tokens (kept
whole when encoding, kept when decoding), as transformers and llama.cpp treat them. Special ids come from
`tokenizer.ggml.{bos,eos,padding}_token_id`, the chat template from `tokenizer.chat_template`. Any other tokenizer
model raises `ConfigError` suggesting the Hugging Face folder.
"""

from __future__ import annotations

from ..errors import CheckpointError, ConfigError
from .gguf_reader import GGUFFile
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
# tokenizer.ggml.pre -> pre-split regex; absent: the GPT-2 split built into the ByteLevel pre-tokenizer.
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}


def tokenizer_from_gguf(gguf: GGUFFile) -> Tokenizer:
    from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE

    m = gguf.metadata
    kind = m.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ConfigError(
            f"{gguf.path}: GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2'); "
            "load the model's Hugging Face folder, whose tokenizer.json is read directly"
        )
    tokens: list[str] = m.get("tokenizer.ggml.tokens") or []
    merges: list[str] = m.get("tokenizer.ggml.merges") or []
    if not tokens or not merges:
        raise CheckpointError(f"{gguf.path} lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    types: list[int] = m.get("tokenizer.ggml.token_type") or [1] * len(tokens)

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # The vocabulary is spelled in the byte alphabet; a token that is not (a special token with a space, say) is
    # re-spelled from its UTF-8 bytes so the BPE model can hold it.
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)
    }
    pairs = [tuple(x.split(" ", 1)) for x in merges]
    bpe = BPE(vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
              fuse_unk=False)
    backend = Backend(bpe)
    split = PRE_TOKENIZER_SPLITS.get(m.get("tokenizer.ggml.pre", ""))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    backend.decoder = decoders.ByteLevel()
    # A CONTROL token outside the byte alphabet is a llama.cpp mislabel; adding it would grow the vocabulary.
    control = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty == CONTROL and set(t) <= alphabet]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == USER_DEFINED and t in vocab]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)

    def token(key: str) -> str | None:
        i = m.get(f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    bos = token("bos_token_id")
    if m.get("tokenizer.ggml.add_bos_token") and bos is not None:
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
