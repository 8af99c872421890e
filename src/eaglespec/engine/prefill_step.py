"""The prefill step of `ModelRunner` (runner.py), in a file of its own: a mixin of the runner's prefill methods, which
read and write the runner's state (caches, per-row tensors, sampling, the drafter's catch-up) as its other steps do.

- `prefill(rows, prompts, greedy, mm_inputs, lp, starts)`: fresh rows' prompts (right-padded) through the target,
  their first tokens (sampled as any step samples: `ModelRunner._sample`), and the drafter's catch-up over the
  prompt; a CUDA graph per (rows, length bucket) for text prompts that fit one (`GraphCache.prefill_plan`), eager
  otherwise (images, long prompts, many rows, the CPU); a step holding a structured output loads its rows' masks
  first (`load_grammar_root`). `starts` (prefix reuse, scheduler.py): per row, the prompt positions whose target and
  drafter cache entries the row already holds; only the rest is computed (eagerly), attending to them. A text
  prompt with more than `prefill_chunk` tokens left runs first in windows of that many (`_prefill_window`: the
  target's entries and the drafter's pairs, each window attending to the ones before it), and then its last window
  as a reused prefix's rest, with the other prompts;
- `launch_prefill` / `collect_prefill`: the same, its first tokens copied to the host without waiting (overlap);
- `_prefill_core(r, ids, lens_t, greedy, lp)`: the whole prefill over explicit rows and static tensors, what the
  prefill graphs capture.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..layers.context import ForwardContext, causal_mask
from ..layers.row_draws import PREFILL_SITE
from .pending_step import PendingStep


class PrefillStep:
    @torch.inference_mode()
    def prefill(self, rows: Sequence[int], prompts: Sequence[Sequence[int]], greedy: bool,
                mm_inputs: Sequence[object | None] | None = None, lp: int | None = None,
                starts: Sequence[int] | None = None) -> torch.Tensor:
        """Prefill fresh rows; returns the first generated token per row [B] (on the device).

        `mm_inputs` (one per row, None for text-only rows) are the opaque objects a multimodal target's
        `prepare_multimodal` returned; the target turns them into input embeddings (`embed_multimodal`).
        Text prompts of up to PREFILL_GRAPH_MAX tokens run as a CUDA graph per (rows, length bucket) (right-padded to
        the bucket; up to PREFILL_GRAPH_ROWS rows and PREFILL_GRAPH_TOKENS padded tokens; target and drafter
        catch-up in one graph, timed as "prefill"), up to PREFILL_SPLIT_ROWS rows as several such graphs
        (`GraphCache.prefill_plan`); other prefills (images, long prompts, many rows, the CPU) run eagerly, as do
        prefills that reuse cached prefixes (`starts`, text prompts only: positions < starts[b] are not computed).
        """
        lens = [len(p) for p in prompts]
        has_mm = mm_inputs is not None and any(m is not None for m in mm_inputs)
        C = self.prefill_chunk
        if C is not None and not has_mm and any(n - s > C for n, s in zip(lens, starts or [0] * len(lens))):
            starts = list(starts or [0] * len(lens))
            for b, (row, p) in enumerate(zip(rows, prompts)):  # each long prompt's windows but its last, alone
                while lens[b] - starts[b] > C:
                    self._prefill_window(row, p, starts[b], C)
                    starts[b] += C
        reuse = starts is not None and any(starts)
        assert not (reuse and has_mm), "prompts with images are prefilled whole"
        if self.constraint is not None:
            self.load_grammar_root(rows)
        groups = self.graphs.prefill_plan(lens) if self.graphs is not None and not has_mm and not reuse else None
        if groups is not None:
            with self.timer.phase("prefill"):
                tok = self.graphs.prefill_groups(list(rows), prompts, greedy, groups, lp)
        else:
            r, ctx_rows = self._rows(rows)
            first = list(starts) if reuse else [0] * len(rows)  # type: ignore[arg-type]
            chunks = [p[k:] for p, k in zip(prompts, first)]
            B, T = len(rows), max(len(c) for c in chunks)
            ids = torch.zeros(B, T, dtype=torch.int64)
            for b, c in enumerate(chunks):
                ids[b, : len(c)] = torch.tensor(c, dtype=torch.int64)
            ids = ids.to(self.device)
            lens_t = torch.tensor([len(c) for c in chunks], dtype=torch.int64, device=self.device)
            # reused prefixes: the chunks' positions (padding folded onto the cache's last slot, which no step reads
            # before writing it: a short chunk after a long prefix, padded to a long one, would run past the cache)
            after = None
            if reuse:
                start = torch.tensor(first, dtype=torch.int64, device=self.device)
                pos = (start[:, None] + torch.arange(T, device=self.device)).clamp(max=self.cache_len - 1)
                after = (start, pos, max(lens))
            with self.timer.phase("prefill"):
                tok, aux = self._prefill_target(r, ctx_rows, ids, lens_t, greedy, mm_inputs if has_mm else None,
                                                lp, after)
            if self.spec is not None:
                with self.timer.phase("draft"):
                    self._prefill_draft(r, ctx_rows, ids, lens_t, tok, aux, after)
        for row, n in zip(rows, lens):
            self.host_len[row] = n
        return tok

    def launch_prefill(self, rows: Sequence[int], prompts: Sequence[Sequence[int]], greedy: bool,
                       mm_inputs: Sequence[object | None] | None = None, lp: int | None = None,
                       starts: Sequence[int] | None = None) -> PendingStep:
        """`prefill` enqueued with the copy of its first tokens (and with `lp` their log-probability rows, [B, 1, W]
        in the order of `rows`) to the host, without waiting for them: the overlapped engine launches the next step
        first and then reads them (`collect_prefill`), so the device does not idle between an admission's prefill and
        the step after it. The rows' host lengths are set now."""
        tok = self.prefill(rows, prompts, greedy, mm_inputs, lp, starts)
        lps = None  # [B, 1, 1 + 2k]: the columns the prefill wrote
        if lp is not None:
            lps = self.lp_buffer.gather(self._rows(rows)[0], lp, first=1).contiguous()
        return self.results.prefill(list(rows), tok, lps)

    @staticmethod
    def collect_prefill(pending: PendingStep) -> list[int]:
        """The first tokens of a launched prefill, in the order of its prompts (waits for that prefill only)."""
        if pending.event is not None:
            pending.event.synchronize()
        return pending.tokens.tolist()

    def _prefill_window(self, row: int, prompt: Sequence[int], start: int, size: int) -> None:
        """One window of a long prompt in row `row`: its tokens [start, start + size) through the target (attending
        to the row's entries before `start`; a first window is a causal forward of its own), and the drafter's
        pairs (hidden at i, token at i + 1) over it, the last one's token the next window's first. Nothing is
        sampled: the prompt's last window does that (`prefill`)."""
        dev = self.device
        r, ctx_rows = self._rows([row])
        ids = torch.tensor([prompt[start : start + size + 1]], dtype=torch.int64, device=dev)  # [1, size + 1]
        pos = start + torch.arange(size, device=dev)[None, :]
        mask = causal_mask(pos, start + size)
        last = torch.full((1, 1), size - 1, dtype=torch.int64, device=dev)
        with self.timer.phase("prefill"):
            ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=mask, kv=self.kv.layers(), rows=ctx_rows,
                                 logits_index=last, causal=start == 0)
            aux = self.target(ids[:, :size], ctx).aux_hidden
        if self.spec is not None:
            with self.timer.phase("draft"):
                self._catch_up(r, ctx_rows, ids[:, 1:], aux, None, None, start + size, at=(pos, mask, last))

    def _prefill_target(self, r: torch.Tensor, ctx_rows: torch.Tensor | None, ids: torch.Tensor,
                        lens_t: torch.Tensor, greedy: bool, mm_inputs: Sequence[object | None] | None = None,
                        lp: int | None = None, after: tuple[torch.Tensor, torch.Tensor, int] | None = None):
        """ids [B, T] right-padded, lens_t [B] -> (first token [B], aux states or None); sets the rows' state.
        Positions past a row's length write KV entries that no later step reads before overwriting them. `after`
        (reused prefixes): (start [B], the tokens' positions [B, T], the key length): the ids are the prompts from
        `start` on, which attend to the row's entries before it."""
        B, T = ids.shape
        dev = self.device
        if after is None:
            pos = torch.arange(T, device=dev).expand(B, T)
            ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=causal_mask(pos, T),
                                 kv=self.kv.layers(), rows=ctx_rows, logits_index=(lens_t - 1)[:, None], causal=True)
            full = lens_t
        else:
            start, pos, kv_len = after
            ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=causal_mask(pos, kv_len),
                                 kv=self.kv.layers(), rows=ctx_rows, logits_index=(lens_t - 1)[:, None])
            full = start + lens_t  # the prompts' lengths
        if mm_inputs is not None:
            out = self.target(None, ctx, inputs_embeds=self.target.embed_multimodal(ids, list(mm_inputs)))
        else:
            out = self.target(ids, ctx)
        tok = self._sample(out.logits[:, 0], r, greedy, full, PREFILL_SITE, full)
        self._add_counts(r, tok[:, None], torch.ones_like(tok, dtype=torch.bool)[:, None])
        if lp is not None:
            self.lp_buffer.store(r, out.logits[:, 0], tok, lp)
        self.seq_len[r] = full
        self.last_token[r] = tok
        self.active.index_fill_(0, r, True)  # a scalar fill: no host->device copy (graph-capturable)
        return tok, out.aux_hidden

    def _prefill_draft(self, r: torch.Tensor, ctx_rows: torch.Tensor | None, ids: torch.Tensor, lens_t: torch.Tensor,
                       tok: torch.Tensor, aux: torch.Tensor,
                       after: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> None:
        """The drafter's catch-up over the prompt: pairs (hidden at i, token at i+1), the new token last (`after`:
        over the prompt from `start` on, as `_prefill_target` took it)."""
        B, T = ids.shape
        shifted = torch.cat((ids[:, 1:], ids[:, :1]), dim=1)
        shifted.scatter_(1, (lens_t - 1)[:, None], tok[:, None])
        if after is None:
            zeros = torch.zeros(B, dtype=torch.int64, device=self.device)
            self._catch_up(r, ctx_rows, shifted, aux, zeros, lens_t, T)
        else:
            _, pos, kv_len = after
            self._catch_up(r, ctx_rows, shifted, aux, None, None, kv_len,
                           at=(pos, causal_mask(pos, kv_len), (lens_t - 1)[:, None]))

    def _prefill_core(self, r: torch.Tensor, ids: torch.Tensor, lens_t: torch.Tensor, greedy: bool,
                      lp: int | None = None) -> torch.Tensor:
        """The whole prefill of explicit rows r [B] over static tensors (what the prefill graphs capture)."""
        tok, aux = self._prefill_target(r, r, ids, lens_t, greedy, lp=lp)
        if self.spec is not None:
            self._prefill_draft(r, r, ids, lens_t, tok, aux)
        return tok
