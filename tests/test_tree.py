"""Tree construction and the drafting loop against brute-force references."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_drafter, tiny_llama

from eaglespec.layers.context import ForwardContext
from eaglespec.spec.draft import catch_up, draft_tree
from eaglespec.spec.tree import build_tree
from eaglespec.engine.kv_cache import KVCache


def random_candidates(B, S, K, gen):
    """Level-order candidates as the drafting loop makes them, with random log-probs (cumulative scores)."""
    toks, scores, parents, depth = [], [], [], []
    for b in range(B):
        t, s, p, d = [], [], [], []
        lvl = torch.rand(K, generator=gen).log()
        t += torch.randperm(100, generator=gen)[:K].tolist()
        s += lvl.tolist()
        p += [-1] * K
        d += [1] * K
        frontier = list(range(K))
        for level in range(2, S + 1):
            base = len(t)
            for f in frontier:
                t += torch.randperm(100, generator=gen)[:K].tolist()
                s += (s[f] + torch.rand(K, generator=gen).log()).tolist()
                p += [f] * K
                d += [level] * K
            children = list(range(base, len(t)))
            frontier = sorted(children, key=lambda c: -s[c])[:K]
        toks.append(t), scores.append(s), parents.append(p), depth.append(d)
    f = lambda x, dt: torch.tensor(x, dtype=dt)
    return f(toks, torch.int64), f(scores, torch.float32), f(parents, torch.int64), f(depth, torch.int64)


def brute_force_tree(root, tokens, scores, parents, depth, D):
    """Plain-Python reference: best D-1 by score (ties: lower index), index order, root first."""
    N = len(tokens)
    keep = sorted(sorted(range(N), key=lambda i: (-scores[i], i))[: D - 1])
    pos = {c: i + 1 for i, c in enumerate(keep)}
    node_tok = [root] + [tokens[c] for c in keep]
    node_par = [-1] + [pos[parents[c]] if parents[c] >= 0 else 0 for c in keep]
    node_depth = [0] + [depth[c] for c in keep]
    anc = []
    for i in range(D):
        a, j = set(), i
        while j >= 0:
            a.add(j)
            j = node_par[j]
        anc.append(a)
    children = [[j for j in range(D) if node_par[j] == i] for i in range(D)]
    return node_tok, node_par, node_depth, anc, children


@pytest.mark.parametrize("S,K,D", [(1, 1, 2), (3, 1, 4), (5, 1, 4), (7, 1, 8), (4, 2, 7), (5, 4, 8), (6, 8, 32), (3, 3, 10)])
def test_build_tree_matches_brute_force(S, K, D):
    gen = torch.Generator().manual_seed(S * 100 + K * 10 + D)
    B = 3
    tok, sc, par, dep = random_candidates(B, S, K, gen)
    root = torch.tensor([7, 8, 9])
    tree = build_tree(root, tok, sc, par, dep, D, K, S)
    if K > 1:
        assert tree.children is None  # built only when read (sampled verification): greedy steps skip its operators
    for b in range(B):
        nt, npar, nd, anc, ch = brute_force_tree(root[b].item(), tok[b].tolist(), sc[b].tolist(), par[b].tolist(),
                                                dep[b].tolist(), D)
        assert tree.tokens[b].tolist() == nt
        assert tree.parents[b].tolist() == npar
        assert tree.depth[b].tolist() == nd
        for i in range(D):
            assert {j for j in range(D) if tree.ancestors[b, i, j]} == anc[i]
            assert [c for c in tree.child_table()[b, i].tolist() if c >= 0] == ch[i]
            path = [n for n in tree.paths[b, i].tolist() if n >= 0]
            assert path == sorted(anc[i], key=lambda j: nd[j])
        for leaf in range(D):
            if not ch[leaf]:
                assert tree.is_leaf()[b, leaf]


def test_ties_keep_parents():
    """Children with probability 1 tie with their parent; the parent must still be kept before the child."""
    tok = torch.tensor([[1, 2, 3, 4]])
    sc = torch.tensor([[-0.5, -0.5, -0.5, -0.5]])  # every child has the parent's score
    par = torch.tensor([[-1, 0, 1, 2]])
    dep = torch.tensor([[1, 2, 3, 4]])
    tree = build_tree(torch.tensor([0]), tok, sc, par, dep, 4, 1, 4)
    assert tree.tokens[0].tolist() == [0, 1, 2, 3]
    assert tree.parents[0].tolist() == [-1, 0, 1, 2]


def _sequential_path_logp(drafter, prefix_tokens, prefix_aux, path_tokens):
    """Reference: run the drafter token by token along one path (no tree mask), summing log-probs of the path.

    prefix: the committed pairs (aux at i, token at i+1); then the path's tokens one at a time, each with the hidden
    the previous step returned, exactly as inference without a tree would.
    """
    L = prefix_tokens.shape[1]
    n = L + len(path_tokens) + 1
    kv = KVCache(1, drafter.kv_cache_shapes(), 1, n, torch.float32, "cpu")
    pos = torch.arange(L)[None]
    mask = torch.ones(L, L, dtype=torch.bool).tril()[None]
    ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=mask, kv=kv.layers())
    logits, hidden = drafter(prefix_tokens, prefix_aux, ctx, from_target=True)
    logp = torch.log_softmax(logits[0, -1], -1)
    h = hidden[:, -1:]
    total = 0.0
    for i, t in enumerate(path_tokens):
        d = (t - drafter.d2t).eq(torch.arange(len(drafter.d2t))).nonzero()  # draft id of target id t
        total += logp[d.item()].item()
        if i == len(path_tokens) - 1:
            break
        p = L + i
        ctx = ForwardContext(positions=torch.tensor([[p]]), write_index=torch.tensor([[p]]),
                             attn_mask=torch.ones(1, 1, p + 1, dtype=torch.bool), kv=kv.layers())
        logits, h = drafter(torch.tensor([[t]]), h, ctx, from_target=False)
        logp = torch.log_softmax(logits[0, -1], -1)
    return total


def _sequential_chain(drafter, prefix_tokens, prefix_aux, steps: int) -> list[int]:
    """The greedy chain run one token at a time: each token the drafter's argmax (as a target id) after the last."""
    L = prefix_tokens.shape[1]
    kv = KVCache(1, drafter.kv_cache_shapes(), 1, L + steps + 1, torch.float32, "cpu")
    pos = torch.arange(L)[None]
    ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=torch.ones(L, L, dtype=torch.bool).tril()[None],
                         kv=kv.layers())
    logits, h = drafter(prefix_tokens, prefix_aux, ctx, from_target=True)
    h = h[:, -1:]
    out: list[int] = []
    for i in range(steps):
        d = logits[0, -1].argmax().item()
        out.append(d + drafter.d2t[d].item())
        p = L + i
        ctx = ForwardContext(positions=torch.tensor([[p]]), write_index=torch.tensor([[p]]),
                             attn_mask=torch.ones(1, 1, p + 1, dtype=torch.bool), kv=kv.layers())
        logits, h = drafter(torch.tensor([[out[-1]]]), h, ctx, from_target=False)
    return out


@pytest.mark.parametrize("S,K", [(3, 1), (4, 3)])
def test_draft_tree_scores_equal_sequential_drafting(S, K):
    """Every candidate's score from the batched, tree-masked loop equals running the drafter along its path alone;
    a greedy chain (K = 1) carries no scores and its tokens are the drafter's argmax run one token at a time."""
    torch.manual_seed(0)
    target = tiny_llama(seed=0)
    drafter = tiny_drafter(target, seed=1)
    drafter.set_embed_and_head(*target.get_embed_and_head())
    L = 9
    tokens = torch.randint(0, 97, (1, L))
    aux = torch.randn(1, L, 3 * 64)
    kv = KVCache(1, drafter.kv_cache_shapes(), 1, L + S * K + S + 2, torch.float32, "cpu")

    def step(tok, hid, pos, write, mask, from_target, logits_index):
        ctx = ForwardContext(positions=pos, write_index=write, attn_mask=mask, kv=kv.layers(),
                             logits_index=logits_index)
        return drafter(tok, hid, ctx, from_target=from_target)

    Lt = torch.tensor([L])
    st = catch_up(step, tokens, aux, torch.tensor([0]), Lt, L, K)
    c = draft_tree(step, drafter.to_target_ids, st, Lt, S, K, L + (S - 1) * K)
    assert c.tokens.shape[1] == K + (S - 1) * K * K
    if K == 1:
        assert c.scores is None
        assert c.tokens[0].tolist() == _sequential_chain(drafter, tokens, aux, S)
        return
    for i in range(c.tokens.shape[1]):
        path, j = [], i
        while j >= 0:
            path.append(c.tokens[0, j].item())
            j = c.parents[0, j].item()
        ref = _sequential_path_logp(drafter, tokens, aux, path[::-1])
        assert c.scores[0, i].item() == pytest.approx(ref, abs=1e-4)


@pytest.mark.parametrize("T", [1, 4])
def test_causal_mask_equals_prefix_tail_mask(T):
    """The decode step's and the catch-up's one-kernel mask (from positions prefix + t) is the general prefix +
    causal-tail mask."""
    from eaglespec.layers.context import causal_mask, causal_tail, prefix_tail_mask

    lens = torch.tensor([0, 3, 7, 12])
    kv_len = 12 + T + 2  # positions past every row's tail too
    want = prefix_tail_mask(lens, causal_tail(4, T, "cpu"), kv_len)
    got = causal_mask(lens[:, None] + torch.arange(T)[None, :], kv_len)
    assert got.shape == want.shape == (4, T, kv_len) and torch.equal(got, want)


def test_chain_mask_is_the_trees_visibility():
    """A chain's level masks (draft_chain: all levels from their positions L + entry in one `causal_mask`, level
    major) equal the tree visibility they replace: entry k sees the prefix and scratch entries 0..k."""
    from eaglespec.layers.context import cached_arange, causal_mask, prefix_tail_mask

    lens, W, kv_len = torch.tensor([2, 5, 9]), 4, 16
    masks = causal_mask(lens[None, :] + cached_arange(W, lens.device)[:, None], kv_len)  # [W, B, kv_len]
    seen = torch.ones(W, W, dtype=torch.bool).tril()
    for entry in range(W):
        want = prefix_tail_mask(lens, seen[entry][None, None, :].expand(3, 1, W), kv_len)
        assert torch.equal(masks[entry][:, None, :], want)


def test_prefix_tail_mask_brute_force():
    """Position p of row b is visible to query t iff p < prefix[b] or (p - prefix[b] < W and tail[b, t, p - prefix])."""
    from eaglespec.layers.context import prefix_tail_mask

    gen = torch.Generator().manual_seed(5)
    lens, T, W, kv_len = torch.tensor([0, 3, 6]), 3, 5, 13
    tail = torch.rand(3, T, W, generator=gen) < 0.5
    got = prefix_tail_mask(lens, tail, kv_len)
    for b in range(3):
        for t in range(T):
            for p in range(kv_len):
                r = p - int(lens[b])
                assert bool(got[b, t, p]) == (r < 0 or (r < W and bool(tail[b, t, r])))


@pytest.mark.parametrize("S,D", [(3, 4), (4, 3), (1, 2)])
def test_chain_verification_equals_the_general_rule(S, D):
    """verify_greedy_chain (the engine's greedy chains) gives verify_greedy's result field for field, for every
    accepted length (D <= S + 1: a chain may verify fewer tokens than it drafted)."""
    from eaglespec.spec.verify import verify_greedy, verify_greedy_chain

    gen = torch.Generator().manual_seed(S * 10 + D)
    B, V = 64, 5
    cand = torch.randint(0, V, (B, S), generator=gen)
    tree = build_tree(torch.randint(0, V, (B,), generator=gen), cand, None, None, None, D, 1, S)
    logits = torch.randn(B, D, V, generator=gen)
    hit = torch.rand(B, D, generator=gen) < 0.7  # most nodes predicted right, so every run length occurs
    nxt = torch.cat((tree.tokens[:, 1:], tree.tokens[:, :1]), 1)
    logits.scatter_add_(2, nxt[..., None], torch.where(hit, 10.0, 0.0)[..., None])
    a, b = verify_greedy(tree, logits), verify_greedy_chain(tree, logits)
    for f in ("accept_len", "best", "path", "tokens", "bonus"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert set(a.accept_len.tolist()) == set(range(D))


@pytest.mark.parametrize("K", [1, 3])
def test_catch_up_reads_no_pair_past_each_rows_length(K):
    """catch_up over T pairs with `lengths` real ones per row: the state (top ids, their log-probabilities, hidden)
    and the KV of the real positions do not depend on the padding pairs' tokens or aux states (the commit hands a
    chain's aux states over ungathered, whose padding differs from the gathered path's)."""
    torch.manual_seed(0)
    target = tiny_llama(seed=0)
    drafter = tiny_drafter(target, seed=1)
    drafter.set_embed_and_head(*target.get_embed_and_head())
    B, T, L = 3, 4, 12
    tokens = torch.randint(0, 97, (B, T))
    aux = torch.randn(B, T, 3 * 64)
    start, lengths = torch.tensor([5, 0, 7]), torch.tensor([1, 4, 2])
    states, kvs = [], []
    for pad in (False, True):
        t, a = tokens.clone(), aux.clone()
        if pad:  # other padding: new tokens and states past each row's length
            past = torch.arange(T)[None, :] >= lengths[:, None]
            t[past] = 3
            a[past] = torch.randn(int(past.sum()), 3 * 64)
        kv = KVCache(1, drafter.kv_cache_shapes(), B, L, torch.float32, "cpu")  # one layer, B rows

        def step(tok, hid, pos, write, mask, from_target, logits_index, kv=kv):
            ctx = ForwardContext(positions=pos, write_index=write, attn_mask=mask, kv=kv.layers(),
                                 logits_index=logits_index)
            return drafter(tok, hid, ctx, from_target=from_target)

        states.append(catch_up(step, t, a, start, lengths, L, K))
        kvs.append(kv)
    a, b = states
    assert torch.equal(a.top_ids, b.top_ids) and torch.allclose(a.hidden, b.hidden, atol=1e-6)
    if K > 1:
        assert torch.allclose(a.top_logp, b.top_logp, atol=1e-6)
    for row in range(B):
        real = slice(0, int(start[row] + lengths[row]))  # the prefix and the real pairs
        for x, y in zip(kvs[0].layers()[0], kvs[1].layers()[0]):
            assert torch.allclose(x[row, real], y[row, real], atol=1e-6)
