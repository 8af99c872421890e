"""Logit adjustments (penalties, logit_bias, min_tokens, min_p, stop_token_ids: layers/logit_adjust.py,
engine/row_adjust.py): the function against a token-by-token reference and transformers' processors, and the
invariant under them: greedy speculation equals plain greedy decoding, sampled speculation keeps the target's
distribution (float32, CPU)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from test_spec_greedy import PROMPTS  # (the tiny `target` and `drafter` fixtures: conftest.py)
from test_spec_sampling import (N_TOKENS, PROMPT, V, assert_same_distribution, exact_distribution,  # noqa: F401
                                models)
from tiny import CharTokenizer, tiny_drafter

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import RequestError
from eaglespec.layers.logit_adjust import adjust_logits, tree_logits
from eaglespec.sampling_params import SamplingParams
from eaglespec.spec.oracle import OracleDrafter
from eaglespec.spec.tree import DraftTree, ancestor_tables

GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)
ADJUSTED = {
    "repetition": dict(repetition_penalty=1.6),
    "frequency": dict(frequency_penalty=1.2),
    "presence": dict(presence_penalty=-0.8, frequency_penalty=0.4),
    "bias": dict(logit_bias={3: 4.0, 81: -100.0, 17: 2.5}),
    "all": dict(repetition_penalty=0.8, frequency_penalty=0.5, presence_penalty=0.5, logit_bias={5: 1.5}),
    # only these tokens, and a bias that cannot lift a token outside them (7)
    "allowed": dict(allowed_token_ids=(3, 9, 12, 40, 41, 57, 81, 88), logit_bias={81: 2.0, 7: 50.0},
                    frequency_penalty=1.0),
}
SPECS = [SpecConfig(3, 1, 4), SpecConfig(4, 1, 3), SpecConfig(5, 4, 8), SpecConfig(6, 8, 32)]


def spec_id(s: SpecConfig) -> str:
    return f"S{s.steps}K{s.topk}D{s.draft_tokens}"


def reference_adjust(logits: list[float], prompt: list[int], outputs: list[int], p: SamplingParams,
                     stops: tuple[int, ...] = ()) -> list[float]:
    """One row, token by token, as the parameters' documentation reads (vLLM's order)."""
    bias = dict(p.logit_bias)
    out = []
    for v, x in enumerate(logits):
        x += bias.get(v, 0.0)
        if p.allowed_token_ids is not None and v not in p.allowed_token_ids:
            x = -math.inf
        if v in stops and len(outputs) < p.min_tokens:
            x = -math.inf
        if v in prompt or v in outputs:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        n = outputs.count(v)
        x -= p.frequency_penalty * n + p.presence_penalty * (n > 0)
        out.append(x)
    if p.min_p and p.temperature > 0:
        top = max(out)
        out = [x if x >= top + p.temperature * math.log(p.min_p) else -math.inf for x in out]
    return out


def adjust_one(logits: torch.Tensor, prompt: list[int], outputs: list[int], p: SamplingParams,
               stops: tuple[int, ...] = ()) -> torch.Tensor:
    """`adjust_logits` over rows of one request's tables (logits [N, V])."""
    N, Vn = logits.shape
    counts = torch.zeros(N, Vn, dtype=torch.int32)
    for t in outputs:
        counts[:, t] += 1
    seen = torch.zeros(N, Vn, dtype=torch.bool)
    seen[:, prompt] = True
    bias = torch.zeros(N, Vn)
    if p.allowed_token_ids is not None:
        bias.fill_(float("-inf"))[:, list(p.allowed_token_ids)] = 0.0
    for t, b in p.logit_bias:
        bias[:, t] += b
    stop_mask = torch.zeros(N, Vn, dtype=torch.bool)
    stop_mask[:, list(stops)] = True
    banned = torch.full((N,), len(outputs) < p.min_tokens)
    full = lambda x: torch.full((N,), float(x))  # noqa: E731
    return adjust_logits(logits, counts, seen, stop_mask, bias, full(p.repetition_penalty), full(p.frequency_penalty),
                         full(p.presence_penalty), banned, full(p.min_p), full(p.temperature))


@pytest.mark.parametrize("kw", [*ADJUSTED.values(), dict(min_p=0.2, temperature=0.7), dict(min_tokens=3),
                                dict(min_p=0.3, temperature=0.0, repetition_penalty=1.3)],
                         ids=[*ADJUSTED, "min_p", "min_tokens", "min_p-greedy"])
def test_adjust_logits_equals_the_token_by_token_reference(kw):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 90, generator=g) * 3
    prompt, outputs = [3, 5, 7, 17, 40], [5, 5, 81, 2, 17, 5]
    p = SamplingParams(max_new_tokens=10, **kw)
    stops = (2, 60)
    got = adjust_one(logits, prompt, outputs[: 2 if p.min_tokens else None], p, stops)
    for row in range(3):
        want = reference_adjust(logits[row].tolist(), prompt, outputs[: 2 if p.min_tokens else None], p, stops)
        assert torch.allclose(got[row], torch.tensor(want), rtol=1e-6, atol=1e-6, equal_nan=False)
    if p.min_tokens:  # two outputs of three: the stop tokens are banned; at three they are not
        assert torch.isinf(got[:, list(stops)]).all()
        assert not torch.isinf(adjust_one(logits, prompt, outputs[:3], p, stops)).any()
    if p.min_p and p.temperature == 0:  # min-p leaves a greedy row alone
        assert not torch.isinf(got).any()


def test_neutral_parameters_change_nothing():
    logits = torch.randn(2, 50)
    assert torch.equal(adjust_one(logits, [1, 2], [3, 3], SamplingParams()), logits)


def test_repetition_penalty_and_min_p_equal_transformers():
    from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 64, generator=g) * 2
    seq = torch.randint(0, 64, (4, 12), generator=g)
    for b in range(4):
        p = SamplingParams(repetition_penalty=1.4 + 0.2 * b)
        ours = adjust_one(logits[b : b + 1], seq[b].tolist(), [], p)
        hf = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(seq[b : b + 1], logits[b : b + 1].clone())
        assert torch.allclose(ours, hf, rtol=1e-6, atol=1e-6)
    for min_p, t in ((0.05, 1.0), (0.3, 0.6), (0.9, 1.5)):
        ours = adjust_one(logits, [], [], SamplingParams(min_p=min_p, temperature=t))
        hf = MinPLogitsWarper(min_p)(seq, TemperatureLogitsWarper(t)(seq, logits.clone()))
        assert torch.equal(torch.isinf(ours), torch.isinf(hf))


def test_tree_logits_equal_each_node_adjusted_for_its_path():
    """`tree_logits` (the rows' tables on every node, then the entries of each node's path tokens recomputed) equals,
    bit for bit, `adjust_logits` run node by node with the counts plain decoding would have there: the row's counts
    plus the tokens on the node's path below the root (which was committed, so counted already)."""
    # root 0 (token 9); 1, 2 its children (tokens 4, 6); 3 child of 1 (token 4); 4 child of 3 (token 5); 5 child of 2
    # (token 9: the root's token again)
    tokens = torch.tensor([[9, 4, 6, 4, 5, 9], [1, 2, 3, 4, 5, 6]])
    parents = torch.tensor([[-1, 0, 0, 1, 3, 2], [-1, 0, 1, 2, 3, 4]])  # the second row a chain
    depth = torch.tensor([[0, 1, 1, 2, 3, 2], [0, 1, 2, 3, 4, 5]])
    ancestors, paths = ancestor_tables(parents, depth, 5)
    tree = DraftTree(tokens=tokens, parents=parents, depth=depth, ancestors=ancestors, paths=paths, topk=2)
    g = torch.Generator().manual_seed(2)
    B, D, Vn = 2, 6, 12
    logits = (torch.randn(B, D, Vn, generator=g) * 3).to(torch.bfloat16)
    counts = torch.randint(0, 3, (B, Vn), generator=g, dtype=torch.int32)
    seen = torch.rand(B, Vn, generator=g) < 0.3
    stops = torch.zeros(B, Vn, dtype=torch.bool)
    stops[:, [4, 7]] = True
    bias = torch.randn(B, Vn, generator=g)
    bias[1, 10] = float("-inf")
    rep, freq, pres = torch.tensor([1.3, 0.8]), torch.tensor([0.5, -0.4]), torch.tensor([0.2, 0.7])
    banned = torch.rand(B, D, generator=g) < 0.5
    min_p, temperature = torch.tensor([0.1, 0.0]), torch.tensor([0.9, 0.0])
    got = tree_logits(logits, tree, counts, seen, stops, bias, rep, freq, pres, banned, min_p, temperature)
    for b in range(B):
        for n in range(D):
            path_tokens, node = [], n
            while parents[b, node] >= 0:
                path_tokens.append(int(tokens[b, node]))
                node = int(parents[b, node])
            c = counts[b].clone()
            for t in path_tokens:
                c[t] += 1
            want = adjust_logits(logits[b, n][None], c[None], seen[b][None], stops[b][None], bias[b][None],
                                 rep[b:b + 1], freq[b:b + 1], pres[b:b + 1], banned[b, n][None], min_p[b:b + 1],
                                 temperature[b:b + 1])[0]
            assert torch.equal(got[b, n], want), (b, n)


@pytest.fixture(scope="module")
def adjusted_refs(target):
    """Plain greedy answers under each adjustment."""
    out = {}
    for name, kw in ADJUSTED.items():
        out[name] = [o.token_ids for o in Engine(target, None).generate(PROMPTS, replace(GREEDY, **kw))]
    return out


def test_the_adjustments_change_the_answers(target, adjusted_refs):
    plain = [o.token_ids for o in Engine(target, None).generate(PROMPTS, GREEDY)]
    for name, refs in adjusted_refs.items():
        assert refs != plain, name
    # a penalty against repeats makes answers more varied
    assert sum(len(set(r)) for r in adjusted_refs["frequency"]) > sum(len(set(r)) for r in plain)
    assert all(81 not in r for r in adjusted_refs["bias"])  # biased by -100
    allowed = set(ADJUSTED["allowed"]["allowed_token_ids"])
    assert all(set(r) <= allowed and 7 not in r and len(set(r)) > 2 for r in adjusted_refs["allowed"])


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
@pytest.mark.parametrize("name", list(ADJUSTED))
def test_greedy_speculation_equals_plain_under_adjustments(target, drafter, adjusted_refs, spec, name):
    params = replace(GREEDY, **ADJUSTED[name])
    eng = Engine(target, None, EngineConfig(max_batch_size=4), drafter=drafter, spec=spec)
    assert [o.token_ids for o in eng.generate(PROMPTS, params)] == adjusted_refs[name]
    # the oracle of the adjusted answers has every draft accepted: node n's logits saw the tokens of its path
    refs = [p + r for p, r in zip(PROMPTS, adjusted_refs[name])]
    n = 5 * spec.max_accept + 1
    orc = Engine(target, None, EngineConfig(max_batch_size=4), drafter=OracleDrafter(target.config, refs), spec=spec)
    assert [o.token_ids for o in orc.generate(PROMPTS, replace(params, max_new_tokens=n))] == [
        r[:n] for r in adjusted_refs[name]]
    assert orc.stats.accept_length_mean == spec.max_accept


@pytest.mark.parametrize("spec", [None, SPECS[0], SPECS[2]], ids=["plain", "chain", "tree"])
def test_adjusted_and_plain_requests_share_steps(target, drafter, adjusted_refs, spec):
    """Rows that ask for nothing keep their answers beside rows that adjust (and the static graph path, with overlap
    and prefill ahead, gives the eager answers, in steps keyed adjusted and not)."""
    from test_static_path import static_engine

    longer = replace(GREEDY, max_new_tokens=60)  # the last request runs on alone: steps keyed not adjusted
    plain = [o.token_ids for o in Engine(target, None).generate(PROMPTS, [GREEDY] * 3 + [longer])]
    params = [replace(GREEDY, **ADJUSTED["all"]), GREEDY, replace(GREEDY, **ADJUSTED["frequency"]), longer]
    want = [adjusted_refs["all"][0], plain[1], adjusted_refs["frequency"][2], plain[3]]
    d = drafter if spec else None
    eng = Engine(target, None, EngineConfig(max_batch_size=4), drafter=d, spec=spec)
    assert [o.token_ids for o in eng.generate(PROMPTS, params)] == want
    static = static_engine(target, d, spec, rows=2, overlap=True, prefill_ahead=1)
    assert [o.token_ids for o in static.generate(PROMPTS, params)] == want
    keys = [k for k in static.runner.graphs.graphs if k[0] != "prefill"]
    assert {k[-1].adjusted for k in keys} == {True, False}


def test_an_engine_allocates_the_tables_on_first_use(target):
    eng = Engine(target, None)
    eng.generate([PROMPTS[0]], GREEDY)
    assert not eng.runner.adjust.ready  # nothing asked: no [rows, V] tables
    eng.generate([PROMPTS[0]], replace(GREEDY, presence_penalty=0.5))
    assert eng.runner.adjust.ready


@pytest.mark.parametrize("spec", [None, SPECS[0], SPECS[2]], ids=["plain", "chain", "tree"])
def test_min_tokens_and_stop_token_ids(target, drafter, spec):
    plain = [o.token_ids for o in Engine(target, None).generate(PROMPTS, GREEDY)]
    first = next(i for i in range(3, 40) if plain[0][i] not in plain[0][:i])
    eos = plain[0][first]  # a token the first answer reaches early
    def engine() -> Engine:
        eng = Engine(target, None, EngineConfig(max_batch_size=4), drafter=drafter if spec else None, spec=spec)
        eng.eos_ids = (eos,)
        return eng

    base = SamplingParams(max_new_tokens=40)
    stopped = engine().generate([PROMPTS[0]], base)[0]
    assert stopped.token_ids == plain[0][:first] and stopped.finish_reason == "stop"
    assert first < 12
    # min_tokens: no EOS before 12 tokens (the answer is plain greedy with EOS banned there), then it may stop
    want = Engine(target, None).generate([PROMPTS[0]], replace(GREEDY, logit_bias={eos: -100}, max_new_tokens=12))
    out = engine().generate([PROMPTS[0]], replace(base, min_tokens=12))[0]
    assert out.token_ids[:12] == want[0].token_ids and eos not in out.token_ids[:12]
    assert len(out.token_ids) >= 12
    # the boundary exactly: an EOS that greedy decoding picks right after min_tokens outputs ends the answer there
    k = next(i for i in range(12, 40) if plain[0][i] not in plain[0][:i])
    eng = engine()
    eng.eos_ids = (plain[0][k],)
    out = eng.generate([PROMPTS[0]], replace(base, min_tokens=k))[0]
    assert out.token_ids == plain[0][:k] and out.finish_reason == "stop"
    # a stop token ends the answer as EOS does (not part of it); ignore_eos does not ignore it
    stop_tok = plain[1][5]
    out = engine().generate([PROMPTS[1]], replace(GREEDY, stop_token_ids=(stop_tok,)))[0]
    assert out.token_ids == plain[1][: plain[1].index(stop_tok)] and out.finish_reason == "stop"
    # min_tokens with ignore_eos bans only the stop tokens
    out = engine().generate([PROMPTS[1]], replace(GREEDY, stop_token_ids=(stop_tok,), min_tokens=20))[0]
    assert stop_tok not in out.token_ids[:20] and len(out.token_ids) >= 20


def test_min_tokens_holds_stop_strings_back(target, drafter):
    tok = CharTokenizer(target.config.vocab_size)
    plain = Engine(target, tok).generate([PROMPTS[0]], GREEDY)[0]
    stop = tok.decode(plain.token_ids[2:4])
    first = plain.text.index(stop)
    assert first < 8
    for spec in (None, SPECS[0]):
        eng = Engine(target, tok, drafter=drafter if spec else None, spec=spec)
        early = eng.generate([PROMPTS[0]], replace(GREEDY, stop=(stop,)))[0]
        assert early.text == plain.text[:first] and early.finish_reason == "stop"
        late = eng.generate([PROMPTS[0]], replace(GREEDY, stop=(stop,), min_tokens=10))[0]
        again = plain.text.find(stop, 10 - len(stop))  # the first that the 10th token or a later one completes
        assert late.text == (plain.text[:again] if again >= 0 else plain.text)


def exact_adjusted_distribution(target, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x1..x3) by enumeration, each step's logits adjusted by the token-by-token reference for its prefix."""
    def adjust(logits: torch.Tensor, prefix: list[int]) -> torch.Tensor:
        return torch.tensor([reference_adjust(logits[0].tolist(), PROMPT, prefix, params)])

    return exact_distribution(target, params, adjust)


SAMPLED = [
    ("chain-penalties", SpecConfig(3, 1, 4),
     SamplingParams(max_new_tokens=N_TOKENS, temperature=1.0, ignore_eos=True, frequency_penalty=0.7,
                    presence_penalty=0.3, repetition_penalty=1.3)),
    ("tree-min_p-bias", SpecConfig(3, 3, 8),
     SamplingParams(max_new_tokens=N_TOKENS, temperature=0.9, ignore_eos=True, min_p=0.1, logit_bias={2: 1.0},
                    frequency_penalty=0.8)),
]


@pytest.mark.parametrize("name,spec,params", SAMPLED, ids=[c[0] for c in SAMPLED])
def test_sampled_speculation_keeps_the_adjusted_distribution(models, name, spec, params):  # noqa: F811
    target, drafter = models
    n, rows = 8000, 4000
    exact = exact_adjusted_distribution(target, params)
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, seed=17), drafter=drafter, spec=spec)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n // rows):
        for o in eng.generate([PROMPT] * rows, params):
            counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert_same_distribution(counts, exact, n)
    assert sum(eng.stats.hist[2:]) >= 100  # drafts were accepted, so verified nodes saw their paths' tokens


@pytest.mark.parametrize("kw,message", [
    (dict(frequency_penalty=2.5), r"frequency_penalty must be between -2 and 2 \(got 2.5\)"),
    (dict(presence_penalty=-3), r"presence_penalty must be between -2 and 2 \(got -3\)"),
    (dict(repetition_penalty=0), r"repetition_penalty must be > 0 \(got 0\); 1 turns it off"),
    (dict(min_p=1.5), r"min_p must be between 0 and 1 \(got 1.5\)"),
    (dict(min_tokens=-1), r"min_tokens must be >= 0"),
    (dict(min_tokens=300), r"min_tokens \(300\) must not exceed max_new_tokens \(256\)"),
    (dict(logit_bias={5: 101}), r"logit_bias of token 5 must be between -100 and 100 \(got 101.0\)"),
    (dict(logit_bias={-1: 1}), r"logit_bias names token -1: token ids are >= 0"),
    (dict(stop_token_ids=(3, -2)), r"stop_token_ids must be token ids >= 0"),
    (dict(allowed_token_ids=()), r"allowed_token_ids must be a non-empty list of token ids >= 0 \(got \[\]\)"),
])
def test_bad_adjustments_are_refused(kw, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**kw)


def test_token_ids_outside_the_vocabulary_are_refused(target):
    eng = Engine(target, None)
    Vt = target.config.vocab_size
    with pytest.raises(RequestError, match=rf"token ids \[{Vt}, {Vt + 5}\] \(logit_bias, stop_token_ids, "
                                           rf"allowed_token_ids\) are outside the model's vocabulary of {Vt} tokens"):
        eng.add_request([1, 2], replace(GREEDY, logit_bias={Vt: 1.0}, stop_token_ids=(Vt + 5, 3)))
    assert SamplingParams(logit_bias={"7": 2}).logit_bias == ((7, 2.0),)  # JSON's string keys are taken


def test_allowed_tokens_outside_the_draft_vocabulary_keep_the_distribution(models):  # noqa: F811
    """A sampled chain whose drafter knows none of the allowed tokens (its logits all banned: it drafts from its raw
    ones, never NaN) still samples the target's adjusted distribution."""
    target, _ = models
    drafter = tiny_drafter(target, seed=7, draft_vocab=5, hidden=32, std=0.35)
    inside = set(drafter.to_target_ids(torch.arange(5)).tolist())
    allowed = tuple(t for t in range(V) if t not in inside)
    params = SamplingParams(max_new_tokens=N_TOKENS, temperature=1.0, ignore_eos=True, allowed_token_ids=allowed)
    n, rows = 4000, 4000
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, seed=19), drafter=drafter, spec=SpecConfig(3, 1, 4))
    counts: dict[tuple[int, ...], int] = {}
    for o in eng.generate([PROMPT] * rows, params):
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert_same_distribution(counts, exact_adjusted_distribution(target, params), n)
    assert eng.stats.verify_steps > 0


def test_min_tokens_that_bans_every_allowed_token_is_refused(target):
    eng = Engine(target, None)
    eng.eos_ids = (5,)
    with pytest.raises(RequestError, match=r"min_tokens \(3\) bans every token allowed_token_ids allows"):
        eng.add_request([1, 2], SamplingParams(allowed_token_ids=(5, 6), stop_token_ids=(6,), min_tokens=3))
    eng.add_request([1, 2], SamplingParams(allowed_token_ids=(5, 6), stop_token_ids=(6,), min_tokens=3,
                                           ignore_eos=True, max_new_tokens=4))  # EOS ignored: 5 stays allowed


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2]], ids=["chain", "tree"])
def test_greedy_allowed_tokens_outside_the_draft_vocabulary(target, spec):  # noqa: F811
    drafter = tiny_drafter(target, seed=3, draft_vocab=24)
    inside = set(drafter.to_target_ids(torch.arange(24)).tolist())
    allowed = tuple(t for t in range(target.config.vocab_size) if t not in inside)[:12]
    params = replace(GREEDY, allowed_token_ids=allowed, frequency_penalty=0.8)
    want = [o.token_ids for o in Engine(target, None).generate(PROMPTS, params)]
    eng = Engine(target, None, EngineConfig(max_batch_size=4), drafter=drafter, spec=spec)
    assert [o.token_ids for o in eng.generate(PROMPTS, params)] == want
    assert all(set(w) <= set(allowed) for w in want)


def test_plain_steps_of_a_speculative_engine_keep_the_counts(target, drafter, adjusted_refs):  # noqa: F811
    """With spec_max_rows, busy steps decode plainly (their tokens join the counts as a commit's do) and speculation
    resumes as rows finish: the answers stay plain decoding's under the adjustments."""
    lengths = [40, 10, 20, 30]  # rows finish one by one: decode steps, then speculative ones
    params = [replace(GREEDY, **ADJUSTED["all"], max_new_tokens=n) for n in lengths]
    eng = Engine(target, None, EngineConfig(max_batch_size=4, spec_max_rows=2), drafter=drafter, spec=SPECS[2])
    outs = eng.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [r[:n] for r, n in zip(adjusted_refs["all"], lengths)]
    assert eng.step_counts["decode"] > 0 and eng.step_counts["spec"] > 0


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2]], ids=["chain", "tree"])
def test_random_mixes_of_adjustments_equal_plain_answers(target, drafter, spec):  # noqa: F811
    """Six requests with random adjustments (penalties, biases, allowed sets, min_tokens with stop tokens, or none)
    and lengths share a speculative engine of 3 rows on the static path with overlap and prefill ahead: each answer
    is the plain engine's for that request alone."""
    from test_static_path import static_engine

    rng = torch.Generator().manual_seed(11)

    def rand(lo: float, hi: float) -> float:
        return round(lo + (hi - lo) * torch.rand(1, generator=rng).item(), 2)

    params, prompts = [], []
    for i in range(6):
        kw: dict = dict(max_new_tokens=int(torch.randint(8, 30, (1,), generator=rng)))
        kind = i % 3
        if kind == 0:
            kw.update(repetition_penalty=rand(0.7, 1.6), frequency_penalty=rand(-1, 1), presence_penalty=rand(-1, 1))
        elif kind == 1:
            ids = torch.randperm(97, generator=rng)[:30].tolist()
            kw.update(allowed_token_ids=tuple(ids[:20]), logit_bias={ids[0]: rand(-5, 5), ids[25]: 10.0},
                      stop_token_ids=(ids[1],), min_tokens=int(kw["max_new_tokens"]) // 2)
        params.append(SamplingParams(**kw))
        prompts.append(torch.randint(0, 97, (int(torch.randint(1, 12, (1,), generator=rng)),), generator=rng).tolist())
    want = [Engine(target, None).generate([p], q)[0].token_ids for p, q in zip(prompts, params)]
    eng = static_engine(target, drafter, spec, rows=3, overlap=True, prefill_ahead=1)
    assert [o.token_ids for o in eng.generate(prompts, params)] == want
