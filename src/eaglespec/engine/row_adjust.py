"""Each cache row's logit adjustments on the device (penalties, logit_bias, min_tokens, min_p: layers/logit_adjust.py),
and the output-token counts they read.

Contract of `RowAdjust(rows, vocab, device)`: nothing is allocated until a request that adjusts its logits arrives
(`SamplingParams.adjusts_logits`); from then on, per row: counts [rows, V] int32 (its output tokens so far),
seen [rows, V] bool (its prompt's tokens, for the repetition penalty), bias [rows, V] float32, stops [rows, V] bool
(what min_tokens bans), and rep / freq / pres / min_p [rows] float32, min_tokens / prompt_len [rows] int64. A row
with neutral parameters is left unchanged by the adjustment, so rows that ask for nothing may share a step with one
that does.
- `set(row, params, prompt, stop_ids)`: a request's parameters into its row, as enqueued fills and copies from
  pinned memory (no synchronisation); its counts start at zero;
- `tensors()`: every per-row tensor (moved with a row: `ModelRunner.move_row`); `state()`: those a step mutates (the
  counts: snapshotted around graph warm-ups);
- `logits(r, logits, committed, temperature)`: a step's logits [B, V] adjusted, where row b has committed[b] tokens
  (its prompt's included) before the one these logits choose;
- `tree_logits(r, logits, tree, committed, temperature)`: a verify step's logits [B, D, V] (committed[b]: the row's
  tokens up to the root), node n of row b seeing the row's counts plus the tokens on its draft path
  (layers/logit_adjust.tree_logits), with committed[b] + depth(n) tokens before the one it chooses;
- `draft_adjuster(r, table, temperature)`: a function adjusting the drafter's logits [B, T, Vd] over its vocabulary
  (table [Vd]: each draft id's target id) by the rows' counts as they stand (not a draft path's: drafting guesses,
  verification decides), its min_tokens ban by the rows' output counts; a position whose every draft token is
  banned keeps its raw logits;
- `count(rows, tokens, valid)`: tokens [B, W] committed where valid [B, W] join the rows' counts.
Rows `r` are an index tensor, or slice(0, B) in graph phases (views); `rows` of `count` an index tensor [B].
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence, Union

import torch

from ..layers.logit_adjust import adjust_logits, apply_terms, min_p_cut, row_terms, tree_logits
from ..sampling_params import SamplingParams
from ..spec.tree import DraftTree
from .host_upload import upload

Rows = Union[torch.Tensor, slice]


class RowAdjust:
    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.rows, self.vocab, self.device = rows, vocab, device
        self.ready = False

    def _allocate(self) -> None:
        R, V, dev = self.rows, self.vocab, self.device
        self.counts = torch.zeros(R, V, dtype=torch.int32, device=dev)
        self.seen = torch.zeros(R, V, dtype=torch.bool, device=dev)
        self.bias = torch.zeros(R, V, dtype=torch.float32, device=dev)
        self.stops = torch.zeros(R, V, dtype=torch.bool, device=dev)
        self.rep = torch.ones(R, dtype=torch.float32, device=dev)
        self.freq = torch.zeros(R, dtype=torch.float32, device=dev)
        self.pres = torch.zeros(R, dtype=torch.float32, device=dev)
        self.min_p = torch.zeros(R, dtype=torch.float32, device=dev)
        self.min_tokens = torch.zeros(R, dtype=torch.int64, device=dev)
        self.prompt_len = torch.zeros(R, dtype=torch.int64, device=dev)
        self.ready = True

    def set(self, row: int, params: SamplingParams, prompt: Sequence[int], stop_ids: Collection[int]) -> None:
        """`stop_ids`: what min_tokens bans (the request's stop tokens, and EOS unless it ignores it)."""
        if not self.ready:
            if not params.adjusts_logits:
                return
            self._allocate()
        self.rep[row].fill_(params.repetition_penalty)
        self.freq[row].fill_(params.frequency_penalty)
        self.pres[row].fill_(params.presence_penalty)
        self.min_p[row].fill_(params.min_p)
        self.min_tokens[row].fill_(params.min_tokens)
        self.prompt_len[row].fill_(len(prompt))
        self.counts[row].zero_()
        for t in (self.seen, self.bias, self.stops):
            t[row].zero_()
        dev, i64 = self.device, torch.int64  # host lists go up without synchronising (host_upload.py)
        if params.repetition_penalty != 1:
            self.seen[row].index_fill_(0, upload(prompt, dev, i64), True)
        if params.allowed_token_ids is not None:  # every other token -inf, which no bias below lifts
            self.bias[row].fill_(float("-inf")).index_fill_(0, upload(params.allowed_token_ids, dev, i64), 0.0)
        if params.logit_bias:
            ids, values = zip(*params.logit_bias)
            self.bias[row].index_add_(0, upload(ids, dev, i64), upload(values, dev, torch.float32))
        if params.min_tokens and stop_ids:
            self.stops[row].index_fill_(0, upload(stop_ids, dev, i64), True)

    def tensors(self) -> list[torch.Tensor]:
        if not self.ready:
            return []
        return [self.counts, self.seen, self.bias, self.stops, self.rep, self.freq, self.pres, self.min_p,
                self.min_tokens, self.prompt_len]

    def state(self) -> list[torch.Tensor]:
        return [self.counts] if self.ready else []

    def _tables(self, r: Rows) -> tuple[torch.Tensor, ...]:
        return self.counts[r], self.seen[r], self.stops[r], self.bias[r], self.rep[r], self.freq[r], self.pres[r]

    def logits(self, r: Rows, logits: torch.Tensor, committed: torch.Tensor,
               temperature: torch.Tensor) -> torch.Tensor:
        """logits [B, V], committed [B] int64, temperature [B] -> float32 [B, V] (module docstring)."""
        banned = committed - self.prompt_len[r] < self.min_tokens[r]  # [B]: fewer outputs than min_tokens so far
        return adjust_logits(logits, *self._tables(r), banned, self.min_p[r], temperature)

    def tree_logits(self, r: Rows, logits: torch.Tensor, tree: DraftTree, committed: torch.Tensor,
                    temperature: torch.Tensor) -> torch.Tensor:
        """logits [B, D, V], committed [B] int64 (the root included), temperature [B] -> float32 [B, D, V]."""
        outputs = committed - self.prompt_len[r]  # [B]: output tokens up to the root
        banned = outputs[:, None] + tree.depth < self.min_tokens[r][:, None]  # [B, D]: outputs before node n's choice
        return tree_logits(logits, tree, *self._tables(r), banned, self.min_p[r], temperature)

    def draft_adjuster(self, r: Rows, table: torch.Tensor,
                       temperature: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """table [Vd] int64, temperature [B] -> a function of the drafter's logits [B, T, Vd] -> float32 [B, T, Vd]
        (module docstring). The rows' tables are taken over the draft vocabulary once, here: the counts do not move
        while a step drafts, so its S - 1 drafter forwards share them."""
        def pick(t: torch.Tensor) -> torch.Tensor:  # [rows, V] -> the rows' [B, 1, Vd]
            return t[r].index_select(1, table)[:, None, :]

        banned = (self.counts[r].sum(-1) < self.min_tokens[r])[:, None]  # [B, 1]: by the output tokens so far
        per_row = [t[:, None] for t in (self.rep[r], self.freq[r], self.pres[r])]  # [B, 1]: against the positions
        terms = row_terms(pick(self.counts), pick(self.seen), pick(self.stops), *per_row)
        bias, min_p, temperature = pick(self.bias), self.min_p[r][:, None], temperature[:, None]

        def adjust(logits: torch.Tensor) -> torch.Tensor:
            out = min_p_cut(apply_terms(logits, bias, terms, banned), min_p, temperature)
            # a row that bans its whole draft vocabulary (allowed_token_ids all outside it) drafts from its raw
            # logits: all -inf would make its distribution NaN (its drafts are then rejected, as any token outside
            # p's support)
            return torch.where(torch.isinf(out).all(-1, keepdim=True), logits.float(), out)

        return adjust

    def count(self, rows: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """rows [B] int64, tokens [B, W] int64, valid [B, W] bool: one more of each valid token in its row's counts."""
        flat = rows[:, None] * self.vocab + tokens  # [B, W] into counts viewed as [rows * V]: a scatter-add
        # (atomic on CUDA, no synchronisation, graph-capturable), repeated tokens adding up
        self.counts.view(-1).scatter_add_(0, flat.reshape(-1), valid.to(torch.int32).reshape(-1))
