"""The speculative step of `ModelRunner` (runner.py), in a file of its own: a mixin of the runner's speculative methods,
which read and write the runner's state (caches, per-row tensors, sampling, the drafter's rows) as its other steps do.

- `spec_step(rows, greedy, index, lp)`: one step of shape `shapes[index]`, eagerly or (graphs) through
  `ModelRunner.launch` / `collect`; returns the accepted counts and the committed tokens per row (the step's sync);
- its three phases over explicit tensors with a static key length, what the graphs capture (three graphs, so that
  their times can be told apart; a constrained step's verify split in two, `_verify_forward` / `_verify_accept`, so
  that the host computes the tree's masks while the forward runs):
  `_spec_draft` (the drafter's tree, guided by the rows' grammars at depth 1 in a constrained step),
  `_spec_verify` (the target forward over the D tree tokens and acceptance, greedy or sampled),
  `_spec_commit` (the accepted path kept in the target KV, the drafter caught up, the rows advanced).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..config import SpecConfig
from ..layers.chain_start_kernel import causal_rows
from ..layers.commit_kernel import advance_rows
from ..layers.context import ForwardContext, cached_arange
from ..layers.row_draws import DRAFT_SITE, VERIFY_SITE
from ..layers.sampling import target_probs
from ..layers.token_mask import mask_logits
from ..layers.tree_inputs_kernel import tree_verify_inputs
from ..spec.draft import DraftGuide, draft_tree
from ..spec.tree import DraftTree, build_tree
from ..spec.verify import VerifyResult, verify_greedy, verify_greedy_chain, verify_sampling
from .step_kinds import Rows, spec_kind


class SpecStep:
    # --- speculative step ---------------------------------------------------------------------------------------
    # Three phases over explicit tensors (captured as three graphs on CUDA, so their times can be told apart).
    # kv_len >= (longest committed length) + headroom() in all three.
    def _spec_draft(self, r: Rows, ctx_rows: torch.Tensor | None, kv_len: int, greedy: bool,
                    shape: SpecConfig) -> DraftTree:
        """The draft tree of `shape`; a chain in a step with sampled rows samples their drafts (spec/draft.py) and the
        tree carries the drafter's distributions (`DraftTree.q`, node i+1's at index i) for verification."""
        S, K, D = shape.steps, shape.topk, shape.draft_tokens
        L = self.seq_len[r]
        sampled = not greedy and K == 1
        ids = self.draft.target_ids
        # a constrained step drafts inside the rows' grammars: depth 1 from the stored logits (which its catch-ups
        # keep) masked by slot 0 of `grammar_rows`; eager steps guide the further levels from the host
        guide = None
        if self.step_extras.constrained:
            paths = self.constraint.draft_paths(ids) if self.graphs is None else None
            guide = DraftGuide(self.grammar_rows.allowed(r, 0)[:, ids], self.grammar_rows.has[r], paths)
        cands = draft_tree(self._draft_step(r, ctx_rows), ids.__getitem__,
                           self.draft.state(r, K, sampled or guide is not None), L, S, K, kv_len,
                           self.sampling.params(r) if sampled else None, self._draws(r, L, DRAFT_SITE),
                           target_ids=ids, guide=guide)
        tree = build_tree(self.last_token[r], cands.tokens, cands.scores, cands.parents, cands.depth, D, K, S)
        if cands.q is not None:  # node i >= 1 is candidate i-1; the root was not drafted
            tree.q = cands.q[:, : D - 1]  # [B, D-1, Vd]
        return tree

    def _spec_verify(self, r: Rows, ctx_rows: torch.Tensor | None, kv_len: int, tree: DraftTree,
                     greedy: bool, shape: SpecConfig, lp: int | None = None) -> tuple[VerifyResult, torch.Tensor]:
        """Target forward over the D tree tokens (positions L + depth, written at L..L+D-1, each seeing the prefix
        and its ancestors) and acceptance; returns the result and the aux states [B, D, n_aux*H]. A constrained
        step masks node j's logits by slot j of `grammar_rows` (StepGrammar.tree_bits), before any adjustment."""
        return self._verify_accept(r, tree, greedy, shape, lp, *self._verify_forward(r, ctx_rows, kv_len, tree, shape))

    def _verify_forward(self, r: Rows, ctx_rows: torch.Tensor | None, kv_len: int, tree: DraftTree,
                        shape: SpecConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """The verify's target forward: (logits [B, D, V], aux states [B, D, n_aux*H]). A constrained graph step
        replays it apart from `_verify_accept`, so that the host computes the tree's masks while it runs."""
        L = self.seq_len[r]
        # positions, write slots and mask in one kernel on CUDA (layers/chain_start_kernel.py, tree_inputs_kernel.py)
        if shape.topk == 1:  # node i at depth i: positions are the write slots, the mask is causal over them
            positions, mask = causal_rows(L, shape.draft_tokens, kv_len)
            write = positions
        else:  # positions L + depth, written at L + i, each node seeing the prefix and its ancestors
            positions, write, mask = tree_verify_inputs(L, tree.depth, tree.ancestors, kv_len)
        ctx = ForwardContext(positions=positions, write_index=write, attn_mask=mask, kv=self.kv.layers(), rows=ctx_rows)
        out = self.target(tree.tokens, ctx)
        return out.logits, out.aux_hidden

    def _verify_accept(self, r: Rows, tree: DraftTree, greedy: bool, shape: SpecConfig, lp: int | None,
                       raw: torch.Tensor, aux: torch.Tensor) -> tuple[VerifyResult, torch.Tensor]:
        """Acceptance over the verify's logits raw [B, D, V] (masked, adjusted; log-probabilities from the raw ones);
        returns the result and the aux states, passed through."""
        D = shape.draft_tokens
        B = self._count(r)
        L = self.seq_len[r]
        chain = shape.topk == 1
        logits = raw  # [B, D, V]; adjusted at each node for the tokens on its path (RowAdjust.tree_logits)
        if self.step_extras.constrained:
            logits = mask_logits(logits, self.grammar_rows.allowed(r, slice(0, D)))
        if self.step_extras.adjusted:
            logits = self.adjust.tree_logits(r, logits, tree, L + 1, self.sampling.temperature[r])
        if greedy:
            res = (verify_greedy_chain if chain else verify_greedy)(tree, logits)
        else:
            V = logits.shape[-1]
            probs = target_probs(logits.reshape(B * D, V),
                                 *(t.repeat_interleave(D) for t in self.sampling.params(r)))
            # sampled chains: the drafter's distributions (over its draft vocabulary: read through draft_index)
            res = verify_sampling(tree, probs.view(B, D, V), self._draws(r, L, VERIFY_SITE), tree.q,
                                  self.draft.draft_index if tree.q is not None else None)
        if lp is not None:  # committed token i was chosen from the logits of path node i (the bonus: the deepest's)
            S1, V = res.path.shape[1], raw.shape[-1]
            rows_logits = torch.gather(raw, 1, res.path[..., None].expand(B, S1, V))  # [B, S+1, V]
            self.lp_buffer.store(r, rows_logits.reshape(B * S1, V), res.tokens.reshape(-1), lp, S1)
        return res, aux

    def _spec_commit(self, r: Rows, ctx_rows: torch.Tensor | None, kv_len: int, res: VerifyResult,
                     aux_all: torch.Tensor, shape: SpecConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the accepted path in the target KV, catch the drafter up, advance the row state."""
        S1 = shape.steps + 1
        B = self._count(r)
        rows_t = self._row_index(r)
        if shape.topk > 1:  # tree slots L + path[i] -> L + i (a chain's accepted nodes 0..m already lie there)
            self.kv.compact(rows_t, self.seq_len[r], res.path)
        if shape.topk == 1 and aux_all.shape[1] == S1:  # a chain's path is 0..m, then m again: its first m+1
            aux = aux_all  # pairs are aux_all's own, and the catch-up reads no further (the rest is padding)
        else:
            aux = torch.gather(aux_all, 1, res.path[..., None].expand(B, S1, aux_all.shape[-1]))
        # the catch-up's positions L..L+S, mask and last real pair, and the rows' advance (L + m + 1 where active,
        # the bonus as the last token), in one kernel on CUDA (layers/commit_kernel.py)
        if self.step_extras.adjusted:  # the committed tokens join the counts (two kernels no other step pays)
            committed = cached_arange(S1, self.device)[None, :] <= res.accept_len[:, None]  # [B, S+1]
            self._add_counts(r, res.tokens, committed & self.active[r][:, None])
        at = advance_rows(self.seq_len, self.last_token, self.active, rows_t, res.accept_len, res.bonus, S1, kv_len)
        self._catch_up(r, ctx_rows, res.tokens, aux, None, None, kv_len, at=at)
        return res.accept_len, res.tokens

    @torch.inference_mode()
    def spec_step(self, rows: Sequence[int], greedy: bool, index: int = 0,
                  lp: int | None = None) -> tuple[list[int], list[list[int]]]:
        """One speculative step of shape `shapes[index]`; returns, per requested row, the accepted draft count m and
        the committed tokens (m drafts then the bonus: S+1 entries, of which the first m+1 count). Reading them is
        the step's sync (and, in a constrained step, reading the draft tree's tokens)."""
        if self.graphs is not None:
            m_g, toks_g = self.collect(self.launch(spec_kind(index), rows, greedy, lp=lp))
            assert m_g is not None
            return m_g, toks_g
        shape = self.shapes[index]
        Lmax = max(self.host_len[i] for i in rows)
        r, ctx_rows = self._rows(rows)
        kv_len = Lmax + self.headroom()
        if self.constraint is not None:
            self.load_grammar_root(rows)
        with self.timer.phase("draft"):
            tree = self._spec_draft(r, ctx_rows, kv_len, greedy, shape)
        with self.timer.phase("verify"):
            if self.constraint is not None:
                self._load_tree_masks(rows, self._tree_to_host(rows, tree, by_row=False))
            res, aux = self._spec_verify(r, ctx_rows, kv_len, tree, greedy, shape, lp)
        with self.timer.phase("commit"):
            m_t, tok_t = self._spec_commit(r, ctx_rows, kv_len, res, aux, shape)
        m, toks = m_t.tolist(), tok_t.tolist()
        for i, k in zip(rows, m):
            self.host_len[i] += k + 1
        return m, toks
