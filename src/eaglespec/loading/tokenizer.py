"""Tokenizers: the interface the engine, server and trainer use, and its `tokenizers`-library implementation.

Contract:
- `BaseTokenizer` is the whole interface: `encode`, `decode`, `vocab_size`, `bos_token_id`, `eos_token_ids` (the EOS
  plus chat end tokens such as `<|im_end|>` / `<|eot_id|>`: generation stops at any of them), `pad_token_id`,
  `token_to_id` / `id_to_token`, `has_chat_template` / `apply_chat_template`, `detokenizer()` (streaming text) and
  `save(dir)`. Another backend (Kimi's tiktoken tokenizer) subclasses it and implements the abstract methods.
- `Tokenizer` wraps a `tokenizers.Tokenizer`; build it with `Tokenizer.from_folder` (tokenizer.json,
  tokenizer_config.json, chat_template.jinja, generation_config.json) or `tokenizer_from_gguf` (gguf_tokenizer.py).
- `load_tokenizer(path)` picks the right one for a folder or a `.gguf` file.
transformers is never imported here (it is only the reference in tests).
"""

from __future__ import annotations

from functools import lru_cache

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import CheckpointError, ConfigError
from .chat_template import render_chat_template
from .detokenizer import IncrementalDetokenizer

# Tokens that end an assistant turn in common chat formats; each present in the vocabulary joins eos_token_ids.
CHAT_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")

__all__ = ["BaseTokenizer", "Tokenizer", "IncrementalDetokenizer", "load_tokenizer", "CHAT_END_TOKENS"]


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class BaseTokenizer(ABC):
    """What the rest of eaglespec needs from a tokenizer."""

    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    extra_eos_ids: tuple[int, ...] = ()  # e.g. generation_config.json's eos_token_id
    chat_template: str | None = None

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text (`<|im_start|>`) become their ids."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode(text)` of each text (no special tokens added); backends that can run them in parallel do."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def special_texts(self) -> tuple[str, ...]:
        """The texts of the special tokens (what `skip_special_tokens` drops from decoded text)."""
        return ()

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (added tokens included)."""

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None: ...

    @abstractmethod
    def save(self, directory: str | Path) -> None:
        """Write the files `load_tokenizer(directory)` reads back."""

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token) if self.bos_token else None

    @property
    def pad_token_id(self) -> int | None:
        return self.token_to_id(self.pad_token) if self.pad_token else None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids = [self.token_to_id(self.eos_token)] if self.eos_token else []
        # gpt-oss's harmony format ends a message with <|end|> (the reasoning, then the answer follows) and the turn
        # with <|return|> / <|call|>: <|end|> is a turn's end only in vocabularies without <|return|> (Phi-3's)
        harmony = self.token_to_id("<|return|>") is not None
        ids += [self.token_to_id(t) for t in CHAT_END_TOKENS if not (harmony and t == "<|end|>")]
        ids += list(self.extra_eos_ids)
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """The prompt text of a conversation (encode it with add_special_tokens=False)."""
        if not self.chat_template:
            raise ConfigError("this tokenizer has no chat template, so chat messages cannot be formatted")
        special = {k: v for k, v in (("bos_token", self.bos_token), ("eos_token", self.eos_token),
                                     ("pad_token", self.pad_token)) if v is not None}
        return render_chat_template(self.chat_template, messages, add_generation_prompt, **{**special, **variables})

    def _write_config(self, d: Path, config: dict[str, Any]) -> None:
        """tokenizer_config.json (with model_max_length and chat_template when set) and chat_template.jinja."""
        if getattr(self, "model_max_length", None):
            config["model_max_length"] = self.model_max_length
        if self.chat_template:
            config["chat_template"] = self.chat_template
            (d / "chat_template.jinja").write_text(self.chat_template, encoding="utf-8")
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens)


def _token_text(value: Any) -> str | None:
    """A special token from tokenizer_config.json: a string or an AddedToken dict {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return data


def _pick_template(value: Any) -> str | None:
    """tokenizer_config's chat_template: a string, or a list of {"name", "template"} (take "default")."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


class Tokenizer(BaseTokenizer):
    """A `tokenizers.Tokenizer` with its special tokens and chat template."""

    def __init__(
        self,
        backend: Any,  # tokenizers.Tokenizer
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        extra_eos_ids: Sequence[int] = (),
        model_max_length: int | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        self.chat_template = chat_template
        self.extra_eos_ids = tuple(int(i) for i in extra_eos_ids)
        self.model_max_length = model_max_length

    # --- BaseTokenizer -----------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # the Rust backend spreads a batch over its threads (training tokenises ~50K conversations per run)
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def special_texts(self) -> tuple[str, ...]:
        return tuple(t.content for t in self.backend.get_added_tokens_decoder().values() if t.special)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def save(self, directory: str | Path) -> None:
        """tokenizer.json, tokenizer_config.json (special tokens, chat_template) and chat_template.jinja."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(d / "tokenizer.json"))
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "clean_up_tokenization_spaces": False,
        }
        self._write_config(d, config)

    # --- construction --------------------------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> "Tokenizer":
        from tokenizers import Tokenizer as Backend

        d = Path(folder)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise CheckpointError(f"{tj} does not exist")
        try:
            backend = Backend.from_file(str(tj))
        except Exception as e:  # the Rust loader raises a plain Exception on bad JSON or an unknown model
            raise CheckpointError(f"{tj} cannot be read as a tokenizers file ({e})") from None
        tc = _read_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
        template = _pick_template(tc.get("chat_template"))
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text(encoding="utf-8")
        elif (d / "chat_template.json").is_file():
            template = _pick_template(_read_json(d / "chat_template.json").get("chat_template")) or template
        extra: list[int] = []
        if (d / "generation_config.json").is_file():
            eos = _read_json(d / "generation_config.json").get("eos_token_id")
            extra = [int(i) for i in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
        max_len = tc.get("model_max_length")
        return cls(
            backend,
            bos_token=_token_text(tc.get("bos_token")),
            eos_token=_token_text(tc.get("eos_token")),
            pad_token=_token_text(tc.get("pad_token")),
            chat_template=template,
            extra_eos_ids=extra,
            model_max_length=int(max_len) if isinstance(max_len, (int, float)) and max_len < 1e12 else None,
        )


def load_tokenizer(path: str | Path) -> BaseTokenizer:
    """The tokenizer of a model folder (tokenizer.json, or tiktoken.model) or of a `.gguf` file."""
    from .gguf_reader import GGUFFile, is_gguf

    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p} does not exist")
    if is_gguf(p):
        from .gguf_tokenizer import tokenizer_from_gguf

        return tokenizer_from_gguf(GGUFFile(p))
    if p.is_file():
        p = p.parent
    if (p / "tokenizer.json").is_file():
        return Tokenizer.from_folder(p)
    if (p / "tiktoken.model").is_file():
        try:
            import tiktoken  # noqa: F401
        except ImportError:
            raise ConfigError(f"{p} has a tiktoken tokenizer (tiktoken.model): install the tiktoken package") from None
        from .tiktoken_tokenizer import TiktokenTokenizer

        return TiktokenTokenizer.from_folder(p)
    raise CheckpointError(f"{p} has no tokenizer (tokenizer.json or tiktoken.model)")


def has_tokenizer(path: str | Path) -> bool:
    """True when `load_tokenizer(path)` has something to read."""
    from .gguf_reader import is_gguf

    p = Path(path)
    if is_gguf(p):
        return True
    d = p.parent if p.is_file() else p
    return (d / "tokenizer.json").is_file() or (d / "tiktoken.model").is_file()
