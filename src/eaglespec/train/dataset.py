"""Tokenised training samples with their loss masks, the train/eval split, and length-bucketed batches.

Contract:
- `tokenize_conversation(tokenizer, messages)` -> (ids, mask): the conversation rendered with the tokenizer's chat
  template (no generation prompt), and `mask[i]` true exactly for the tokens of assistant contents plus the
  end-of-turn token that follows each (the first token after the content when it is one of `eos_token_ids`).
  The template is rendered once with a sentinel in place of each content; the text between sentinels is the
  template's own, so contents are tokenised on their own and can never be confused with template text. A template
  that drops an assistant message raises `DataError` (`build_dataset` counts such conversations as dropped).
- `TokenDataset` keeps every sample on one flat token tensor (`tokens` [N_tok], `mask` [N_tok], `offsets` [n+1]);
  `build_dataset(...)` applies `--max-len`: truncate (keep the first max_len tokens) or drop, counting what it drops
  (samples without any assistant token inside the limit are dropped either way).
- `mask_loops(ids, mask, keep)`: the loss mask without the assistant tokens that lie deeper than `keep` tokens into
  a run of tokens each completing an 8-gram seen earlier in the sample (`repetition.LoopTracker`: the degenerate
  loops of a small target's greedy answers, 63% of SmolLM2's regenerated ShareGPT answer tokens, 16% of its MT-bench
  answers). The first `keep` tokens of every run keep their loss, so copying is still learnt; contexts are
  unchanged.
  `build_dataset(..., loop_keep=N)` applies it (None: off) and counts the masked tokens (`TokenDataset.loop_masked`).
- A sample ends at its last loss token: the tokens after it carry no loss and, attention being causal, change no
  counted position's inputs, target states or labels (ttt.py: step k at position j reads tokens <= j+1+k and the
  target's distribution at j+1+k, and counts when t_{j+2+k} is a loss token), so they are cut
  (`TokenDataset.trimmed` counts them): the template's text after the last answer (ChatML's newline), and the
  tokens after a final answer cut by --max-len. A loop that runs to the end of an answer is not such a tail (the
  end-of-turn token after the answer keeps its loss); regeneration's `--regen-stop-loop` keeps those out instead.
- `split(n, eval_frac, seed, groups)`: a seeded permutation, the first ceil(eval_frac * n) for evaluation; with
  `groups` (the pipeline passes `TokenDataset.prompt_keys()`) samples with the same opening prompt stay together and
  a group's side is fixed by a hash of (seed, its key), so adding data never moves a sample across.
- `make_batches(lengths, batch_tokens)`: samples sorted by length, grouped so that rows x longest <= batch_tokens;
  `epoch_order(n_batches, seed, epoch)` shuffles the batches per epoch (seeded, so a resumed run sees the same
  order); `Batch` tensors are gathered on the device in one indexing op, right-padded with token 0 / mask false
  (to a multiple of `pad_to` tokens).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch

from ..errors import RequestError
from ..repetition import LOOP_NGRAM, LoopTracker
from .conversations import DataError, Message

if TYPE_CHECKING:
    from ..loading.tokenizer import BaseTokenizer

SENTINEL = "\ue000{}\ue001"  # private-use characters: never in data, left alone by templates


def tokenize_conversation(tokenizer: "BaseTokenizer", messages: Sequence[Message]) -> tuple[list[int], list[bool]]:
    """Token ids of the rendered conversation and the assistant loss mask (see the module docstring)."""
    segs = _segments(tokenizer, messages)
    return _assemble(segs, [tokenizer.encode(text) if text else [] for text, _ in segs], tokenizer.eos_token_ids)


# a segment of the rendered conversation: template text, a user/system content, or an assistant content
_TEMPLATE, _CONTENT, _ANSWER = 0, 1, 2


def _segments(tokenizer: "BaseTokenizer", messages: Sequence[Message]) -> list[tuple[str, int]]:
    """The rendered conversation as (text, kind) pieces in order: the template's own text between sentinels and each
    message's content (raises DataError when the template drops an assistant message)."""
    marked = [{**m, "content": SENTINEL.format(i)} for i, m in enumerate(messages)]
    text = tokenizer.apply_chat_template(marked, add_generation_prompt=False)
    segs: list[tuple[str, int]] = []
    pos = 0
    for i, m in enumerate(messages):
        mark = SENTINEL.format(i)
        at = text.find(mark, pos)
        if at < 0:
            if m["role"] == "assistant":
                raise DataError(f"the chat template drops assistant message {i}, so its tokens cannot be masked")
            continue
        segs.append((text[pos:at], _TEMPLATE))
        segs.append((m["content"], _ANSWER if m["role"] == "assistant" else _CONTENT))
        pos = at + len(mark)
    segs.append((text[pos:], _TEMPLATE))
    return segs


def _assemble(segs: Sequence[tuple[str, int]], encoded: Sequence[Sequence[int]],
              eos_ids: Sequence[int]) -> tuple[list[int], list[bool]]:
    """(ids, mask) from the segments and their token ids: assistant contents carry the loss, and so does the
    end-of-turn token when the template segment right after an assistant content starts with one."""
    eos = set(eos_ids)
    ids: list[int] = []
    mask: list[bool] = []
    after_answer = False
    for (_, kind), seg in zip(segs, encoded):
        ids.extend(seg)
        mask.extend([kind == _ANSWER] * len(seg))
        if kind == _TEMPLATE:
            if after_answer and seg and seg[0] in eos:  # the end-of-turn token is predicted too
                mask[len(ids) - len(seg)] = True
        else:
            after_answer = kind == _ANSWER
    return ids, mask


@dataclass
class TokenDataset:
    tokens: torch.Tensor  # [N_tok] int64, all samples back to back
    mask: torch.Tensor  # [N_tok] bool, true on loss (assistant) tokens
    offsets: torch.Tensor  # [n + 1] int64, sample i is tokens[offsets[i]:offsets[i+1]]
    dropped: Counter = field(default_factory=Counter)
    loop_masked: int = 0  # assistant tokens taken out of the loss by `mask_loops`
    trimmed: int = 0  # tokens cut after each sample's last loss token

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def subset(self, idx: Sequence[int] | torch.Tensor) -> "TokenDataset":
        idx = torch.as_tensor(idx, dtype=torch.int64)
        starts, lens = self.offsets[idx], self.lengths[idx]
        gather = torch.cat([torch.arange(s, s + n) for s, n in zip(starts.tolist(), lens.tolist())]) if len(idx) \
            else torch.zeros(0, dtype=torch.int64)
        offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0)))
        return TokenDataset(self.tokens[gather], self.mask[gather], offsets, Counter(self.dropped))

    def prompt_keys(self) -> list[bytes]:
        """Per sample, the tokens before its first loss token (the rendered prompt up to the first answer): equal
        keys mean the same opening prompt (the grouping of `split`)."""
        keys = []
        for s, e in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist()):
            first = int(self.mask[s:e].nonzero()[0]) if self.mask[s:e].any() else e - s
            keys.append(self.tokens[s : s + first].numpy().tobytes())
        return keys

    def to(self, device: torch.device | str) -> "TokenDataset":
        return TokenDataset(self.tokens.to(device), self.mask.to(device), self.offsets.to(device), self.dropped)

    @staticmethod
    def from_samples(samples: Sequence[tuple[Sequence[int], Sequence[bool]]], max_len: int | None = None,
                     long: str = "truncate", loop_keep: int | None = None) -> "TokenDataset":
        """Samples (ids, mask) -> dataset, applying --max-len (`long`: truncate or drop), then `mask_loops`, then
        cutting each sample after its last loss token."""
        if long not in ("truncate", "drop"):
            raise ValueError(f"long must be 'truncate' or 'drop' (got {long!r})")
        dropped: Counter = Counter()
        loop_masked = trimmed = 0
        toks: list[int] = []
        masks: list[bool] = []
        offsets = [0]
        for ids, mask in samples:
            if max_len is not None and len(ids) > max_len:
                if long == "drop":
                    dropped["longer than --max-len"] += 1
                    continue
                ids, mask = ids[:max_len], mask[:max_len]
            if loop_keep is not None:
                mask, k = mask_loops(ids, mask, loop_keep)
                loop_masked += k
            if len(ids) < 3 or not any(mask[2:]):  # the first loss target is token 2 (see ttt.py)
                dropped["no assistant token within --max-len"] += 1
                continue
            end = len(mask) - list(reversed(mask)).index(True)  # just past the last loss token
            trimmed += len(ids) - end
            toks += ids[:end]
            masks += mask[:end]
            offsets.append(len(toks))
        return TokenDataset(torch.tensor(toks, dtype=torch.int64), torch.tensor(masks, dtype=torch.bool),
                            torch.tensor(offsets, dtype=torch.int64), dropped, loop_masked, trimmed)


def mask_loops(ids: Sequence[int], mask: Sequence[bool], keep: int, n: int = LOOP_NGRAM) -> tuple[list[bool], int]:
    """(mask without the loss tokens deeper than `keep` into a loop run, number of tokens taken out); see above."""
    out = list(mask)
    loops = LoopTracker(n)
    masked = 0
    for i, tok in enumerate(ids):
        if loops.add(tok) > keep and out[i]:
            out[i] = False
            masked += 1
    return out, masked


def build_dataset(tokenizer: "BaseTokenizer", conversations: Sequence[Sequence[Message]], max_len: int,
                  long: str = "truncate", loop_keep: int | None = None, chunk: int = 4096) -> TokenDataset:
    """Tokenise conversations (chat template + assistant mask), apply --max-len, then optionally take deep loop
    tokens out of the loss (`mask_loops`); a conversation the template refuses (`raise_exception`) or renders
    without one of its assistant messages is dropped and counted. The same samples as `tokenize_conversation` one by
    one; the texts of `chunk` conversations at a time go to `tokenizer.encode_batch` (parallel in the Rust backend:
    most of the time of a ~50K-conversation run went to per-segment encode calls)."""
    samples = []
    refused: Counter = Counter()
    eos = tokenizer.eos_token_ids
    for start in range(0, len(conversations), chunk):
        pieces: list[list[tuple[str, int]]] = []
        for c in conversations[start : start + chunk]:
            try:
                pieces.append(_segments(tokenizer, c))
            except DataError:
                refused["chat template drops an assistant message"] += 1
            except RequestError:
                refused["refused by the chat template"] += 1
        texts = [text for segs in pieces for text, _ in segs if text]
        encoded = iter(tokenizer.encode_batch(texts) if texts else [])
        for segs in pieces:
            samples.append(_assemble(segs, [next(encoded) if text else [] for text, _ in segs], eos))
    ds = TokenDataset.from_samples(samples, max_len, long, loop_keep)
    ds.dropped.update(refused)
    return ds


def split(n: int, eval_frac: float, seed: int,
          groups: Sequence[Hashable] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, eval indices); at least one training sample is kept.

    Without `groups`: a seeded permutation, the first ceil(eval_frac * n) held out. With `groups` (one key per
    sample, bytes or str), samples sharing a key land on the same side, and a group is held out when a hash of
    (seed, key) falls below eval_frac: its side depends on nothing else, so data added to a run never move a sample
    across (a drafter continued on more data with `--init` is not evaluated on what it trained on, and held-out
    estimates of such runs compare). About eval_frac of the groups are held out; at least one when eval_frac > 0,
    never all. Chat data repeat prompts (ShareGPT's first turns do), and a held-out sample whose prompt is also
    trained on measures memory, not the drafter."""
    if groups is None:
        n_eval = min(math.ceil(eval_frac * n), n - 1) if eval_frac > 0 else 0
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        return perm[n_eval:].sort().values, perm[:n_eval].sort().values
    keys = list(dict.fromkeys(groups))  # distinct keys, in first-seen order
    if eval_frac <= 0 or len(keys) < 2:
        return torch.arange(n), torch.zeros(0, dtype=torch.int64)
    score = {k: _unit_hash(seed, k) for k in keys}
    held = {k for k in keys if score[k] < eval_frac}
    if not held:
        held = {min(keys, key=score.__getitem__)}
    if len(held) == len(keys):
        held.discard(max(keys, key=score.__getitem__))
    is_eval = torch.tensor([g in held for g in groups], dtype=torch.bool)
    return (~is_eval).nonzero().flatten(), is_eval.nonzero().flatten()


def _unit_hash(seed: int, key: Hashable) -> float:
    """A number in [0, 1) fixed by (seed, key) across runs and processes (no Python `hash`, which is salted)."""
    raw = key if isinstance(key, bytes) else repr(key).encode()
    digest = hashlib.blake2b(raw, digest_size=8, key=seed.to_bytes(8, "little", signed=True)).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def make_batches(lengths: torch.Tensor, batch_tokens: int) -> list[torch.Tensor]:
    """Sample ids grouped by length: each batch has rows * (its longest length) <= batch_tokens (at least one row)."""
    order = torch.argsort(lengths, stable=True).tolist()
    lens = lengths.tolist()
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * lens[i] > batch_tokens:  # sorted: lens[i] is the batch's longest
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return [torch.tensor(b, dtype=torch.int64) for b in batches]


def epoch_order(n_batches: int, seed: int, epoch: int) -> list[int]:
    """The batch order of one epoch (a function of seed and epoch only, so a resumed run repeats it)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_batches, generator=g).tolist()


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] int64, right-padded with 0
    mask: torch.Tensor  # [B, T] bool, loss tokens (false on padding)
    lengths: torch.Tensor  # [B] int64

    @property
    def n_tokens(self) -> int:
        return int(self.lengths.sum())


def padded_length(longest: int, pad_to: int = 1) -> int:
    """A batch's length T: its longest sample rounded up to a multiple of `pad_to` (gather_batch)."""
    return -(-longest // pad_to) * pad_to


def gather_batch(ds: TokenDataset, ids: torch.Tensor, pad_to: int = 1) -> Batch:
    """Rows `ids` of a (device-resident) dataset as one padded batch, in one gather; the length is rounded up to a
    multiple of `pad_to` (few distinct shapes: the GPU's per-shape first-call costs are paid a few times only)."""
    dev = ds.tokens.device
    ids = ids.to(dev)
    starts = ds.offsets[ids]
    lens = ds.offsets[ids + 1] - starts
    T = padded_length(int(lens.max()), pad_to)
    ar = torch.arange(T, device=dev)
    inside = ar[None, :] < lens[:, None]  # [B, T]
    flat = (starts[:, None] + ar[None, :]).clamp(max=len(ds.tokens) - 1)
    tokens = torch.where(inside, ds.tokens[flat], 0)
    mask = ds.mask[flat] & inside
    return Batch(tokens, mask, lens)
