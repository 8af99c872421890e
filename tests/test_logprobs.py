"""Log-probabilities of committed tokens (SamplingParams.logprobs): the target's raw log-softmax at the position that
chose each token, with its top alternatives; the same with and without speculation (every shape, batch sizes, the
static graph path with overlap), none for requests that did not ask, and mistakes named."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before a kernel is built (on first use): the CUDA kernel's test

import pytest  # noqa: E402
import torch  # noqa: E402
from test_static_path import static_engine  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.row_sampling import StepExtras  # noqa: E402
from eaglespec.errors import ConfigError, RequestError  # noqa: E402
from eaglespec.layers.context import ForwardContext  # noqa: E402
from eaglespec.layers.logprobs import token_logprobs, unpack  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40)), [5]]
GREEDY = SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=3)
# an engine's log-probabilities against `reference_logprobs`: one full-sequence forward sums in other orders than
# the engine's cached decode steps; on a Sapphire Rapids Xeon (AVX-512) the tiny target's (|logits| up to ~11, ulp
# ~1e-6) differ by up to 1.0e-5 (session 66), so 1e-5 failed there; a wrong position or token differs by ~0.1-1
FORWARD_TOL = 3e-5


@pytest.fixture(scope="module")
def plain(target):
    return Engine(target, None).generate(PROMPTS, GREEDY)


def reference_logprobs(target, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log-softmax of one full-sequence forward: row j is the distribution output token j was chosen from [n, V]."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = target(ids, ForwardContext.plain(1, ids.shape[1])).logits[0].float()
    return logits.log_softmax(-1)[len(prompt) - 1: len(prompt) - 1 + len(tokens)]


def test_packed_rows_and_unpack():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 97, generator=g) * 3
    tokens = torch.tensor([3, 50, 96, 0, 7])
    rows = token_logprobs(logits, tokens, 4)
    ref = logits.log_softmax(-1)
    assert rows.shape == (5, 9) and rows.dtype == torch.float32
    torch.testing.assert_close(rows[:, 0], ref[torch.arange(5), tokens])
    top = ref.topk(4, -1)
    torch.testing.assert_close(rows[:, 1::2], top.values)  # pairs: (log-probability, id), best first
    assert torch.equal(rows[:, 2::2].long(), top.indices)
    e = unpack(rows[1].tolist(), 50, 2)
    assert e.token == 50 and e.logprob == pytest.approx(ref[1, 50].item(), abs=1e-6)
    assert e.top == tuple(zip(rows[1, 2:5:2].long().tolist(), rows[1, 1:5:2].tolist()))
    assert [i for i, _ in e.top] == top.indices[1, :2].tolist()
    # a row of fewer alternatives is the prefix of one of more: a buffer sized for the most holds it
    assert torch.equal(token_logprobs(logits, tokens, 2), rows[:, :5])
    assert unpack(rows[1, :5].tolist() + [float("nan")] * 4, 50, 2) == e  # stale columns past 1 + 2k are not read
    with pytest.raises(AssertionError):
        unpack(rows[1, :5].tolist(), 50, 3)
    assert token_logprobs(logits, tokens, 0).shape == (5, 1)  # the chosen token's only


def test_plain_greedy_logprobs_are_the_targets_log_softmax(target, plain):
    for p, o in zip(PROMPTS, plain):
        ref = reference_logprobs(target, p, o.token_ids)
        assert len(o.logprobs) == len(o.token_ids) == 16
        for j, e in enumerate(o.logprobs):
            assert e.token == o.token_ids[j]
            assert e.logprob == pytest.approx(ref[j, e.token].item(), abs=FORWARD_TOL)
            assert len(e.top) == 3 and e.top[0][0] == e.token  # greedy: the argmax is the best alternative
            assert [lp for _, lp in e.top] == sorted((lp for _, lp in e.top), reverse=True)
            assert e.top[1][1] == pytest.approx(ref[j].topk(2).values[1].item(), abs=FORWARD_TOL)
    assert any(e.logprob < -0.1 for o in plain for e in o.logprobs)  # not all certain: the check bites


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(5, 4, 8), SpecConfig(6, 8, 32)],
                         ids=["chain", "tree", "wide-tree"])
@pytest.mark.parametrize("batch", [1, 4])
def test_speculation_gives_plain_decodings_logprobs(target, drafter, plain, spec, batch):
    """Each committed token's entry comes from the verify logits of the path node that chose it (the bonus from the
    deepest accepted node's): the same tokens and log-probabilities as plain decoding (float32)."""
    eng = Engine(target, None, EngineConfig(), drafter=drafter, spec=spec)
    outs = eng.generate(PROMPTS[:batch], GREEDY)
    assert eng.stats.verify_steps > 0
    for o, ref in zip(outs, plain):
        assert o.token_ids == ref.token_ids
        for a, b in zip(o.logprobs, ref.logprobs):
            assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=1e-5)
            assert [i for i, _ in a.top] == [i for i, _ in b.top]


@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4), SpecConfig(4, 2, 6)], ids=["plain", "chain", "tree"])
def test_the_static_graph_path_with_overlap(target, drafter, plain, spec, monkeypatch):
    """The graph path (CUDA's, run eagerly on the CPU) with overlap and prefill ahead: the rows come back with
    their launched step's copy (`PendingStep.logprobs`), read by row, as many columns as the step computed (its 5
    alternatives of the buffer's 20)."""
    from eaglespec.engine.pending_step import ResultBuffers

    eng = static_engine(target, drafter if spec else None, spec, rows=3, overlap=True, prefill_ahead=1)
    widths: list[int] = []
    real = ResultBuffers.step
    monkeypatch.setattr(ResultBuffers, "step", lambda self, *a: (lambda p: widths.append(p.logprobs.shape[-1]) or p)(
        real(self, *a)))
    outs = eng.generate(PROMPTS, GREEDY)  # 4 requests over 3 rows: admissions while others run
    assert widths and set(widths) == {1 + 2 * 5} and eng.runner.lp_buffer.buf.shape[-1] == 1 + 2 * 20
    for o, ref in zip(outs, plain):
        assert o.token_ids == ref.token_ids
        assert [e.logprob for e in o.logprobs] == pytest.approx([e.logprob for e in ref.logprobs], abs=1e-5)


def test_only_requests_that_ask_get_them(target, drafter, plain):
    """In a batch mixing requests with and without logprobs, the others get none and every answer is plain
    greedy's; k alternatives as each asked."""
    eng = Engine(target, None, EngineConfig(), drafter=drafter, spec=SpecConfig(3, 1, 4))
    params = [GREEDY, SamplingParams(max_new_tokens=16, ignore_eos=True),
              SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=0), GREEDY]
    outs = eng.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert outs[1].logprobs is None and "logprobs" not in outs[1].to_dict()
    assert all(e.top == () for e in outs[2].logprobs) and len(outs[2].logprobs) == 16
    assert outs[3].to_dict()["logprobs"][0]["token"] == plain[3].token_ids[0]


def test_sampled_tokens_get_the_raw_distributions_logprobs(target, drafter):
    """Sampled (T = 1.3, top-k 20) with speculation: each token's entry is the raw log-softmax (before temperature
    and top-k) of the position that drew it."""
    params = SamplingParams(max_new_tokens=12, temperature=1.3, top_k=20, ignore_eos=True, logprobs=1)
    eng = Engine(target, None, EngineConfig(seed=3), drafter=drafter, spec=SpecConfig(3, 1, 4))
    for p, o in zip(PROMPTS[:2], eng.generate(PROMPTS[:2], params)):
        ref = reference_logprobs(target, p, o.token_ids)
        for j, e in enumerate(o.logprobs):
            assert e.logprob == pytest.approx(ref[j, e.token].item(), abs=FORWARD_TOL)
            assert e.top[0][1] == pytest.approx(ref[j].max().item(), abs=FORWARD_TOL)


def test_an_eos_gets_no_entry(target, plain):
    eos = plain[0].token_ids[5]
    eng = Engine(target, None)
    eng.eos_ids = (eos,)
    o = eng.generate([PROMPTS[0]], SamplingParams(max_new_tokens=16, logprobs=2))[0]
    stop = plain[0].token_ids.index(eos)  # the EOS ends the answer and is not part of it
    assert o.finish_reason == "stop" and o.token_ids == plain[0].token_ids[:stop]
    assert [e.token for e in o.logprobs] == o.token_ids


def test_mistakes_are_named(target):
    with pytest.raises(RequestError, match=r"logprobs must be between 0 and 20 \(got 21\)"):
        SamplingParams(logprobs=21)
    with pytest.raises(ConfigError, match=r"max_logprobs must be between 0 and 20, or None \(got -1\)"):
        EngineConfig(max_logprobs=-1)
    with pytest.raises(RequestError, match=r"logprobs=5: this engine computes at most 2 alternatives per token"):
        Engine(target, None, EngineConfig(max_logprobs=2)).generate([[1, 2]], SamplingParams(logprobs=5))
    with pytest.raises(RequestError, match=r"logprobs=0: this engine computes no log-probabilities"):
        Engine(target, None, EngineConfig(max_logprobs=None)).generate([[1, 2]], SamplingParams(logprobs=0))


@pytest.mark.parametrize("N,V,k", [(3, 97, 4), (5, 3000, 20), (2, 49152, 5), (4, 1000, 0)])
def test_the_cuda_kernel_packs_the_same_rows(N, V, k):
    """layers/logprobs_kernel.py (two kernels, CUDA's path; here Triton's interpreter) against PyTorch's path:
    bf16 logits, chunked rows (V over 1,024), k = 0 (the token's log-probability alone) to 20."""
    from eaglespec.layers import logprobs_kernel

    g = torch.Generator().manual_seed(V)
    logits = (torch.randn(N, V, generator=g) * 4).to(torch.bfloat16)
    tokens = torch.randint(0, V, (N,), generator=g)
    got = logprobs_kernel.packed_rows(logits, tokens, k)
    want = token_logprobs(logits, tokens, k)  # the CPU: PyTorch's path
    assert got.shape == want.shape == (N, 1 + 2 * k)
    # the row's float32 sum of V exponentials in another order (chunks against PyTorch's vectorized reduction, whose
    # order differs by CPU): ~sqrt(V) eps apart in the log, 1.1e-5 seen at V = 49,152 on an AVX2 CPU
    atol = 3e-5
    torch.testing.assert_close(got[:, :1], want[:, :1], atol=atol, rtol=0)  # the chosen token's
    torch.testing.assert_close(got[:, 1::2], want[:, 1::2], atol=atol, rtol=0)  # the k best values
    ref = logits.float().log_softmax(-1)
    for r in range(N):  # ids: bf16 rows have ties, so each id must carry its value (a tie's order may differ)
        ids = got[r, 2::2].long()
        torch.testing.assert_close(ref[r, ids], got[r, 1::2], atol=atol, rtol=0)
        assert len(set(ids.tolist())) == k


def test_speculation_through_the_kernel_gives_plain_decodings_logprobs(target, drafter, plain, monkeypatch):
    """The engine's steps with the CUDA kernel in place of PyTorch's path (Triton's interpreter): a tree's verify
    rows and the prefill's and decode's alike."""
    from eaglespec.engine import logprob_buffer
    from eaglespec.layers import logprobs_kernel

    monkeypatch.setattr(logprob_buffer, "token_logprobs", logprobs_kernel.packed_rows)
    for spec in (None, SpecConfig(4, 2, 6)):
        eng = Engine(target, None, EngineConfig(), drafter=drafter if spec else None, spec=spec)
        outs = eng.generate(PROMPTS[:2], SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=3))
        for o, ref in zip(outs, plain):
            assert o.token_ids == ref.token_ids[:6]
            assert [e.logprob for e in o.logprobs] == pytest.approx([e.logprob for e in ref.logprobs[:6]], abs=1e-5)
            assert [e.top for e in o.logprobs] == [tuple((i, pytest.approx(v, abs=1e-5)) for i, v in e.top)
                                                   for e in ref.logprobs[:6]]


def test_a_step_computes_the_alternatives_its_requests_need(target, plain, monkeypatch):
    """A step computes SMALL_TOP alternatives while no request of it asks for more, else the engine's most
    (`step_alternatives`); a request reads its own k from rows wider than it, whichever steps computed them."""
    from eaglespec.engine import logprob_buffer
    from eaglespec.layers.logprobs import SMALL_TOP, step_alternatives

    assert [step_alternatives(a, 20) for a in (0, 1, 5, 6, 20)] == [5, 5, 5, 20, 20]
    assert [step_alternatives(a, 3) for a in (0, 3)] == [3, 3] and step_alternatives(0, 0) == 0
    computed: list[int] = []
    real = logprob_buffer.token_logprobs
    monkeypatch.setattr(logprob_buffer, "token_logprobs", lambda x, t, k: computed.append(k) or real(x, t, k))
    eng = Engine(target, None, EngineConfig(max_batch_size=2, max_logprobs=12))
    params = [SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=2),
              SamplingParams(max_new_tokens=4, ignore_eos=True, logprobs=9)]  # ends first: the rest compute 5
    outs = eng.generate(PROMPTS[:2], params)
    assert set(computed) == {SMALL_TOP, 12} and computed[-1] == SMALL_TOP
    for o, ref, prompt, p in zip(outs, plain, PROMPTS, params):
        r = reference_logprobs(target, prompt, o.token_ids)
        assert o.token_ids == ref.token_ids[: len(o.token_ids)]
        for j, e in enumerate(o.logprobs):
            top = r[j].topk(p.logprobs)
            assert e.logprob == pytest.approx(r[j, e.token].item(), abs=FORWARD_TOL)
            assert [i for i, _ in e.top] == top.indices.tolist()
            assert [v for _, v in e.top] == pytest.approx(top.values.tolist(), abs=FORWARD_TOL)


def test_warmup_captures_the_logprob_steps_when_asked(target, drafter, monkeypatch):
    """`Engine.warmup(..., logprobs=True)` (serve --warmup-logprobs): every step graph and prefill graph also in its
    log-probability form; without it only the plain forms (the captures are recorded, not made)."""
    eng = static_engine(target, drafter, SpecConfig(3, 1, 4), rows=2)
    eng.reserve(2, 300)
    g = eng.runner.graphs
    g.capture = True
    captured: list = []
    monkeypatch.setattr(g, "_capture", lambda key: captured.append(key) or g.graphs.__setitem__(key, []))
    n_plain = eng.warmup([1, 2])
    assert n_plain == len(captured) and {k[-2:] for k in captured} == {(None, StepExtras())}
    n_lp = eng.warmup([1, 2], logprobs=True)  # the plain forms are held: only the lp forms are new, two of each
    lp_keys = captured[n_plain:]
    assert n_lp == 2 * n_plain and {k[:-2] for k in lp_keys} == {k[:-2] for k in captured[:n_plain]}
    assert sorted(k[-2] for k in lp_keys) == [5] * n_plain + [20] * n_plain  # a few alternatives, or the most
    n_st = eng.warmup([1, 2], structured=True)  # and the constrained forms (serve --warmup-structured)
    st_keys = captured[n_plain + n_lp:]
    assert n_st == n_plain and {k[:-1] for k in st_keys} == {k[:-1] for k in captured[:n_plain]}
    assert {k[-1] for k in st_keys} == {StepExtras(constrained=True)} and eng.runner.grammar_rows is not None


def test_score_gives_each_prompt_tokens_logprob(target, drafter, monkeypatch):
    """`Engine.score` (a server's echo): one cache-free forward, in chunks of positions; the first token has none;
    the engine's running requests are untouched (a speculative engine mid-generation still answers as plain)."""
    ids = list(range(3, 40))
    ref = reference_logprobs(target, ids[:1], ids[1:])  # row j: token j + 1 given the ones before it
    eng = Engine(target, None, EngineConfig(), drafter=drafter, spec=SpecConfig(3, 1, 4))
    from eaglespec.engine import scoring

    monkeypatch.setattr(scoring, "SCORE_CHUNK", 8)  # several chunks
    req = eng.add_request(PROMPTS[2], GREEDY)
    eng.step()
    eng.step()  # mid-generation
    entries = eng.score(ids, 2)
    assert entries[0].token == ids[0] and entries[0].logprob is None
    assert [e.token for e in entries] == ids
    assert [e.logprob for e in entries[1:]] == pytest.approx([ref[j, ids[j + 1]].item() for j in range(len(ids) - 1)],
                                                             abs=FORWARD_TOL)
    assert all(len(e.top) == 2 for e in entries[1:])
    while eng.has_work():
        eng.step()
    assert req.output().token_ids == Engine(target, None).generate([PROMPTS[2]], GREEDY)[0].token_ids
    with pytest.raises(RequestError, match="the prompt is empty"):
        eng.score([], 0)
    with pytest.raises(RequestError, match="this engine computes no log-probabilities"):
        Engine(target, None, EngineConfig(max_logprobs=None)).score(ids, 0)
