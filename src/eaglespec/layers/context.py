"""Per-forward metadata, carried in one explicit object (never in globals).

A forward runs B rows of T new tokens each. Row b lives in cache row `rows[b]`; token t of row b has the RoPE position
`positions[b, t]` and writes its K/V into cache position `write_index[b, t]`. The attention of token t may read cache
positions `[0, kv_len)` wherever `attn_mask[b, t, j]` is true (and, in a sliding-window layer, the key's position is
less than the window behind the token's; in a chunked layer, Llama 4's, it lies in the token's chunk: `mask(window)`).
This one shape covers every forward the engine runs:

- prefill of a prompt (write 0..n-1, causal), and batched prefill of prompts of different lengths (right padding:
  padded queries compute garbage that is never read, and no real query sees a padded key);
- decode (T = 1);
- tree verification (write L..L+D-1 in tree order, positions L + depth, mask = prefix + ancestors);
- drafter tree levels (scratch entries after the committed drafter prefix, mask = prefix + ancestor entries).

`ForwardContext.plain(B, T)` is the cache-free causal forward used for parity tests and training.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass(frozen=True)
class Chunk:
    """Llama 4's chunked attention, a layer's `window` in place of a sliding one: a query at position p sees the keys
    at positions [p - p % size, p] only (its chunk of `size` positions)."""

    size: int


@dataclass
class ForwardContext:
    positions: torch.Tensor  # [B, T] int64, RoPE positions
    write_index: torch.Tensor | None = None  # [B, T] int64 cache positions; None: no cache (plain forward)
    attn_mask: torch.Tensor | None = None  # [B, T, kv_len] bool over cache positions, or [B, T, T] without cache
    kv: Sequence[Sequence[torch.Tensor]] | None = None  # per layer: cache tensors [Bc, S_max, ...]
    rows: torch.Tensor | None = None  # [B] int64 cache rows; None: rows 0..B-1
    logits_index: torch.Tensor | None = None  # [B, R] positions whose logits are wanted; None: all T
    # the mask is exactly causal over this forward's own T tokens, which are each row's positions 0..T-1 (kv_len == T):
    # a plain forward, a prefill of fresh rows. Attention may then run as SDPA's is_causal without reading the mask
    # (layers/attention.py). Right-padded rows keep it: no real query sees a padded key.
    causal: bool = False
    _memo: dict = field(default_factory=dict, repr=False, compare=False)  # per-forward values shared by layers

    def row_index(self, batch: int) -> torch.Tensor:
        """[B] cache rows (computed once per forward, not once per layer)."""
        if "rows" not in self._memo:
            if self.rows is not None:
                self._memo["rows"] = self.rows
            elif torch.is_inference_mode_enabled():  # the engine's steps: no arange kernel in every forward
                self._memo["rows"] = cached_arange(batch, self.positions.device)
            else:  # a fresh arange: a tensor cached under inference mode cannot enter a forward that autograd
                #    records (drafter tests and training run the same layers with gradients)
                self._memo["rows"] = torch.arange(batch, device=self.positions.device)
        return self._memo["rows"]

    def key_positions(self) -> torch.Tensor:
        """[B, K] the position of each key the mask covers: a cache position is its key's position for everything
        committed (prefill, decode, compaction), but this forward's keys carry their own (a verified tree's nodes are
        written at L + i and positioned at L + depth); a cache-free forward's keys are its tokens. Built once a
        forward, with static shapes."""
        if "key_positions" not in self._memo:
            m = self.mask()
            B, K = m.shape[0], m.shape[-1]
            if self.write_index is None:  # cache-free: key j is token j
                kpos = self.positions.expand(B, K)
            else:  # a fresh arange (as row_index's): no inference-mode tensor inside a forward autograd records
                kpos = torch.arange(K + 1, device=m.device).expand(B, K + 1).clone()
                # writes past the mask's K keys (a padded row's) land on the spare column K
                kpos.scatter_(1, self.write_index.clamp(max=K), self.positions.expand_as(self.write_index))
                kpos = kpos[:, :K]
            self._memo["key_positions"] = kpos
        return self._memo["key_positions"]

    def mask(self, window: int | Chunk | None = None) -> torch.Tensor:
        """`attn_mask` [B, T, K], or for a sliding-window layer the same without the keys whose positions are
        `window` or more behind the query's, for a chunked layer (`Chunk`) without those outside the query's chunk
        (built once per forward and window; the keys' positions from `key_positions`, exact for a tree's nodes)."""
        if window is None:
            assert self.attn_mask is not None
            return self.attn_mask
        key = ("window", window)
        if key not in self._memo:
            kpos = self.key_positions()[:, None, :]  # [B, 1, K]
            if isinstance(window, Chunk):
                near = kpos >= (self.positions - self.positions % window.size)[..., None]
            else:
                near = kpos > self.positions[..., None] - window
            self._memo[key] = self.mask() & near
        return self._memo[key]

    def attn_bias(self, dtype: torch.dtype, window: int | Chunk | None = None) -> torch.Tensor:
        """`mask(window)` as SDPA's additive bias [B, 1, T, K] (0 visible, -inf hidden), built once per forward."""
        key = ("bias", dtype, window)
        if key not in self._memo:
            m = self.mask(window)
            zero = torch.zeros((), dtype=dtype, device=m.device)
            ninf = torch.full((), float("-inf"), dtype=dtype, device=m.device)
            self._memo[key] = torch.where(m, zero, ninf)[:, None]
        return self._memo[key]

    @property
    def kv_len(self) -> int:
        assert self.attn_mask is not None
        return self.attn_mask.shape[-1]

    @staticmethod
    def plain(batch: int, length: int, device: torch.device | str = "cpu") -> "ForwardContext":
        """Cache-free causal forward over `length` tokens starting at position 0."""
        pos = torch.arange(length, device=device).expand(batch, length)
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        return ForwardContext(positions=pos, attn_mask=causal.expand(batch, length, length), causal=True)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T, H], index [B, R] positions -> x at those positions [B, R, H] (`logits_index`'s rows)."""
    return torch.gather(x, 1, index[..., None].expand(-1, -1, x.shape[-1]))


@functools.cache  # never evicted: captured CUDA graphs read these tensors by address
def cached_arange(n: int, device: torch.device) -> torch.Tensor:
    """torch.arange(n) on `device`, built once per (n, device): read-only (steps use it in every replay)."""
    return torch.arange(n, device=device)


def prefix_tail_mask(prefix_lens: torch.Tensor, tail_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Dense visibility mask over cache positions.

    prefix_lens [B]: positions < prefix_lens[b] are visible to every query of row b.
    tail_mask [B, T, W]: visibility of cache positions prefix_lens[b] + w, for w < W.
    Returns [B, T, kv_len] bool. (The tail is padded with one invisible column that every position past it reads, so
    the mask costs a handful of kernels: it is built in every decode, draft and verify step.)
    """
    index, before = tail_index(prefix_lens, tail_mask.shape[-1], kv_len)
    return masked_tail(index, before, torch.nn.functional.pad(tail_mask, (0, 1)))  # column W: false


def tail_index(prefix_lens: torch.Tensor, width: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-step half of `prefix_tail_mask`, for callers that build several masks over one prefix (a draft tree's
    levels): (index [B, 1, K], the tail column each cache position reads, width for positions past the tail;
    before [B, 1, K], positions inside the prefix)."""
    rel = cached_arange(kv_len, prefix_lens.device)[None, :] - prefix_lens[:, None]  # [B, K] offset into the tail
    return rel.clamp(0, width)[:, None, :], (rel < 0)[:, None, :]


def masked_tail(index: torch.Tensor, before: torch.Tensor, padded_tail: torch.Tensor) -> torch.Tensor:
    """[B, T, K] bool from `tail_index`'s tensors and a tail mask padded with one false column, [B, T, W+1]: two
    kernels (a gather and an or)."""
    B, T, _ = padded_tail.shape
    return before | torch.gather(padded_tail, 2, index.expand(B, T, index.shape[-1]))


def causal_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """positions [..., T] integers -> [..., T, kv_len] bool: query t sees cache positions <= positions[..., t]. For
    tokens appended in order after a cached prefix (prefill, decode, a chain's verify, the drafter's catch-up and
    chain levels) that is `prefix_tail_mask(prefix, causal_tail(B, T), kv_len)` with positions = prefix + t, in one
    kernel from the positions the step computes anyway."""
    return cached_arange(kv_len, positions.device) <= positions[..., None]


def causal_tail(batch: int, length: int, device: torch.device | str) -> torch.Tensor:
    """[B, T, T] lower-triangular tail mask for T new tokens appended in order."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril().expand(batch, length, length)
