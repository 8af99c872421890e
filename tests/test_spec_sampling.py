"""Lossless sampling: the distribution of speculative output equals the target's (statistical tests, tiny vocab)."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare
from tiny import tiny_drafter, tiny_llama

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.layers.context import ForwardContext
from eaglespec.layers.sampling import target_probs
from eaglespec.sampling_params import SamplingParams
from eaglespec.spec.tree import build_tree
from eaglespec.spec.verify import verify_greedy, verify_sampling

V = 8
PROMPT = [1, 2, 3]
N_TOKENS = 3


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(seed=5, vocab=V, hidden=32, layers=2, std=0.35)
    drafter = tiny_drafter(target, seed=6, draft_vocab=None, hidden=32, std=0.35)
    return target, drafter


@pytest.fixture(scope="module")
def small_vocab_drafter(models):
    """A drafter over 5 of the 8 tokens: its sampled drafts never propose the other 3."""
    return tiny_drafter(models[0], seed=7, draft_vocab=5, hidden=32, std=0.35)


def exact_distribution(target, params: SamplingParams, adjust=None) -> dict[tuple[int, ...], float]:
    """P(x1..x3) by enumeration with the processed target distribution at every prefix (`adjust(logits [1, V],
    prefix)`: the logits adjusted for that prefix first, test_logit_adjust.py's)."""
    def q(prefix):
        ids = torch.tensor([PROMPT + list(prefix)])
        with torch.no_grad():
            logits = target(ids, ForwardContext.plain(1, ids.shape[1])).logits[0, -1:]
        if adjust is not None:
            logits = adjust(logits, list(prefix))
        return target_probs(logits, torch.tensor([params.temperature]), torch.tensor([params.top_k]),
                            torch.tensor([params.top_p]))[0].double()

    out = {}
    for seq in itertools.product(range(V), repeat=N_TOKENS):
        p = 1.0
        for i in range(N_TOKENS):
            p *= q(seq[:i])[seq[i]].item() if p > 0 else 0.0
        out[seq] = p
    return out


def sampled_counts(engine: Engine, params: SamplingParams, n: int, rows: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n // rows):
        for o in engine.generate([PROMPT] * rows, params):
            counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    return counts


def assert_same_distribution(counts, exact, n):
    assert sum(counts.values()) == n
    assert set(counts) <= {k for k, p in exact.items() if p > 0}, "sampled a sequence the target cannot produce"
    keys = sorted(exact, key=lambda k: -exact[k])
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for k in keys:
        e = exact[k] * n
        if e >= 5:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            rest_o += counts.get(k, 0)
            rest_e += e
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    exp = [e * n / sum(exp) for e in exp]
    p_value = chisquare(obs, exp).pvalue
    assert p_value > 1e-3, f"chi-square p = {p_value:.2e}"


CASES = [
    ("chain-T1", SpecConfig(3, 1, 4), SamplingParams(max_new_tokens=N_TOKENS, temperature=1.0, ignore_eos=True)),
    ("chain-T0.9-topp0.9", SpecConfig(2, 1, 3),
     SamplingParams(max_new_tokens=N_TOKENS, temperature=0.9, top_p=0.9, ignore_eos=True)),
    ("chain-T1-topk4", SpecConfig(3, 1, 4),
     SamplingParams(max_new_tokens=N_TOKENS, temperature=1.0, top_k=4, ignore_eos=True)),
    ("tree-T0.8-topk5", SpecConfig(3, 3, 8),
     SamplingParams(max_new_tokens=N_TOKENS, temperature=0.8, top_k=5, ignore_eos=True)),
    ("tree-T1.2-topp0.8", SpecConfig(3, 2, 6),
     SamplingParams(max_new_tokens=N_TOKENS, temperature=1.2, top_p=0.8, ignore_eos=True)),
]


@pytest.mark.parametrize("name,spec,params", CASES, ids=[c[0] for c in CASES])
def test_spec_sampling_matches_target_distribution(models, name, spec, params):
    target, drafter = models
    n, rows = 8000, 4000
    exact = exact_distribution(target, params)
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, seed=11), drafter=drafter, spec=spec)
    counts = sampled_counts(eng, params, n, rows)
    assert_same_distribution(counts, exact, n)
    # the drafts were really used: hundreds of verification steps accepted draft tokens, some two in a row
    hist = eng.stats.hist
    assert sum(hist[2:]) >= 100 and sum(hist[3:]) > 0


def test_sampled_chain_with_a_draft_vocabulary_matches_target_distribution(models, small_vocab_drafter):
    target, _ = models
    params = SamplingParams(max_new_tokens=N_TOKENS, temperature=1.0, ignore_eos=True)
    n, rows = 8000, 4000
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, seed=13), drafter=small_vocab_drafter,
                 spec=SpecConfig(3, 1, 4))
    assert_same_distribution(sampled_counts(eng, params, n, rows), exact_distribution(target, params), n)
    assert sum(eng.stats.hist[2:]) >= 100


def test_sampled_chain_verification_accepts_sum_min_and_keeps_the_target_distribution():
    """The rule itself, on one drafted token per row: x ~ r is accepted with probability min(1, p(x)/r(x)), so the
    acceptance rate is sum(min(p, r)) (a deterministic draft, the argmax of r, would get p(argmax r)), and the first
    committed token (x, or the bonus from max(p - r, 0)) is distributed as p."""
    from eaglespec.layers.sampling import sample
    from eaglespec.spec.tree import chain_tables

    gen = torch.Generator().manual_seed(1)
    N, Vv = 40000, 6
    p = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.1, 0.0])
    r = torch.tensor([0.1, 0.4, 0.2, 0.05, 0.05, 0.2])
    x = sample(r.expand(N, Vv).clone(), gen)
    parents, depth, ancestors, children, paths = chain_tables(2, 1, torch.device("cpu"))
    from eaglespec.spec.tree import DraftTree

    tree = DraftTree(tokens=torch.stack((torch.zeros(N, dtype=torch.int64), x), 1), parents=parents.expand(N, 2),
                     depth=depth.expand(N, 2), ancestors=ancestors.expand(N, 2, 2), children=children.expand(N, 2, 1),
                     paths=paths.expand(N, 2, 2))
    probs = torch.stack((p, torch.full((Vv,), 1 / Vv)))[None].expand(N, 2, Vv)  # node 1's q: the bonus after x
    drafted = r[None, None].expand(N, 1, Vv)  # node 1's token was drawn from r
    res = verify_sampling(tree, probs, gen, drafted)
    rate = res.accept_len.float().mean().item()
    expect = torch.minimum(p, r).sum().item()  # 0.70; p(argmax r) would be 0.25
    assert abs(rate - expect) < 4 * (expect * (1 - expect) / N) ** 0.5
    first = res.tokens[:, 0]
    counts = torch.bincount(first, minlength=Vv)
    assert counts[5] == 0  # p(5) = 0: never committed, though r proposes it
    assert chisquare(counts[:5].tolist(), (p[:5] * N).tolist()).pvalue > 1e-3


def test_plain_sampling_matches_target_distribution(models):
    target, _ = models
    params = CASES[1][2]
    n, rows = 8000, 4000
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, seed=3))
    assert_same_distribution(sampled_counts(eng, params, n, rows), exact_distribution(target, params), n)


def test_cpu_rows_without_filters_skip_the_sort():
    """On the CPU `target_probs` computes rows without top-k and top-p as softmax(logits / T) (the one-hot argmax at
    T = 0) without the reference's sort: the same distribution; a batch where any row filters takes the reference."""
    from eaglespec.layers.sampling import target_probs_reference

    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 3
    T = torch.tensor([1.0, 0.0, 0.7, 1.5])
    plain = (torch.zeros(4, dtype=torch.long), torch.ones(4))
    assert torch.allclose(target_probs(x, T, *plain), target_probs_reference(x, T, *plain), atol=1e-7)
    assert target_probs(x, T, *plain)[1].nonzero().flatten().tolist() == [int(x[1].argmax())]
    filt = (torch.tensor([0, 0, 5, 0]), torch.tensor([1.0, 1.0, 1.0, 0.9]))
    assert torch.equal(target_probs(x, T, *filt), target_probs_reference(x, T, *filt))


def test_cpu_filtering_rows_look_at_their_largest_entries_first(monkeypatch):
    """On the CPU a top-k / top-p row orders only its CPU_CANDIDATES largest entries (torch.topk) when every k and
    every nucleus lies among them, and falls back to sorting the whole row when one does not (k past them, a flat
    row whose nucleus reaches past them): the same probabilities as the whole-row order, row by row."""
    from eaglespec.layers import sampling
    from eaglespec.layers.sampling import target_probs_reference

    calls: list[str] = []
    topk, sort = torch.Tensor.topk, torch.Tensor.sort
    monkeypatch.setattr(torch.Tensor, "topk", lambda self, *a, **kw: calls.append("topk") or topk(self, *a, **kw))
    monkeypatch.setattr(torch.Tensor, "sort", lambda self, *a, **kw: calls.append("sort") or sort(self, *a, **kw))
    g = torch.Generator().manual_seed(0)
    for V, spread in ((300, 3.0), (12288, 1.0), (49152, 3.0), (49152, 0.5)):
        x = torch.randn(6, V, generator=g) * spread * (1 + 3 * torch.rand(6, 1, generator=g))
        T = torch.tensor([1.0, 0.7, 0.0, 2.5, 1.0, 0.3])
        P = torch.tensor([0.9, 0.95, 0.9, 0.99, 1.0, 0.5])
        for k4 in (min(2000, V - 1), 0):  # one k past the candidates (a whole-row sort), then none
            K = torch.tensor([0, 50, 0, 0, k4, V])
            whole = target_probs_reference(x, T, K, P, candidates=V)
            for c in (16, 256, sampling.CPU_CANDIDATES, None):
                assert torch.equal(target_probs_reference(x, T, K, P, candidates=c), whole)
    assert "topk" in calls
    peaked = torch.randn(3, 49152, generator=g) * 6  # small nuclei: served from the candidates alone
    T, K, P = torch.full((3,), 0.7), torch.zeros(3, dtype=torch.long), torch.full((3,), 0.9)
    calls.clear()
    fast = target_probs(peaked, T, K, P)
    assert calls == ["topk"] and torch.equal(fast, target_probs_reference(peaked, T, K, P, candidates=49152))
    flat = torch.randn(3, 49152, generator=g) * 0.5  # nuclei of thousands of entries: the whole row after all
    calls.clear()
    assert torch.equal(target_probs(flat, T, K, P), target_probs_reference(flat, T, K, P, candidates=49152))
    assert calls[:2] == ["topk", "sort"]


def test_one_hot_sampling_verification_is_greedy():
    """With temperature 0 the sampling rule must give exactly the greedy rule's result."""
    gen = torch.Generator().manual_seed(0)
    B, S, K, D, Vv = 6, 4, 3, 9, 11
    from test_tree import random_candidates

    tok, sc, par, dep = random_candidates(B, S, K, gen)
    tok = tok % Vv
    # make siblings distinct after the modulo by re-drawing tokens per sibling group
    tree = build_tree(torch.zeros(B, dtype=torch.int64), tok, sc, par, dep, D, K, S)
    tokens = tree.tokens.clone()
    for b in range(B):
        for i in range(D):
            kids = [c for c in tree.child_table()[b, i].tolist() if c >= 0]
            for r, c in enumerate(kids):
                tokens[b, c] = r + i % 3
    tree.tokens = tokens
    for trial in range(20):
        logits = torch.randn(B, D, Vv, generator=gen)
        # bias the logits toward the drafted tokens so that some paths are accepted
        logits.scatter_add_(2, torch.gather(tokens, 1, tree.child_table()[..., 0].clamp(min=0))[..., None],
                            torch.full((B, D, 1), 3.0))
        g = verify_greedy(tree, logits)
        probs = target_probs(logits.view(B * D, Vv), torch.zeros(B * D), torch.zeros(B * D, dtype=torch.int64),
                             torch.ones(B * D)).view(B, D, Vv)
        s = verify_sampling(tree, probs, gen)
        assert torch.equal(g.accept_len, s.accept_len)
        assert torch.equal(g.tokens, s.tokens)
        assert torch.equal(g.path, s.path)


def _star_tree(tokens: list[int], n: int):
    """A root and len(tokens) children at depth 1 carrying `tokens`, repeated over n rows."""
    from eaglespec.spec.tree import DraftTree, ancestor_tables

    D = len(tokens) + 1
    parents = torch.tensor([[-1] + [0] * (D - 1)])
    depth = torch.tensor([[0] + [1] * (D - 1)])
    ancestors, paths = ancestor_tables(parents, depth, 1)
    return DraftTree(tokens=torch.tensor([[0] + tokens]).expand(n, D), parents=parents.expand(n, D),
                     depth=depth.expand(n, D), ancestors=ancestors.expand(n, D, D), paths=paths.expand(n, D, 2),
                     topk=D - 1)


def test_sampled_tree_verification_accepts_each_child_with_its_target_probability():
    """Deterministic children tried in order (all K at once in `verify_sampling`): child j is accepted with overall
    probability q(x_j) (rejecting the ones before it renormalises what is left), so the committed first token, a
    child or the bonus drawn from q without the children, is distributed as q. When the children cover all of q's
    mass (a top-k target), one of them is always accepted."""
    gen = torch.Generator().manual_seed(2)
    N, Vv = 40000, 7
    q = torch.tensor([0.05, 0.3, 0.1, 0.2, 0.15, 0.2, 0.0])
    kids = [3, 1, 6, 4]  # q(6) = 0: never accepted
    tree = _star_tree(kids, N)

    def star_probs(root_q: torch.Tensor) -> torch.Tensor:  # [N, 1 + K, Vv]: root_q at the root, uniform at the kids
        return torch.stack([root_q] + [torch.full((Vv,), 1 / Vv)] * len(kids))[None].expand(N, len(kids) + 1, Vv)

    res = verify_sampling(tree, star_probs(q), gen)
    sd = 4 * (0.25 / N) ** 0.5
    for j, x in enumerate(kids):
        assert abs((res.best == j + 1).float().mean().item() - q[x].item()) < sd, (j, x)
    counts = torch.bincount(res.tokens[:, 0], minlength=Vv)
    assert counts[6] == 0
    assert chisquare(counts[:6].tolist(), (q[:6] * N).tolist()).pvalue > 1e-3
    # bonus after acceptance: drawn from the child's own q (uniform here)
    took = res.accept_len == 1
    assert chisquare(torch.bincount(res.tokens[took, 1], minlength=Vv).tolist()).pvalue > 1e-3
    covered = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0, 0.0])  # the support is exactly the children 1, 3, 4
    res = verify_sampling(tree, star_probs(covered), gen)
    assert bool((res.accept_len == 1).all())
    counts = torch.bincount(res.tokens[:, 0], minlength=Vv)
    assert chisquare(counts[[1, 3, 4]].tolist(), (covered[[1, 3, 4]] * N).tolist()).pvalue > 1e-3


def test_reseed_restarts_the_draws_of_a_fresh_engine_of_that_seed():
    """`Engine.reseed(s)` between runs: the engine samples what a new engine of seed s samples (speculative and
    plain), so one engine can serve several seeded batches (regeneration's shards); refused while requests run."""
    from eaglespec.errors import RequestError

    t = tiny_llama(seed=0)
    d = tiny_drafter(t, seed=1)
    p = SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    for drafter, spec in ((None, None), (d, SpecConfig(2, 2, 4))):
        def fresh(seed):
            eng = Engine(t, None, EngineConfig(max_batch_size=2, seed=seed), drafter=drafter, spec=spec)
            return [o.token_ids for o in eng.generate(prompts, p)]

        reused = Engine(t, None, EngineConfig(max_batch_size=2, seed=7), drafter=drafter, spec=spec)
        first = [o.token_ids for o in reused.generate(prompts, p)]
        reused.reseed(11)
        assert [o.token_ids for o in reused.generate(prompts, p)] == fresh(11) != first
        reused.reseed(7)
        assert [o.token_ids for o in reused.generate(prompts, p)] == first == fresh(7)
    reused.add_request([1, 2], p)
    with pytest.raises(RequestError, match="reseed\\(\\) while requests run"):
        reused.reseed(3)


SEEDED_CASES = [CASES[0], CASES[3]]  # a chain with sampled drafts, and a tree


@pytest.mark.parametrize("name,spec,params", SEEDED_CASES, ids=[c[0] for c in SEEDED_CASES])
def test_seeded_requests_keep_the_target_distribution(models, name, spec, params):
    """Requests each with its own seed (layers/row_draws.py's counter-based draws in place of the generator's):
    over the seeds, the output is distributed as the target's."""
    from dataclasses import replace

    target, drafter = models
    n, rows = 8000, 4000
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, seed=11), drafter=drafter, spec=spec)
    counts: dict[tuple[int, ...], int] = {}
    for b in range(n // rows):
        outs = eng.generate([PROMPT] * rows, [replace(params, seed=b * rows + i) for i in range(rows)])
        for o in outs:
            counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert_same_distribution(counts, exact_distribution(target, params), n)
    assert sum(eng.stats.hist[2:]) >= 100
