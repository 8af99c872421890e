"""Prefix reuse (engine/scheduler.py): a prompt that starts with what a free row's cache holds prefills only the rest,
and every answer stays the one a whole prefill gives (float32, CPU: the eager path, which keeps free rows intact)."""

from __future__ import annotations

import pytest
import torch

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.runner import ModelRunner
from eaglespec.sampling_params import SamplingParams

SPECS = [None, SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)]


def engine(target, drafter, spec, reuse: bool = True, rows: int = 2, max_len: int = 160) -> Engine:
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, reuse_prefixes=reuse),
                 drafter=drafter if spec is not None else None, spec=spec)
    eng.reserve(rows, max_len)
    return eng


def run(eng: Engine, prompts, params) -> list:
    """Requests submitted together, run to the end: their outputs, in order."""
    reqs = [eng.add_request(p, params, chat=False) for p in prompts]
    while eng.has_work():
        eng.step()
    return [q.output() for q in reqs]


GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)


def _id(spec) -> str:
    return "plain" if spec is None else f"S{spec.steps}K{spec.topk}D{spec.draft_tokens}"


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_a_conversations_next_turn_prefills_only_its_new_tokens(target, drafter, spec):
    """Each turn's prompt is the last one's prompt and answer plus new tokens: it reuses all of them but the last
    token's entries (whose drafter pair needs the next token; speculation may have computed one more) and answers as
    an engine that prefills it whole; a prompt sharing only its first 10 tokens reuses 9."""
    eng, cold = engine(target, drafter, spec), engine(target, drafter, spec, reuse=False)
    prompt, held = list(range(1, 21)), 0
    for turn in range(3):
        counted = eng.step_counts["reused tokens"]
        out, want = run(eng, [prompt], GREEDY)[0], run(cold, [prompt], GREEDY)[0]
        assert out.token_ids == want.token_ids and len(set(out.token_ids)) > 3
        assert want.cached_tokens == 0 and "reused tokens" not in cold.step_counts
        assert (out.cached_tokens == 0) if turn == 0 else (held - 2 <= out.cached_tokens <= held - 1)
        assert eng.step_counts["reused tokens"] - counted == out.cached_tokens
        held = len(prompt) + len(out.token_ids)
        prompt = prompt + out.token_ids + [40 + turn, 50 + turn]
    short = prompt[:10] + [90, 91, 92]
    got, ref = run(eng, [short], GREEDY)[0], run(cold, [short], GREEDY)[0]
    assert got.token_ids == ref.token_ids and got.cached_tokens == 9
    if spec is not None:
        assert eng.stats.verify_steps > 0


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_one_prefill_mixes_reused_and_whole_prompts_near_the_caches_end(target, drafter, spec):
    """Two prompts in one prefill, one after a long reused prefix (a 2-token chunk), one whole and long: the short
    chunk is padded to the long one's length past its row's cache (its padding folded onto the last slot), and both
    answers are a whole prefill's."""
    eng, cold = engine(target, drafter, spec, max_len=64), engine(target, drafter, spec, reuse=False, max_len=64)
    first = [list(range(1, 41)), [3, 1, 4, 1, 5, 9]]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    outs = run(eng, first, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in run(cold, first, params)]
    follow = first[0] + outs[0].token_ids[:4] + [9]  # 45 tokens, 43 of them held by row 0
    fresh = [(7 * i) % 90 + 2 for i in range(50)]  # 50 tokens, nothing held: starts at 0
    prefills = eng.step_counts["prefill"]
    outs = run(eng, [follow, fresh], params)
    assert eng.step_counts["prefill"] == prefills + 1  # one prefill took both
    assert [o.cached_tokens for o in outs] == [43, 0]
    assert 43 + 50 > eng.runner.cache_len  # the padded chunk ran past the cache
    assert [o.token_ids for o in outs] == [o.token_ids for o in run(cold, [follow, fresh], params)]


@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4)], ids=_id)
def test_sampled_penalized_requests_with_logprobs_draw_as_after_a_whole_prefill(target, drafter, spec):
    """A seeded sampled request under a frequency penalty, asking for log-probabilities, after a reused prefix: its
    draws are keyed by the whole prompt's length, its counts and entries are the same, so its answer is too."""
    params = SamplingParams(max_new_tokens=10, ignore_eos=True, temperature=0.9, seed=7, frequency_penalty=0.6,
                            logprobs=2)
    eng, cold = engine(target, drafter, spec), engine(target, drafter, spec, reuse=False)
    prompt = list(range(5, 25))
    for e in (eng, cold):
        run(e, [prompt], GREEDY)
    follow = prompt + [60, 61]
    got, want = run(eng, [follow], params)[0], run(cold, [follow], params)[0]
    assert got.cached_tokens == len(prompt) - 1 and want.cached_tokens == 0
    assert got.token_ids == want.token_ids
    assert [e.logprob for e in got.logprobs] == pytest.approx([e.logprob for e in want.logprobs], abs=1e-4)
    # a stop token chosen first after a reused prefix ends the answer at once, as after a whole prefill
    first = run(cold, [follow], GREEDY)[0].token_ids[0]
    stops = SamplingParams(max_new_tokens=5, stop_token_ids=[first])
    for e in (eng, cold):
        out = run(e, [follow], stops)[0]
        assert out.token_ids == [] and out.finish_reason == "stop"
    assert out.cached_tokens == 0 and eng.step_counts["reused tokens"] >= 2 * len(prompt)


def test_nothing_is_reused_where_free_rows_are_not_kept(target, drafter, monkeypatch):
    """Off (`reuse_prefixes` false, or unsaid on a device where it measured slower: CUDA's eager SmolLM2, 34 against
    18 ms), after `forget_prefixes`, and where the steps overwrite free rows (the graph path:
    `ModelRunner.keeps_free_rows` false) every prompt prefills whole."""
    import eaglespec.assets as assets

    assert assets.reuses_prefixes("cpu") and not assets.reuses_prefixes("cuda")
    prompt = list(range(1, 21))
    off = engine(target, drafter, SpecConfig(3, 1, 4), reuse=False)
    assert [run(off, [prompt], GREEDY)[0].cached_tokens for _ in range(2)] == [0, 0]
    eng = engine(target, drafter, SpecConfig(3, 1, 4))
    run(eng, [prompt], GREEDY)
    eng.forget_prefixes()
    assert run(eng, [prompt], GREEDY)[0].cached_tokens == 0
    assert run(eng, [prompt], GREEDY)[0].cached_tokens == len(prompt) - 1  # kept again after that run
    monkeypatch.setattr(assets, "_REUSES_PREFIXES", frozenset())  # unsaid: as on CUDA
    unsaid = Engine(target, None, EngineConfig(max_batch_size=2), drafter=drafter, spec=SpecConfig(3, 1, 4))
    assert [run(unsaid, [prompt], GREEDY)[0].cached_tokens for _ in range(2)] == [0, 0]
    monkeypatch.setattr(ModelRunner, "keeps_free_rows", property(lambda self: False))
    graphs = engine(target, drafter, SpecConfig(3, 1, 4))
    assert [run(graphs, [prompt], GREEDY)[0].cached_tokens for _ in range(2)] == [0, 0]
    assert graphs.scheduler.kept == {}


@pytest.mark.parametrize("spec", SPECS[1:], ids=_id)
def test_the_drafters_state_after_a_reused_prefix_is_a_whole_prefills(target, drafter, spec):
    """Speculation stays lossless whatever the drafter guesses, so its state is checked itself: after a prefill that
    reused a prefix (the target's and the drafter's entries below the shared prefix less one) the drafter's top
    tokens, hidden state and depth-1 logits equal a whole prefill's (a stale drafter entry would lower acceptance
    without changing any answer)."""
    eng, cold = engine(target, drafter, spec), engine(target, drafter, spec, reuse=False)
    prompt = list(range(1, 21))
    for e in (eng, cold):
        run(e, [prompt], GREEDY)
    ended = SamplingParams(max_new_tokens=1)  # ends on its prefill's token: the row's drafter state is the prefill's
    for follow in (prompt + [33, 34, 35], prompt[:12] + [70]):
        got, want = run(eng, [follow], ended)[0], run(cold, [follow], ended)[0]
        assert got.cached_tokens > 0 and got.token_ids == want.token_ids
        a, b = eng.runner.draft, cold.runner.draft
        assert torch.equal(a.top_ids[0], b.top_ids[0])
        torch.testing.assert_close(a.hidden[0], b.hidden[0], atol=1e-4, rtol=1e-4)
        if a.logits is not None:
            torch.testing.assert_close(a.logits[0], b.logits[0], atol=1e-4, rtol=1e-4)


def test_kept_rows_survive_the_caches_growing(target, drafter):
    """`Engine.generate` sizes the caches to its requests: a conversation's growing prompts grow them, and the rows
    kept for reuse are copied into the larger caches (target and drafter), so the next turn still reuses them."""
    spec = SpecConfig(3, 1, 4)
    eng = Engine(target, None, EngineConfig(max_batch_size=1), drafter=drafter, spec=spec)
    cold = Engine(target, None, EngineConfig(max_batch_size=1, reuse_prefixes=False), drafter=drafter, spec=spec)
    prompt = list(range(1, 21))
    for turn in range(3):
        size = eng.runner.max_len
        out = eng.generate([prompt], GREEDY, chat=False)[0]
        assert out.token_ids == cold.generate([prompt], GREEDY, chat=False)[0].token_ids
        if turn:
            assert eng.runner.max_len > size and out.cached_tokens >= len(prompt) - 4  # grew, and still reused
        prompt = prompt + out.token_ids + [40 + turn, 50 + turn]


def test_another_conversation_in_between_leaves_the_first_ones_row(target, drafter):
    """Two rows, one request at a time: conversation A, then an unrelated prompt B, then A's next turn. B takes the
    row that keeps nothing, so A's next turn still finds its row."""
    eng = engine(target, drafter, SpecConfig(3, 1, 4))
    a, b = list(range(1, 21)), list(range(60, 75))
    first = run(eng, [a], GREEDY)[0]
    assert run(eng, [b], GREEDY)[0].cached_tokens == 0
    follow = a + first.token_ids + [33]
    assert run(eng, [follow], GREEDY)[0].cached_tokens >= len(a) + len(first.token_ids) - 2


def test_an_eager_step_takes_the_shape_of_the_rows_it_runs(target, drafter):
    """A request alone in row 1 (row 0 kept for its conversation) takes a schedule's one-row shape: eager steps
    compute only their rows, wherever they lie (graph steps cover rows 0..max and take that many rows' shape)."""
    from eaglespec.spec_schedule import SpecSchedule

    chain, tree = SpecConfig(3, 1, 4), SpecConfig(4, 2, 6)
    eng = engine(target, drafter, SpecSchedule(((1, chain), (2, tree))))
    run(eng, [list(range(1, 21))], GREEDY)
    assert eng.step_counts["spec 3,1,4"] > 0 and eng.step_counts["spec 4,2,6"] == 0
    req = eng.add_request(list(range(60, 75)), GREEDY, chat=False)
    while eng.has_work():
        eng.step()
    assert req.slot == 1 and eng.step_counts["spec 4,2,6"] == 0
    run(eng, [list(range(30, 40)), list(range(40, 50))], GREEDY)  # two rows: the tree
    assert eng.step_counts["spec 4,2,6"] > 0
