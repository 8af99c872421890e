"""The drafting loop (REFERENCE.md §4, DESIGN.md step 2) over an abstract drafter step.

The engine passes `step(tokens, hidden, positions, write_index, attn_mask, from_target, logits_index) -> (logits,
hidden_out)`, one drafter forward over [B, T] tokens with its own KV cache (rows and the KV tensors are bound by the
engine; logits_index [B, R] or None: both outputs at those positions only, else at all T), and
`to_target(ids)` mapping draft-vocabulary ids to target ids. This module never sees a model class.

Conventions (L = committed length of row b, equal for the target and the drafter):
- the drafter entry at position i pairs the target hidden at position i with the token at position i+1 and predicts
  the token at i+2; after a catch-up, `DraftState` holds the top-K draft ids / log-probs of the last committed entry
  (candidates for position L+1, depth 1 under the root at position L) and that entry's output hidden;
- tree level k >= 2 runs the drafter once on the K frontier nodes of depth k-1, at position L-1+(k-1), writing K
  scratch entries at L + (k-2)K + j; each entry sees the committed prefix, the scratch entries of its ancestors and
  itself (`vis`, a [B, K, (S-1)K + 1] mask over the scratch and a false pad column, so that a level's mask is two
  kernels: `masked_tail`); children score = parent score + log-prob, and the global top-K of the K^2 children is
  the next frontier.
- `catch_up` runs the drafter over committed tokens with the target's aux states (after prefill or verification) and
  returns the next `DraftState`.
- A chain (K = 1) takes `draft_chain`: the same forwards, positions, writes and visibility (entry k-2 sees the
  scratch entries 0..k-2, so its mask is one compare against the cache positions), without the frontier selection,
  whose top-k, gathers and masks are identities there.
- Sampled chains (`draft_chain(..., sampling=(T, top_k, top_p))`, the engine's non-greedy steps): a row with T > 0
  draws each draft token from the drafter's distribution processed like the target's (temperature, top-k, top-p:
  `target_probs`), q, and the candidates carry q (`Candidates.q`, [B, S, Vd]) for `verify_sampling`'s min(1, p/q)
  rule, which accepts about sum(min(p, q)) per token instead of p(argmax q) for a deterministic draft. SmolLM2,
  expected depth-1 acceptance (`benchmarks/sampled_acceptance.py`): T = 1: 0.355 vs 0.226; T = 1 top-k 5: 0.409 vs
  0.326 (an unprocessed q would get 0.313, below the deterministic draft); T = 0.7 top-p 0.9: 0.439 vs 0.407. A row
  with T = 0 keeps its argmax, with a one-hot q (the deterministic rule). The depth-1 distribution comes from the
  catch-up (`DraftState.logits`, the last committed entry's logits, kept for chains). Each level's q and its draw
  come from one `sample_probs` call (on CUDA: the probability kernels run the exponential race and the merge maps
  the draft id to the target id), with no log-probabilities. Trees keep deterministic top-K drafts.
- Structured outputs (`guide`, a `DraftGuide`): depth 1 is re-chosen from the catch-up's stored logits among the
  draft tokens the rows' grammars allow (a device mask: graph steps too); in eager steps (`DraftGuide.paths`) each
  deeper level's drafter logits are masked to the tokens allowed after each frontier node's path (the paths read
  on the host), so that drafts stay inside the grammar the verify masks by. A tree guided at depth 1 only keeps
  the level kernels.
- A chain's catch-up takes the argmax of the logits and no log-probabilities (`DraftState.top_logp` None): no chain
  uses scores (it keeps all its candidates). So chain steps skip the float copy, log-softmax and max over the draft
  vocabulary (~20 us of single-block kernels per catch-up on the H200).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from ..layers import topk_kernel, tree_build_kernels
from ..layers.chain_start_kernel import causal_rows, chain_start
from ..layers.context import cached_arange, masked_tail, tail_index
from ..layers.sampling import Draws, greedy_ids, sample_probs
from ..layers.tree_inputs_kernel import tree_draft_start

DrafterStep = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass
class DraftGuide:
    """Structured outputs' guide for drafting: `root` [B, Vd] bool, the draft tokens each row's grammar allows at
    depth 1 (its current state; all true in rows without a grammar); `rows` [B] bool: the rows with one; `paths`
    (eager steps; None: unguided below depth 1, as graph steps draft), paths per row and node (the target ids drafted
    below the root) -> the draft tokens the rows' grammars allow after each, [B, J, Vd] bool. A tree re-chooses depth
    1 from the catch-up's logits in `rows` only: another row's stored logits may be older than its top-K (a step that
    kept no logits caught it up since)."""
    root: torch.Tensor
    rows: torch.Tensor
    paths: Callable[[list], torch.Tensor] | None = None


@dataclass
class DraftState:
    top_ids: torch.Tensor  # [B, K] draft-vocab ids of the best next tokens (depth 1)
    top_logp: torch.Tensor | None  # [B, K] their log-probabilities (None for chains: module docstring)
    hidden: torch.Tensor  # [B, H] output hidden of the last committed drafter entry
    logits: torch.Tensor | None = None  # [B, Vd] the depth-1 logits (chains: sampled drafting)


@dataclass
class Candidates:
    tokens: torch.Tensor  # [B, N] target ids
    scores: torch.Tensor | None  # [B, N] cumulative log-prob (None for chains: build_tree keeps their first D-1)
    parents: torch.Tensor  # [B, N] candidate index of the parent, -1 = root
    depth: torch.Tensor  # [B, N]
    q: torch.Tensor | None = None  # [B, N, Vd] sampled chains: the distribution each candidate was drawn from


def topk_logp(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., Vd] -> (ids [..., k], log-probs [..., k]) in float32, best first. Trees only: chains take an
    argmax of the logits instead. On CUDA one Triton kernel (layers/topk_kernel.py: PyTorch's float copy, log-softmax
    and multi-block radix top-k cost ~40 us per call on the H200 for 4 rows of 12K); elsewhere, and for shapes the
    kernel does not hold, the log-softmax then the top k."""
    if logits.is_cuda and topk_kernel.fits(logits.shape[-1], k):
        return topk_kernel.logsoftmax_topk(logits, k)
    return topk_logp_reference(logits, k)


def frontier_ids(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [B, N] -> the indices of the k best [B, k], best first: the next tree level's frontier. On CUDA the
    top-k kernel's raw mode (one kernel instead of topk's two, ~10 us per level on the H200); elsewhere topk."""
    if scores.is_cuda and topk_kernel.fits(scores.shape[-1], k):
        return topk_kernel.topk_values(scores, k)[0]
    return scores.topk(k, dim=-1).indices


def topk_logp_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    vals, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return ids, vals


Sampling = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # per row: temperature [B], top_k [B], top_p [B]


def sample_draft(logits: torch.Tensor, sampling: Sampling, generator: Draws,
                 to_target: Callable[[torch.Tensor], torch.Tensor],
                 target_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sampled draft token per row: the drafter's logits [B, Vd] and the rows' sampling parameters -> (target ids
    [B, 1], q [B, Vd]), q = the drafter's distribution processed as the target's is (`target_probs`: one-hot at the
    argmax for T = 0) and the token drawn from it (`sample_probs`; with `target_ids` its draw maps the id itself).
    No scores: a chain keeps all its candidates. Fixed shapes, no host synchronisation."""
    ids, q = sample_probs(logits, *sampling, generator, target_ids)
    ids = ids[:, None]
    return (ids if target_ids is not None else to_target(ids)), q


def catch_up(
    step: DrafterStep,
    tokens: torch.Tensor,
    aux: torch.Tensor,
    start: torch.Tensor | None,
    lengths: torch.Tensor | None,
    kv_len: int,
    topk: int,
    keep_logits: bool = False,
    at: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> DraftState:
    """Feed T committed (token, target hidden) pairs per row at positions start..start+T-1.

    tokens [B, T]: the token at position p+1 for each hidden at p; aux [B, T, n_aux*Ht]; start [B] (= committed
    length before these pairs); lengths [B] real pairs per row (1..T; the rest is padding that later writes
    overwrite). `at` = (positions [B, T], causal mask [B, T, kv_len], last real pair [B, 1]) built by the caller
    (the commit's `commit_kernel.advance_rows`) replaces start and lengths. Returns the state at each row's last real
    pair (with its logits when `keep_logits`); for topk 1 (chains) the argmax only, without log-probabilities
    (module docstring).
    """
    B, T = tokens.shape
    if at is not None:
        positions, mask, last = at
    else:
        assert start is not None and lengths is not None
        positions, mask = causal_rows(start, T, kv_len)
        last = (lengths - 1)[:, None]
    logits, hidden = step(tokens, aux, positions, positions, mask, True, last)
    last_logits = logits[:, 0]  # [B, Vd]
    if topk == 1:
        ids, logp = greedy_ids(last_logits)[:, None], None
    else:
        ids, logp = topk_logp(last_logits, topk)
    h_last = hidden[:, 0]  # [B, H]: with logits_index the step returns those positions' hidden only
    return DraftState(top_ids=ids, top_logp=logp, hidden=h_last, logits=last_logits if keep_logits else None)


def draft_tree(
    step: DrafterStep,
    to_target: Callable[[torch.Tensor], torch.Tensor],
    state: DraftState,
    seq_len: torch.Tensor,
    steps: int,
    topk: int,
    kv_len: int,
    sampling: Sampling | None = None,
    generator: Draws = None,
    target_ids: torch.Tensor | None = None,
    kernels: bool | None = None,
    guide: DraftGuide | None = None,
) -> Candidates:
    """Run S-1 batched drafter forwards and return all K + (S-1)K^2 candidates in level order. `sampling` (chains
    only; None: greedy drafts) samples the drafts (module docstring). With `target_ids` (the table `to_target`
    looks up: draft id -> target id) a tree's levels run their bookkeeping as one Triton kernel each
    (`layers/tree_build_kernels.draft_level`: the same candidates), when `kernels` (default: on CUDA) and the
    shapes fit. `guide` (structured outputs): depth 1 chooses among the tokens the rows' grammars allow (from
    `state.logits`, in `guide.rows`), and with `guide.paths` each further level among those allowed after each
    frontier node's path (`draft_chain`'s rule; the nodes' paths read on the host at each level), which takes this
    path, not the kernels'."""
    B, K = state.top_ids.shape
    dev = state.top_ids.device
    if K == 1:
        return draft_chain(step, to_target, state, seq_len, steps, kv_len, sampling, generator, target_ids, guide)
    W = max((steps - 1) * K, 1)  # scratch entries
    if guide is not None:  # depth 1 re-chosen inside the grammars, in the rows that have one
        assert state.logits is not None and state.top_logp is not None, "guided drafting needs the catch-up's logits"
        g_ids, g_logp = topk_logp(_guided(state.logits, guide.root), K)
        state = DraftState(torch.where(guide.rows[:, None], g_ids, state.top_ids),
                           torch.where(guide.rows[:, None], g_logp, state.top_logp), state.hidden, state.logits)
    paths = guide.paths if guide is not None else None
    use = (dev.type == "cuda" if kernels is None else kernels) and paths is None
    if use and target_ids is not None and steps >= 2 and tree_build_kernels.fits_level(K, state.hidden.shape[-1], W):
        return _draft_tree_kernels(step, target_ids, state, seq_len, steps, K, kv_len)
    slots, own, depth = _tree_constants(K, steps, dev)
    top_ids, top_logp = state.top_ids, state.top_logp
    c_tokens = [to_target(top_ids)]
    c_scores = [top_logp]
    c_parents = [torch.full((B, K), -1, dtype=torch.int64, device=dev)]
    f_idx = slots.expand(B, K)  # candidate ids of the frontier
    f_tok, f_score = c_tokens[0], top_logp
    f_hidden = state.hidden[:, None, :].expand(B, K, state.hidden.shape[-1])
    # per step, not per level: the cache column each position reads and the level-2 write slots
    index, before = tail_index(seq_len, W, kv_len)
    write0 = seq_len[:, None] + slots[None, :]  # [B, K]
    vis = own[0].expand(B, K, W + 1)  # frontier slot j -> its level-2 entry j (column W: the false pad)
    base = K
    for level in range(2, steps + 1):
        entry = (level - 2) * K
        positions = (seq_len + (level - 2))[:, None].expand(B, K)  # L-1+(level-1)
        write = write0 + entry if entry else write0
        mask = masked_tail(index, before, vis)
        logits, hidden = step(f_tok, f_hidden, positions, write, mask, False, None)
        if paths is not None:
            logits = _guided(logits, paths(_node_paths(c_tokens, c_parents, f_idx)))
        ids, logp = topk_logp(logits, K)  # [B, K, K]
        scores = (f_score[:, :, None] + logp).reshape(B, K * K)
        toks = to_target(ids).reshape(B, K * K)
        c_tokens.append(toks)
        c_scores.append(scores)
        c_parents.append(f_idx[:, :, None].expand(B, K, K).reshape(B, K * K))
        if level == steps:
            break
        f_best = frontier_ids(scores, K)  # [B, K] among the K^2 children
        f_parent_slot = f_best // K
        f_idx = base + f_best
        f_tok = torch.gather(toks, 1, f_best)
        f_score = torch.gather(scores, 1, f_best)
        f_hidden = torch.gather(hidden, 1, f_parent_slot[..., None].expand(B, K, hidden.shape[-1]))
        # the next level's entry j belongs to frontier slot j, which also sees its parent's entries
        vis = torch.gather(vis, 1, f_parent_slot[..., None].expand(B, K, W + 1)) | own[level - 1]
        base += K * K
    return Candidates(
        tokens=torch.cat(c_tokens, 1),
        scores=torch.cat(c_scores, 1),
        parents=torch.cat(c_parents, 1),
        depth=depth.expand(B, depth.shape[0]),
    )


def _draft_tree_kernels(step: DrafterStep, target_ids: torch.Tensor, state: DraftState, seq_len: torch.Tensor,
                        steps: int, K: int, kv_len: int) -> Candidates:
    """`draft_tree` for trees with each level's bookkeeping in one kernel (`tree_build_kernels.draft_level`), which
    writes the candidates straight into their [B, N] tables (no concatenation) and hands the next level its frontier,
    its visibility and its attention mask; the positions and write slots of every level, level 2's mask and the
    depth-1 tokens come from one kernel before them (`tree_inputs_kernel.tree_draft_start`)."""
    B = state.top_ids.shape[0]
    dev = state.top_ids.device
    W = (steps - 1) * K
    N = K + (steps - 1) * K * K
    _, own, depth = _tree_constants(K, steps, dev)
    cands = (torch.empty(B, N, dtype=torch.int64, device=dev), torch.empty(B, N, dtype=torch.float32, device=dev),
             torch.empty(B, N, dtype=torch.int64, device=dev))
    # [2, S-1, B, K]: RoPE positions L + (level - 2) and write slots L + (level - 2) K + j of each level; level 2's
    # mask; the depth-1 tokens in target ids (one kernel on CUDA: layers/tree_inputs_kernel.py)
    pos_write, mask, f_tok = tree_draft_start(seq_len, state.top_ids, target_ids, steps, kv_len)
    vis = own[0].expand(B, K, W + 1)
    f_score = state.top_logp
    f_idx = cached_arange(K, dev).expand(B, K)
    f_hidden = state.hidden[:, None, :].expand(B, K, state.hidden.shape[-1])
    base = K
    for level in range(2, steps + 1):
        logits, hidden = step(f_tok, f_hidden, pos_write[0, level - 2], pos_write[1, level - 2], mask, False, None)
        ids, logp = topk_logp(logits, K)  # [B, K, K]
        last = level == steps
        nxt = tree_build_kernels.draft_level(ids, logp, f_tok, f_score, f_idx, target_ids, hidden, vis,
                                             own[level - 1] if not last else own[0], seq_len, cands, base,
                                             level == 2, last, kv_len)
        if nxt is None:
            break
        f_tok, f_score, f_idx, f_hidden, vis, mask = nxt
        base += K * K
    return Candidates(tokens=cands[0], scores=cands[1], parents=cands[2], depth=depth.expand(B, N))


@functools.cache  # never evicted: captured CUDA graphs read these tensors by address
def _tree_constants(K: int, steps: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (K, S, device), built once and only read: slots = arange(K); own [S-1, K, W+1]: level l+2's scratch
    entries, entry j owned by frontier slot j (column W always false: the pad `masked_tail` reads past the tail);
    depth [N] of the level-ordered candidates (K at depth 1, then K^2 per level)."""
    W = max((steps - 1) * K, 1)
    own = torch.zeros(max(steps - 1, 1), K, W + 1, dtype=torch.bool, device=device)
    for lvl in range(steps - 1):
        own[lvl, :, lvl * K : (lvl + 1) * K] = torch.eye(K, dtype=torch.bool, device=device)
    depth = torch.cat([torch.ones(K, dtype=torch.int64, device=device)]
                      + [torch.full((K * K,), lv, dtype=torch.int64, device=device) for lv in range(2, steps + 1)])
    return torch.arange(K, device=device), own, depth


def draft_chain(
    step: DrafterStep,
    to_target: Callable[[torch.Tensor], torch.Tensor],
    state: DraftState,
    seq_len: torch.Tensor,
    steps: int,
    kv_len: int,
    sampling: Sampling | None = None,
    generator: Draws = None,
    target_ids: torch.Tensor | None = None,
    guide: DraftGuide | None = None,
) -> Candidates:
    """`draft_tree` for K = 1: S-1 drafter forwards on one token per row; the S candidates of a chain. With
    `sampling` the tokens are sampled (`sample_draft`; needs `state.logits`) and `Candidates.q` is set. Greedy chains
    take each level's argmax of the logits; no chain computes scores (`Candidates.scores` None): a chain keeps its
    first D-1 candidates whatever their scores, so the float copy and log-softmax over the draft vocabulary (~11 us
    per level on the H200, `benchmarks/replay_probe.py`'s trace) and the score sums are skipped. With `target_ids`
    (the table `to_target` looks up) the argmax or the sampled draw maps its ids itself (`greedy_ids(logits,
    table)`, `sample_probs(..., table)`: one kernel less per level). With `guide` (a step holding structured outputs)
    depth 1 chooses among the tokens the rows' grammars allow (from the catch-up's logits, `state.logits`), and with
    `guide.paths` each further level among those allowed after the chain so far, so that drafts stay inside the
    grammar the verify masks by; q is then the masked distribution (lossless either way: only acceptance changes).
    A row whose grammar allows no draft token drafts unguided."""
    B = state.top_ids.shape[0]
    dev = state.top_ids.device
    parents, depth = _chain_constants(steps, dev)
    levels = max(steps - 1, 1)
    tokens = torch.empty(B, steps, dtype=torch.int64, device=dev)  # [B, S] the candidates, level by level
    qs: list[torch.Tensor] = []
    paths = guide.paths if guide is not None else None
    if guide is not None:  # a chain's logits are fresh in every row (chains always keep them)
        assert state.logits is not None, "guided drafting needs the catch-up's logits (keep_logits)"
        state = DraftState(state.top_ids, state.top_logp, state.hidden, _guided(state.logits, guide.root))
        if sampling is None:
            state.top_ids = greedy_ids(state.logits)[:, None]
    # a chain's level k (entry e = k - 2) runs at position L-1+(k-1) = L+e, which is also its scratch entry, and
    # sees the committed prefix and scratch entries 0..e, i.e. every cache position <= L+e: all levels' positions
    # [S-1, B] and masks [S-1, B, kv_len] at once (level-major, so each level's [B, 1] and [B, 1, kv_len] slices are
    # contiguous), one kernel on CUDA, which greedy chains with the id table give the depth-1 lookup too
    if sampling is None and target_ids is not None:
        at_all, masks = chain_start(seq_len, state.top_ids, target_ids, levels, kv_len, tokens)
    else:
        at_all, masks = causal_rows(seq_len, levels, kv_len, level_major=True)
        if sampling is None:
            tokens[:, :1] = to_target(state.top_ids)
        else:
            assert state.logits is not None, "sampled drafting needs the catch-up's logits (keep_logits)"
            tok, q = sample_draft(state.logits, sampling, generator, to_target, target_ids)
            tokens[:, :1] = tok
            qs.append(q)
    hidden = state.hidden[:, None, :]  # [B, 1, H]
    for level in range(2, steps + 1):
        entry = level - 2
        at = at_all[entry][:, None]  # [B, 1]
        tok = tokens[:, entry:entry + 1]  # [B, 1] the level before's tokens (a view)
        logits, hidden = step(tok, hidden, at, at, masks[entry][:, None, :], False, None)
        if paths is not None:
            logits = _guided(logits, paths([[path] for path in tokens[:, :level - 1].tolist()]))
        if sampling is None:
            if target_ids is not None:  # the argmax writes its column itself
                greedy_ids(logits[:, 0], target_ids, out=tokens[:, level - 1])
            else:
                tokens[:, level - 1:level] = to_target(greedy_ids(logits[:, 0])[:, None])
        else:
            tok, q = sample_draft(logits[:, 0], sampling, generator, to_target, target_ids)
            tokens[:, level - 1:level] = tok
            qs.append(q)
    return Candidates(
        tokens=tokens,
        scores=None,
        parents=parents.expand(B, steps),
        depth=depth.expand(B, steps),
        q=torch.stack(qs, 1) if qs else None,
    )


def _node_paths(c_tokens: list[torch.Tensor], c_parents: list[torch.Tensor], nodes: torch.Tensor) -> list:
    """The target ids on each of `nodes`' paths below the root ([B][K] lists), walked up the candidates' parents
    on the host (candidate ids as `f_idx` names them; parent -1: the root)."""
    tokens, parents = torch.cat(c_tokens, 1).tolist(), torch.cat(c_parents, 1).tolist()
    out = []
    for toks, pars, ids in zip(tokens, parents, nodes.tolist()):
        row = []
        for j in ids:
            path = []
            while j >= 0:
                path.append(toks[j])
                j = pars[j]
            row.append(path[::-1])
        out.append(row)
    return out


def _guided(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """logits [..., Vd] masked to `allowed` (same shape, bool), except in rows that allow none."""
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    return logits.masked_fill(~allowed, float("-inf"))


@functools.cache  # never evicted: captured CUDA graphs read these tensors by address
def _chain_constants(steps: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (S, device), built once and only read: the S candidates' parents (candidate i-1; the first: -1, the
    root) and depths (i+1)."""
    node = torch.arange(steps, device=device)
    return node - 1, node + 1
