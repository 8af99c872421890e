"""The model runner: owns the target, the drafter, their KV caches and the per-row device state, and executes the
three kinds of step as tensor programs (DESIGN.md "One speculative step, as data"):

- `prefill(rows, prompts)`: one batched target forward over right-padded prompts (capturing aux states when
  speculating), the first sampled token, and the drafter's catch-up over the prompt;
- `decode(rows)`: one target token per row;
- `spec_step(rows)`: draft (S-1 drafter forwards over the tree frontier), build the tree, verify D tokens in one
  target forward, accept per row, compact the target KV to the accepted path and catch the drafter up.

Per-row state lives on the device (`seq_len`, `last_token`, sampling parameters, the drafter's top-K and hidden);
the host keeps only the committed lengths, which it learns when it reads the accepted lengths: that read is the one
synchronisation of a step. Policy (which rows run) is the scheduler's; this class never decides.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import SpecConfig
from ..layers.context import ForwardContext, causal_tail, prefix_tail_mask
from ..layers.sampling import sample, target_probs
from ..sampling_params import SamplingParams
from ..spec.draft import DraftState, catch_up, draft_tree
from ..spec.tree import build_tree
from ..spec.verify import verify_greedy, verify_sampling
from .kv_cache import KVCache
from .timing import PhaseTimer


class ModelRunner:
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None,
        spec: SpecConfig | None,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        self.target, self.drafter, self.spec = target, drafter, spec if drafter is not None else None
        self.device, self.dtype = device, dtype
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.rows = 0
        self.max_len = 0
        self.kv: KVCache | None = None
        self.dkv: KVCache | None = None
        self.host_len: list[int] = []
        self.timer = PhaseTimer(device)

    @property
    def speculative(self) -> bool:
        return self.spec is not None

    # --- allocation ---------------------------------------------------------------------------------------------
    def headroom(self) -> int:
        """Cache positions a step may write past the committed length."""
        if self.spec is None:
            return 1
        return max(self.spec.draft_tokens, self.spec.steps + 1)

    def allocate(self, rows: int, max_len: int) -> None:
        """(Re)allocate caches and row state for `rows` sequences of up to `max_len` committed tokens."""
        dev, cfg = self.device, self.target.config
        self.rows, self.max_len = rows, max_len
        self.kv = KVCache(cfg.num_hidden_layers, self.target.kv_cache_shapes(), rows, max_len + self.headroom(),
                          self.dtype, dev)
        self.seq_len = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.last_token = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.temperature = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=dev)
        self.host_len = [0] * rows
        if self.spec is not None:
            S, K = self.spec.steps, self.spec.topk
            scratch = (S - 1) * K + S + 1
            self.dkv = KVCache(1, self.drafter.kv_cache_shapes(), rows, max_len + scratch + 1, self.dtype, dev)
            H = self.drafter.config.hidden_size
            self.d_top_ids = torch.zeros(rows, K, dtype=torch.int64, device=dev)
            self.d_top_logp = torch.zeros(rows, K, dtype=torch.float32, device=dev)
            self.d_hidden = torch.zeros(rows, H, dtype=self.dtype, device=dev)

    def set_sampling(self, row: int, params: SamplingParams) -> None:
        self.temperature[row] = params.temperature
        self.top_k[row] = params.top_k
        self.top_p[row] = params.top_p

    # --- helpers ------------------------------------------------------------------------------------------------
    def _rows(self, rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        t = torch.tensor(list(rows), dtype=torch.int64, device=self.device)
        contiguous = list(rows) == list(range(len(rows)))
        return t, None if contiguous else t

    def _sample(self, logits: torch.Tensor, r: torch.Tensor, greedy: bool) -> torch.Tensor:
        """logits [B, V] -> tokens [B]."""
        if greedy:
            return logits.argmax(-1)
        probs = target_probs(logits, self.temperature[r], self.top_k[r], self.top_p[r])
        return sample(probs, self.generator)

    def _draft_step(self, ctx_rows: torch.Tensor | None):
        def step(tokens, hidden, positions, write_index, mask, from_target, logits_index):
            ctx = ForwardContext(positions=positions, write_index=write_index, attn_mask=mask,
                                 kv=self.dkv.layers(), rows=ctx_rows, logits_index=logits_index)
            return self.drafter(tokens, hidden, ctx, from_target=from_target)

        return step

    def _store_draft(self, r: torch.Tensor, st: DraftState) -> None:
        self.d_top_ids[r] = st.top_ids
        self.d_top_logp[r] = st.top_logp
        self.d_hidden[r] = st.hidden.to(self.dtype)

    # --- steps --------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, rows: Sequence[int], prompts: Sequence[Sequence[int]], greedy: bool,
                mm_inputs: Sequence[object | None] | None = None) -> torch.Tensor:
        """Prefill fresh rows; returns the first generated token per row [B] (on the device).

        `mm_inputs` (one per row, None for text-only rows) are the opaque objects a multimodal target's
        `prepare_multimodal` returned; the target turns them into input embeddings (`embed_multimodal`).
        """
        r, ctx_rows = self._rows(rows)
        B, dev = len(rows), self.device
        lens = [len(p) for p in prompts]
        T = max(lens)
        ids = torch.zeros(B, T, dtype=torch.int64)
        for b, p in enumerate(prompts):
            ids[b, : len(p)] = torch.tensor(p, dtype=torch.int64)
        ids = ids.to(dev)
        lens_t = torch.tensor(lens, dtype=torch.int64, device=dev)
        pos = torch.arange(T, device=dev).expand(B, T)
        zeros = torch.zeros(B, dtype=torch.int64, device=dev)
        ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=prefix_tail_mask(zeros, causal_tail(B, T, dev), T),
                             kv=self.kv.layers(), rows=ctx_rows, logits_index=(lens_t - 1)[:, None])
        with self.timer.phase("prefill"):
            if mm_inputs is not None and any(m is not None for m in mm_inputs):
                out = self.target(None, ctx, inputs_embeds=self.target.embed_multimodal(ids, list(mm_inputs)))
            else:
                out = self.target(ids, ctx)
            tok = self._sample(out.logits[:, 0], r, greedy)
        self.seq_len[r] = lens_t
        self.last_token[r] = tok
        for row, n in zip(rows, lens):
            self.host_len[row] = n
        if self.spec is not None:
            # drafter pairs (hidden at i, token at i+1): the prompt shifted left, the new token at the end
            shifted = torch.cat((ids[:, 1:], ids[:, :1]), dim=1)
            shifted.scatter_(1, (lens_t - 1)[:, None], tok[:, None])
            with self.timer.phase("draft"):
                st = catch_up(self._draft_step(ctx_rows), shifted, out.aux_hidden, zeros, lens_t, T, self.spec.topk)
            self._store_draft(r, st)
        return tok

    @torch.inference_mode()
    def decode(self, rows: Sequence[int], greedy: bool) -> torch.Tensor:
        """One plain decoding step; returns the new token per row [B]."""
        r, ctx_rows = self._rows(rows)
        B, dev = len(rows), self.device
        L = self.seq_len[r]
        kv_len = max(self.host_len[i] for i in rows) + 1
        ctx = ForwardContext(positions=L[:, None], write_index=L[:, None],
                             attn_mask=prefix_tail_mask(L, torch.ones(B, 1, 1, dtype=torch.bool, device=dev), kv_len),
                             kv=self.kv.layers(), rows=ctx_rows)
        with self.timer.phase("decode"):
            out = self.target(self.last_token[r][:, None], ctx)
            tok = self._sample(out.logits[:, 0], r, greedy)
        self.seq_len[r] = L + 1
        self.last_token[r] = tok
        for i in rows:
            self.host_len[i] += 1
        return tok

    @torch.inference_mode()
    def spec_step(self, rows: Sequence[int], greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One speculative step; returns (accepted draft tokens m [B], committed tokens [B, S+1]: m drafts + bonus).

        The caller reads m (the step's one sync) and then calls `commit_lengths`.
        """
        assert self.spec is not None
        S, K, D = self.spec.steps, self.spec.topk, self.spec.draft_tokens
        r, ctx_rows = self._rows(rows)
        B, dev = len(rows), self.device
        L = self.seq_len[r]
        Lmax = max(self.host_len[i] for i in rows)
        step = self._draft_step(ctx_rows)
        state = DraftState(self.d_top_ids[r], self.d_top_logp[r], self.d_hidden[r])
        with self.timer.phase("draft"):
            cands = draft_tree(step, self.drafter.to_target_ids, state, L, S, K, Lmax + max((S - 1) * K, 1))
            tree = build_tree(self.last_token[r], cands.tokens, cands.scores, cands.parents, cands.depth, D, K, S)
        # verify: D tree tokens at positions L + depth, written at L..L+D-1, each seeing the prefix and its ancestors
        write = L[:, None] + torch.arange(D, device=dev)[None, :]
        ctx = ForwardContext(positions=L[:, None] + tree.depth, write_index=write,
                             attn_mask=prefix_tail_mask(L, tree.ancestors, Lmax + D), kv=self.kv.layers(),
                             rows=ctx_rows)
        with self.timer.phase("verify"):
            out = self.target(tree.tokens, ctx)
            if greedy:
                res = verify_greedy(tree, out.logits)
            else:
                V = out.logits.shape[-1]
                probs = target_probs(out.logits.reshape(B * D, V), self.temperature[r].repeat_interleave(D),
                                     self.top_k[r].repeat_interleave(D), self.top_p[r].repeat_interleave(D))
                res = verify_sampling(tree, probs.view(B, D, V), self.generator)
        S1 = S + 1
        with self.timer.phase("commit"):
            # keep only the accepted path in the target KV: tree slots L + path[i] -> L + i
            self.kv.compact(r, L[:, None] + res.path, L[:, None] + torch.arange(S1, device=dev)[None, :])
            aux = torch.gather(out.aux_hidden, 1, res.path[..., None].expand(B, S1, out.aux_hidden.shape[-1]))
            n_new = res.accept_len + 1
        with self.timer.phase("draft"):
            st = catch_up(step, res.tokens, aux, L, n_new, Lmax + S1, K)
        self._store_draft(r, st)
        self.seq_len[r] = L + n_new
        self.last_token[r] = res.bonus
        return res.accept_len, res.tokens

    def commit_lengths(self, rows: Sequence[int], n_new: Sequence[int]) -> None:
        """Host mirror of the committed lengths after a speculative step."""
        for i, n in zip(rows, n_new):
            self.host_len[i] += n
