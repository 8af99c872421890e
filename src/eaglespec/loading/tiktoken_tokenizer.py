"""The Kimi tokenizer: tiktoken BPE from `tiktoken.model`, with Kimi's pre-tokenizer and 256 reserved special ids.

Contract (REFERENCE.md §6; facts from Moonshot's public `tokenization_kimi.py`):

- `tiktoken.model`: one token per line, `base64(token bytes) rank`; the ranks are the base vocabulary 0..N-1.
- Special ids are the 256 ids N..N+255 (N = 163584 for Kimi): their names come from `tokenizer_config.json`
  `added_tokens_decoder` ({"163586": {"content": "<|im_end|>", ...}}); an unnamed id is `<|reserved_token_{id}|>`.
  Kimi's: bos `[BOS]` 163584, eos `[EOS]` 163585, `<|im_end|>` 163586, `<|im_user|>` 163587, `<|im_assistant|>`
  163588, `<|im_system|>` 163594, `<|im_middle|>` 163601, media 163602-163605, `<think>` 163606, `</think>` 163607,
  `[UNK]` 163838, `[PAD]` 163839.
- Pre-tokenizer: `PAT_STR`, Kimi's regex (Han runs; letter runs split at case changes, excluding Han; 1-3 digits;
  punctuation; newlines; spaces). Like the original, text is cut into pieces of at most 400,000 characters and runs of
  more than 25,000 consecutive whitespace or non-whitespace characters are split before BPE (tiktoken's limits).
- `encode` turns special tokens written in the text into their ids (the original's `allow_special_tokens=True`);
  `add_special_tokens=True` prepends BOS only when tokenizer_config.json says `add_bos_token: true` (the original adds
  nothing). `decode` joins the token bytes and decodes UTF-8 with replacement characters (so the streaming
  detokenizer can hold back half characters); `skip_special_tokens` drops the 256 special ids; ids outside the
  vocabulary decode to nothing.
- `token_to_id` / `id_to_token` use the byte-level (GPT-2 `bytes_to_unicode`) spelling of base tokens, as the
  original's `get_vocab()` does, and the names of special tokens.
- `eos_token_ids`: EOS, `<|im_end|>` (the end of an assistant turn) and generation_config.json's `eos_token_id`.
- The chat template comes from `chat_template.jinja` or tokenizer_config.json `chat_template`; `DEFAULT_CHAT_TEMPLATE`
  (Kimi's turn format, no tools) is used when a folder has none.
"""

from __future__ import annotations

import base64
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..errors import CheckpointError
from .tokenizer import BaseTokenizer, _pick_template, _read_json, _token_text, bytes_to_unicode

NUM_RESERVED_SPECIAL_TOKENS = 256
TIKTOKEN_MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACE_CHARS = 25_000

PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# Kimi's turn format: <|im_user|>user<|im_middle|>...<|im_end|><|im_assistant|>assistant<|im_middle|>
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>{{ message['role'] }}<|im_middle|>"
    "{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def read_tiktoken_model(path: str | Path) -> dict[bytes, int]:
    """`base64 rank` per line -> {token bytes: rank}."""
    p = Path(path)
    ranks: dict[bytes, int] = {}
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{p} cannot be read ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise CheckpointError(f"{p} line {n} is not 'base64-token rank'") from None
    if not ranks:
        raise CheckpointError(f"{p} holds no tokens")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise CheckpointError(f"{p}: the ranks are not 0..{len(ranks) - 1} without gaps or repeats")
    return ranks


def _split_runs(s: str, max_run: int) -> Iterator[str]:
    """Cut `s` so that no piece holds more than `max_run` consecutive whitespace or non-whitespace characters."""
    run, is_space, start = 0, s[0].isspace() if s else False, 0
    for i, ch in enumerate(s):
        now_space = ch.isspace()
        if now_space != is_space:
            run, is_space = 1, now_space
        else:
            run += 1
            if run > max_run:
                yield s[start:i]
                start, run = i, 1
    yield s[start:]


class TiktokenTokenizer(BaseTokenizer):
    """Kimi's tiktoken tokenizer behind the `BaseTokenizer` interface."""

    def __init__(
        self,
        mergeable_ranks: Mapping[bytes, int],
        special_names: Mapping[int, str] | None = None,
        bos_token: str | None = "[BOS]",
        eos_token: str | None = "[EOS]",
        pad_token: str | None = "[PAD]",
        unk_token: str | None = "[UNK]",
        chat_template: str | None = DEFAULT_CHAT_TEMPLATE,
        extra_eos_ids: Sequence[int] = (),
        add_bos_token: bool = False,
        model_max_length: int | None = None,
    ) -> None:
        import tiktoken

        self.mergeable_ranks = dict(mergeable_ranks)
        self.num_base_tokens = len(self.mergeable_ranks)
        names = dict(special_names or {})
        first = self.num_base_tokens
        self.special_tokens: dict[str, int] = {
            names.get(i, f"<|reserved_token_{i}|>"): i for i in range(first, first + NUM_RESERVED_SPECIAL_TOKENS)
        }
        if len(self.special_tokens) != NUM_RESERVED_SPECIAL_TOKENS:
            raise CheckpointError("two special token ids share one name in added_tokens_decoder")
        self.special_by_id = {i: t for t, i in self.special_tokens.items()}
        self.model = tiktoken.Encoding(
            name="kimi", pat_str=PAT_STR, mergeable_ranks=self.mergeable_ranks, special_tokens=self.special_tokens
        )
        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        for label, tok in (("bos", bos_token), ("eos", eos_token)):
            if tok is not None and tok not in self.special_tokens:
                raise CheckpointError(f"the {label} token {tok!r} is not one of the special tokens")
        self.chat_template = chat_template
        self.extra_eos_ids = tuple(int(i) for i in extra_eos_ids)
        self.add_bos_token = add_bos_token
        self.model_max_length = model_max_length

    # --- BaseTokenizer -----------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids.append(self.bos_token_id)
        for i in range(0, len(text), TIKTOKEN_MAX_ENCODE_CHARS):
            for piece in _split_runs(text[i : i + TIKTOKEN_MAX_ENCODE_CHARS], MAX_NO_WHITESPACE_CHARS):
                ids.extend(self.model.encode(piece, allowed_special="all"))
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        n = self.vocab_size
        keep = [int(i) for i in ids if 0 <= int(i) < n]
        if skip_special_tokens:
            keep = [i for i in keep if i < self.num_base_tokens]
        return self.model.decode_bytes(keep).decode("utf-8", errors="replace")

    def special_texts(self) -> tuple[str, ...]:
        return tuple(self.special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.num_base_tokens + NUM_RESERVED_SPECIAL_TOKENS

    @cached_property
    def _byte_level(self) -> tuple[dict[str, int], dict[int, str]]:
        enc = bytes_to_unicode()
        by_id = {r: "".join(enc[b] for b in tok) for tok, r in self.mergeable_ranks.items()}
        return {s: i for i, s in by_id.items()}, by_id

    def token_to_id(self, token: str) -> int | None:
        if token in self.special_tokens:
            return self.special_tokens[token]
        return self._byte_level[0].get(token)

    def id_to_token(self, token_id: int) -> str | None:
        token_id = int(token_id)
        return self.special_by_id.get(token_id) or self._byte_level[1].get(token_id)

    def save(self, directory: str | Path) -> None:
        """tiktoken.model, tokenizer_config.json (special tokens, added_tokens_decoder, chat_template), .jinja."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        by_rank = sorted(self.mergeable_ranks.items(), key=lambda kv: kv[1])
        lines = [f"{base64.b64encode(tok).decode('ascii')} {rank}" for tok, rank in by_rank]
        (d / "tiktoken.model").write_text("\n".join(lines) + "\n", encoding="utf-8")
        named = {i: t for i, t in self.special_by_id.items() if t != f"<|reserved_token_{i}|>"}
        config: dict[str, Any] = {
            "tokenizer_class": "TikTokenTokenizer",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
            "add_bos_token": self.add_bos_token,
            "added_tokens_decoder": {
                str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                         "special": True}
                for i, t in sorted(named.items())
            },
        }
        self._write_config(d, config)

    # --- construction --------------------------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> "TiktokenTokenizer":
        d = Path(folder)
        ranks = read_tiktoken_model(d / "tiktoken.model")
        tc = _read_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
        names: dict[int, str] = {}
        for key, value in (tc.get("added_tokens_decoder") or {}).items():
            content = _token_text(value)
            if content is None:
                continue
            try:
                names[int(key)] = content
            except ValueError:
                raise CheckpointError(f"{d / 'tokenizer_config.json'}: added_tokens_decoder key {key!r} is not an id")
        template = _pick_template(tc.get("chat_template"))
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text(encoding="utf-8")
        extra: list[int] = []
        if (d / "generation_config.json").is_file():
            eos = _read_json(d / "generation_config.json").get("eos_token_id")
            extra = [int(i) for i in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
        max_len = tc.get("model_max_length")

        def special(key: str, default: str | None) -> str | None:
            return _token_text(tc[key]) if key in tc else default

        return cls(
            ranks,
            names,
            bos_token=special("bos_token", "[BOS]"),
            eos_token=special("eos_token", "[EOS]"),
            pad_token=special("pad_token", "[PAD]"),
            unk_token=special("unk_token", "[UNK]"),
            chat_template=template or DEFAULT_CHAT_TEMPLATE,
            extra_eos_ids=extra,
            add_bos_token=bool(tc.get("add_bos_token", False)),
            model_max_length=int(max_len) if isinstance(max_len, (int, float)) and max_len < 1e12 else None,
        )
