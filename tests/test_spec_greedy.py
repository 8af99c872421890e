"""The central invariant: greedy speculative output equals plain greedy output, token for token (float32, CPU)."""

from __future__ import annotations

import pytest
import torch
from tiny import CharTokenizer, tiny_drafter, tiny_llama

from eaglespec.config import EngineConfig, SpecConfig

from eaglespec.spec_schedule import SpecSchedule
from eaglespec.errors import ConfigError
from eaglespec.engine.engine import Engine
from eaglespec.sampling_params import SamplingParams
from eaglespec.spec.oracle import OracleDrafter

CONFIGS = [SpecConfig(1, 1, 2), SpecConfig(3, 1, 4), SpecConfig(4, 1, 3), SpecConfig(5, 4, 8), SpecConfig(6, 8, 32)]
# (S4 K1 D3: a chain that verifies fewer tokens than it drafts)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40)), [5]]


@pytest.fixture(scope="module")
def reference(target):
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    return [o.token_ids for o in Engine(target, None).generate(PROMPTS, params)]


def test_reference_is_not_degenerate(reference):
    # the invariant means little if the target repeats one token
    assert all(len(set(r)) > 8 for r in reference)


@pytest.mark.parametrize("spec", CONFIGS, ids=lambda s: f"S{s.steps}K{s.topk}D{s.draft_tokens}")
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_spec_equals_plain(target, drafter, reference, spec, batch):
    eng = Engine(target, None, EngineConfig(), drafter=drafter, spec=spec)
    outs = eng.generate(PROMPTS[:batch], SamplingParams(max_new_tokens=48, ignore_eos=True))
    for o, ref in zip(outs, reference):
        assert o.token_ids == ref
    assert eng.stats.verify_steps > 0


@pytest.mark.parametrize("spec", CONFIGS[1:], ids=lambda s: f"S{s.steps}K{s.topk}D{s.draft_tokens}")
def test_eos_inside_accepted_run(target, reference, spec):
    """With the oracle every draft is accepted, so the EOS lands inside an accepted run; output stops right before."""
    refs = [p + r for p, r in zip(PROMPTS, reference)]
    # choose as EOS a token first appearing late in row 0; other rows stop at their first occurrence of it
    eos = next(t for i, t in enumerate(reference[0]) if i >= 10 and t not in reference[0][:i])
    eng = Engine(target, None, drafter=OracleDrafter(target.config, refs), spec=spec)
    eng.eos_ids = (eos,)
    outs = eng.generate(PROMPTS, SamplingParams(max_new_tokens=48))
    for o, ref in zip(outs, reference):
        expected = ref[: ref.index(eos)] if eos in ref else ref
        assert o.token_ids == expected
        assert o.finish_reason == ("stop" if eos in ref else "length")
    assert eng.stats.accept_length_mean > 2


@pytest.mark.parametrize("spec", CONFIGS[1:], ids=lambda s: f"S{s.steps}K{s.topk}D{s.draft_tokens}")
def test_max_tokens_and_stop_string_inside_accepted_run(target, reference, spec):
    tok = CharTokenizer(target.config.vocab_size)
    refs = [p + r for p, r in zip(PROMPTS, reference)]
    eng = Engine(target, tok, drafter=OracleDrafter(target.config, refs), spec=spec)
    # max tokens: 7 is not a multiple of any tau, so the budget ends inside a run
    outs = eng.generate(PROMPTS, SamplingParams(max_new_tokens=7, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r[:7] for r in reference]
    assert all(o.finish_reason == "length" for o in outs)
    # stop string: the text of tokens 9..10 of row 0
    full = tok.decode(reference[0])
    stop = tok.decode(reference[0][9:11])
    cut = full.index(stop)
    eng2 = Engine(target, tok, drafter=OracleDrafter(target.config, refs[:1]), spec=spec)
    o = eng2.generate(PROMPTS[:1], SamplingParams(max_new_tokens=48, stop=(stop,), ignore_eos=True))[0]
    assert o.text == full[:cut]
    assert o.finish_reason == "stop"
    assert o.token_ids == reference[0][: cut + len(stop)]
    # vLLM's include_stop_str_in_output: the text ends with the stop string, the tokens are the same
    o = eng2.generate(PROMPTS[:1], SamplingParams(max_new_tokens=48, stop=(stop,), ignore_eos=True,
                                                  include_stop_str_in_output=True))[0]
    assert o.text == full[: cut + len(stop)] and o.finish_reason == "stop"
    assert o.token_ids == reference[0][: cut + len(stop)]


@pytest.mark.parametrize("spec", CONFIGS[1:], ids=lambda s: f"S{s.steps}K{s.topk}D{s.draft_tokens}")
def test_oracle_reaches_max_acceptance(target, reference, spec):
    refs = [p + r for p, r in zip(PROMPTS, reference)]
    eng = Engine(target, None, drafter=OracleDrafter(target.config, refs), spec=spec)
    n = 6 * spec.max_accept + 1  # prefill token + whole steps, never reaching the reference's end
    outs = eng.generate(PROMPTS, SamplingParams(max_new_tokens=n, ignore_eos=True))
    assert [o.token_ids for o in outs] == [r[:n] for r in reference]
    for o in outs:
        assert o.stats.hist[spec.max_accept] == o.stats.verify_steps == 6
    assert eng.stats.accept_length_mean == spec.max_accept
    assert eng.stats.depth_rates() == [1.0] * (spec.max_accept - 1)


def test_continuous_batching_admits_new_requests(target, drafter, reference):
    """Requests added while others run (more requests than rows) still give the plain greedy output."""
    eng = Engine(target, None, EngineConfig(max_batch_size=2), drafter=drafter, spec=SpecConfig(4, 2, 6))
    reqs = [eng.add_request(p, SamplingParams(max_new_tokens=48, ignore_eos=True)) for p in PROMPTS]
    while eng.has_work():
        eng.step()
    assert [r.output_ids for r in reqs] == reference


@pytest.mark.parametrize("overlap", [False, True], ids=["eager", "static-overlap"])
@pytest.mark.parametrize("spec", [None, SpecConfig(4, 2, 6)], ids=["plain", "spec"])
def test_abort_frees_the_row_and_changes_no_other_answer(target, drafter, reference, overlap, spec):
    """`Engine.abort` (a server's client went away): a waiting request finishes at once with no tokens, a running
    one at its next step with a prefix of its answer; the others' answers are unchanged, every row frees, and a
    finished request is left alone. On the eager path and the static graph path with overlap (a launched step
    is in flight when the abort comes)."""
    from eaglespec.engine.cuda_graphs import GraphCache

    eng = Engine(target, None, EngineConfig(max_batch_size=2, overlap=overlap),
                 drafter=drafter if spec is not None else None, spec=spec)
    if overlap:
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
    reqs = [eng.add_request(p, SamplingParams(max_new_tokens=48, ignore_eos=True)) for p in PROMPTS]
    for _ in range(4):  # two rows: requests 0 and 1 run, 2 and 3 wait
        eng.step()
    assert reqs[0].output_ids and not reqs[3].output_ids
    eng.abort(reqs[0])
    eng.abort(reqs[3])
    assert reqs[3].finish_reason == "abort" and reqs[3].output_ids == []
    while eng.has_work():
        eng.step()
    n = len(reqs[0].output_ids)
    assert reqs[0].finish_reason == "abort" and 0 < n < 48 and reqs[0].output_ids == reference[0][:n]
    assert [r.output_ids for r in reqs[1:3]] == reference[1:3]
    assert not eng.scheduler.running and sorted(eng.scheduler.free) == [0, 1]
    eng.abort(reqs[1])
    assert reqs[1].finish_reason == "length"


@pytest.mark.parametrize("spec", [SpecConfig(5, 4, 8), SpecConfig(3, 1, 4)], ids=["tree", "chain"])
def test_mixed_greedy_and_sampling_batch(target, drafter, reference, spec):
    """A greedy row in a batch that also samples still gets exactly the greedy output (chains sample the other
    rows' drafts from the drafter and draft the greedy row's deterministically)."""
    eng = Engine(target, None, drafter=drafter, spec=spec)
    params = [SamplingParams(max_new_tokens=48, ignore_eos=True),
              SamplingParams(max_new_tokens=48, ignore_eos=True, temperature=1.0)]
    outs = eng.generate(PROMPTS[:2], params)
    assert outs[0].token_ids == reference[0]
    assert len(outs[1].token_ids) == 48


def test_spec_stream_equals_generate(target, drafter, reference):
    tok = CharTokenizer(target.config.vocab_size)
    eng = Engine(target, tok, drafter=drafter, spec=SpecConfig(3, 1, 4))
    text = "".join(eng.stream(PROMPTS[2], SamplingParams(max_new_tokens=48, ignore_eos=True)))
    assert text == tok.decode(reference[2])


def test_untied_and_full_vocab_drafter(reference):
    """A drafter without a draft vocabulary uses the target's lm_head; still lossless."""
    t = tiny_llama(seed=0)
    d = tiny_drafter(t, seed=3, draft_vocab=None)
    eng = Engine(t, None, drafter=d, spec=SpecConfig(4, 3, 10))
    outs = eng.generate(PROMPTS, SamplingParams(max_new_tokens=48, ignore_eos=True))
    assert [o.token_ids for o in outs] == reference
    assert d.lm_head.weight is t.lm_head.weight


def run_logging_kinds(eng: Engine, lengths: list[int]) -> tuple[list, list[str]]:
    """Queue PROMPTS with these token budgets and run the engine dry; returns the requests and each step's kind."""
    reqs = [eng.add_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True)) for p, n in zip(PROMPTS, lengths)]
    kinds: list[str] = []
    step_kind = eng._step_kind
    eng._step_kind = lambda *a: kinds.append(step_kind(*a)) or step_kind(*a)
    while eng.has_work():
        eng.step()
    return reqs, kinds


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(4, 2, 6)], ids=["chain", "tree"])
def test_speculating_by_load_equals_plain_greedy(target, drafter, reference, spec):
    """`EngineConfig.spec_max_rows`: plain decode steps while more rows run (keeping the drafter in step), speculative
    steps once few enough do, back and forth as requests finish and join; still plain greedy token for token."""
    eng = Engine(target, None, EngineConfig(max_batch_size=3, spec_max_rows=1), drafter=drafter, spec=spec)
    lengths = [48, 12, 30, 48, 20, 40]
    reqs, kinds = run_logging_kinds(eng, lengths)
    assert [r.output_ids for r in reqs] == [ref[:n] for ref, n in zip(reference, lengths)]
    assert "spec" in kinds and "decode" in kinds


SCHEDULE = SpecSchedule(((1, SpecConfig(3, 1, 4)), (2, SpecConfig(4, 2, 6)), (8, SpecConfig(2, 3, 5))))


@pytest.mark.parametrize("overlap,graphs", [(False, False), (True, True)], ids=["eager", "static-overlap"])
def test_a_schedule_of_shapes_equals_plain_greedy(target, drafter, reference, overlap, graphs):
    """`SpecSchedule`: each step takes the shape scheduled for its rows (here a chain while only row 0 runs, trees of
    two K's once more do), switching back and forth as requests finish and join, on the eager path and on the static
    graph path with overlap; the drafter's state after any shape serves the next; still plain greedy token for
    token, and every shape ran."""
    from eaglespec.engine.cuda_graphs import GraphCache

    eng = Engine(target, None, EngineConfig(max_batch_size=3, overlap=overlap), drafter=drafter, spec=SCHEDULE)
    assert eng.runner.shapes == SCHEDULE.shapes and eng.runner.spec == SpecConfig(4, 3, 6)  # the envelope
    assert eng.spec == SpecConfig(3, 1, 4)
    if graphs:
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
    lengths = [48, 12, 20, 16]  # 3 rows, then rows 0-1 (the 4th request joins row 1), then row 0 alone
    reqs, kinds = run_logging_kinds(eng, lengths)
    assert [r.output_ids for r in reqs] == [ref[:n] for ref, n in zip(reference, lengths)]
    assert {"spec", "spec1", "spec2"} <= set(kinds)
    per_shape = {k: v for k, v in eng.step_counts.items() if k.startswith("spec ")}  # what a bench reports
    assert set(per_shape) == {"spec 3,1,4", "spec 4,2,6", "spec 2,3,5"}
    assert sum(per_shape.values()) == eng.step_counts["spec"]
    st = eng.stats  # each request's step counts the drafter forwards of the shape it ran (S = 3, 4 or 2)
    assert 2 * st.verify_steps < st.draft_forwards < 4 * st.verify_steps and st.draft_forwards != 3 * st.verify_steps


def test_schedule_picks_by_the_highest_row():
    s = SCHEDULE
    assert [s.shape_index(r) for r in (1, 2, 3, 8, 9, 100)] == [0, 1, 2, 2, 2, 2]
    assert SpecSchedule.of(SpecConfig(3, 1, 4)).shapes == (SpecConfig(3, 1, 4),)
    with pytest.raises(ConfigError, match="increasing"):
        SpecSchedule(((8, SpecConfig()), (4, SpecConfig())))
    with pytest.raises(ConfigError, match="increasing"):
        SpecSchedule(())


    two = SpecSchedule(((2, SpecConfig(3, 1, 4)), (8, SpecConfig(4, 2, 6))), sampled=((8, SpecConfig(2, 1, 3)),))
    assert [two.shape(r, g) for r, g in ((1, True), (3, True), (1, False), (3, False))] == [
        SpecConfig(3, 1, 4), SpecConfig(4, 2, 6), SpecConfig(2, 1, 3), SpecConfig(2, 1, 3)]
    assert two.shapes == (SpecConfig(3, 1, 4), SpecConfig(4, 2, 6), SpecConfig(2, 1, 3)) and two.single is None
    plain = SpecSchedule(((8, SpecConfig(4, 2, 6)),), sampled=())  # sampled steps decode plainly
    assert plain.shape_index(1, greedy=False) is None and plain.shape_index(1) == 0 and plain.single is None
    assert SpecSchedule.of(SpecConfig(3, 1, 4)).single == SpecConfig(3, 1, 4)
    with pytest.raises(ConfigError, match="sampled row limits >= 1 in increasing order"):
        SpecSchedule(((8, SpecConfig()),), sampled=((4, SpecConfig()), (2, SpecConfig())))


TWO_MODES = SpecSchedule(((8, SpecConfig(4, 2, 6)),), sampled=((8, SpecConfig(3, 1, 4)),))


@pytest.mark.parametrize("overlap,graphs", [(False, False), (True, True)], ids=["eager", "static-overlap"])
def test_greedy_and_sampled_steps_take_their_own_shapes(target, drafter, reference, overlap, graphs):
    """`SpecSchedule.sampled`: a step where any row samples takes the sampled entries' shape (here the chain of 3),
    a step of greedy rows only the greedy entries' (the tree), switching as the sampled request finishes; the greedy
    rows still get plain greedy's tokens, and both shapes ran."""
    from eaglespec.engine.cuda_graphs import GraphCache

    eng = Engine(target, None, EngineConfig(max_batch_size=3, overlap=overlap), drafter=drafter, spec=TWO_MODES)
    if graphs:
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
    greedy = [eng.add_request(p, SamplingParams(max_new_tokens=48, ignore_eos=True)) for p in PROMPTS[:2]]
    sampled = eng.add_request(PROMPTS[2], SamplingParams(max_new_tokens=16, ignore_eos=True, temperature=1.0,
                                                         seed=7))
    while eng.has_work():
        eng.step()
    assert [r.output_ids for r in greedy] == reference[:2] and len(sampled.output_ids) == 16
    assert eng.step_counts["spec 3,1,4"] > 0 and eng.step_counts["spec 4,2,6"] > 0
    assert eng.step_counts["decode"] == 0


def test_sampled_steps_decode_plainly_where_the_schedule_says_so(target, drafter, reference):
    """`sampled=()`: steps holding a sampled row decode plainly (the drafter kept in step), giving a seeded request
    what a plain engine gives it; greedy requests on the same engine still speculate, to plain greedy's tokens."""
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=1.0, seed=11)
    want = Engine(target, None).generate([PROMPTS[0]], params)[0].token_ids
    eng = Engine(target, None, EngineConfig(max_batch_size=2), drafter=drafter,
                 spec=SpecSchedule(((8, SpecConfig(4, 2, 6)),), sampled=()))
    assert eng.generate([PROMPTS[0]], params)[0].token_ids == want
    assert eng.step_counts["spec"] == 0 and eng.step_counts["decode"] > 0
    out = eng.generate([PROMPTS[1]], SamplingParams(max_new_tokens=48, ignore_eos=True))[0]
    assert out.token_ids == reference[1] and eng.step_counts["spec"] > 0


@pytest.mark.parametrize("overlap,graphs", [(False, False), (True, True)], ids=["eager", "static-overlap"])
def test_steps_under_count_penalties_take_the_penalized_entries(target, drafter, overlap, graphs):
    """`SpecSchedule.penalized`: a step where any row has a count penalty takes the penalized entries (here plain
    decoding, as CUDA's auto does), the others their mode's shapes; the penalized request gets plain decoding's
    tokens under its penalties, the greedy one plain greedy's, and speculation resumes once the penalized request
    finishes. A penalized shape of its own runs instead where the schedule gives one."""
    from eaglespec.engine.cuda_graphs import GraphCache

    pen = SamplingParams(max_new_tokens=20, ignore_eos=True, frequency_penalty=0.5, repetition_penalty=1.2)
    free = SamplingParams(max_new_tokens=48, ignore_eos=True)
    plain = Engine(target, None, EngineConfig(max_batch_size=2))
    want = [o.token_ids for o in plain.generate(PROMPTS[:2], [pen, free])]
    for penalized, ran in (((), "decode"), (((8, SpecConfig(2, 1, 3)),), "spec 2,1,3")):
        spec = SpecSchedule(((8, SpecConfig(4, 2, 6)),), penalized=penalized)
        eng = Engine(target, None, EngineConfig(max_batch_size=2, overlap=overlap), drafter=drafter, spec=spec)
        if graphs:
            eng.runner.graphs = GraphCache(eng.runner, capture=False)
        assert [o.token_ids for o in eng.generate(PROMPTS[:2], [pen, free])] == want
        assert eng.step_counts[ran] > 0 and eng.step_counts["spec"] > 0  # the greedy row speculates on alone
    assert SamplingParams(presence_penalty=0.1).penalized and not SamplingParams(min_p=0.1).penalized


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(4, 2, 6)], ids=["chain", "tree"])
def test_plain_steps_keep_the_drafter_in_step(target, drafter, spec):
    """After plain decode steps of a speculative engine (more rows than `spec_max_rows`), a row's drafter state is
    what a catch-up over its whole text gives: the same top draft tokens and hidden as a fresh engine that prefills
    that text. So the speculative steps that follow draft from an up-to-date drafter."""
    eng = Engine(target, None, EngineConfig(max_batch_size=2, spec_max_rows=1), drafter=drafter, spec=spec)
    reqs = [eng.add_request(p, SamplingParams(max_new_tokens=9, ignore_eos=True)) for p in PROMPTS[:2]]
    while eng.has_work():
        eng.step()  # both rows run to the end together: every step after the prefill is a plain one
    for q in reqs:
        text = q.prompt_ids + q.output_ids  # the last token is the next root, not yet in the caches
        fresh = Engine(target, None, EngineConfig(max_batch_size=1), drafter=drafter, spec=spec)
        ref = fresh.add_request(text[:-1], SamplingParams(max_new_tokens=1, ignore_eos=True))
        while fresh.has_work():
            fresh.step()
        assert ref.output_ids == [text[-1]]
        a, b = eng.runner, fresh.runner
        a, b = a.draft, b.draft
        assert torch.equal(a.top_ids[q.slot], b.top_ids[ref.slot])
        if spec.topk > 1:  # trees keep the top-K log-probabilities, chains the depth-1 logits
            assert torch.allclose(a.top_logp[q.slot], b.top_logp[ref.slot], rtol=1e-4, atol=1e-4)
        else:
            assert a.top_logp is None
            assert torch.allclose(a.logits[q.slot], b.logits[ref.slot], rtol=1e-4, atol=1e-4)
        assert torch.allclose(a.hidden[q.slot], b.hidden[ref.slot], rtol=1e-4, atol=1e-4)  # |h| ~ 30


def test_spec_max_rows_must_be_positive():
    from eaglespec.errors import ConfigError
    with pytest.raises(ConfigError, match="spec_max_rows must be >= 1"):
        EngineConfig(spec_max_rows=0)
