"""Repetition loops (repetition.py) and `SamplingParams.stop_loop`: a request ends right before the first output
token deeper than N tokens into a loop, whatever the step that commits it (one token of plain decoding, an accepted
run of speculation, a batch of rows finishing at different steps), and regeneration's `--regen-stop-loop` ends the
target's answers there (a loss `--loop-keep N` would mask anyway)."""

from __future__ import annotations

import pytest
from tiny import tiny_drafter, tiny_llama

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.request import Request
from eaglespec.errors import RequestError
from eaglespec.repetition import LoopTracker
from eaglespec.sampling_params import SamplingParams
from eaglespec.spec.oracle import OracleDrafter
from eaglespec.train.dataset import mask_loops

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40)), [5]]
LIMIT = 6


def loop_cut(ids: list[int], limit: int) -> int:
    """Index of the first token deeper than `limit` into a loop (len(ids) when none is)."""
    loops = LoopTracker()
    return next((i for i, t in enumerate(ids) if loops.add(t) > limit), len(ids))


def test_tracker_counts_loop_runs_as_the_loss_mask_does():
    ids = list(range(100, 110)) + [5, 6, 7] * 10
    loops = LoopTracker()
    runs = [loops.add(t) for t in ids]
    # the 8-gram ending at 17 (5 6 7 5 6 7 5 6) comes again at 20: from there every token repeats one
    assert runs[:20] == [0] * 20 and runs[20:] == list(range(1, 21))
    assert mask_loops(ids, [True] * len(ids), keep=4)[0] == [r <= 4 for r in runs]
    loops.add(99)  # a fresh gram ends the run
    assert loops.run == 0 and loops.add(5) == 0


@pytest.mark.parametrize("split", [1, 3, 7, 40])
def test_request_stops_before_the_first_token_past_the_limit(split):
    """Tokens committed one at a time or several per step: the output ends at the same token, reason "loop"; the
    token past the limit and everything after it are dropped."""
    ids = list(range(100, 110)) + [5, 6, 7] * 10
    q = Request(0, [1], SamplingParams(max_new_tokens=100, stop_loop=4), eos_ids=(99,))
    for i in range(0, len(ids), split):
        q.append(ids[i : i + split])
        if q.finished:
            break
    assert q.output_ids == ids[:24] and q.finish_reason == "loop"  # runs 1..4 at 20..23, 5 at 24
    plain = Request(0, [1], SamplingParams(max_new_tokens=len(ids)), eos_ids=(99,))
    plain.append(ids)
    assert plain.output_ids == ids and plain.finish_reason == "length"  # 0: off
    with pytest.raises(RequestError, match="stop_loop must be >= 0"):
        SamplingParams(stop_loop=-1)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, std=0.1)  # small weights: greedy answers that fall into loops


@pytest.fixture(scope="module")
def reference(target):
    outs = Engine(target, None).generate(PROMPTS, SamplingParams(max_new_tokens=120, ignore_eos=True))
    return [o.token_ids for o in outs]


def test_reference_loops(reference):
    # every row goes deeper than LIMIT into a loop, at different points (rows finish at different steps)
    cuts = [loop_cut(r, LIMIT) for r in reference]
    assert all(c < len(r) for c, r in zip(cuts, reference)) and len(set(cuts)) == len(cuts)


@pytest.mark.parametrize("drafter_kind", ["none", "tiny", "oracle"])
@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(4, 4, 8)], ids=["chain", "tree"])
def test_engine_ends_answers_in_loops_at_the_same_token(target, reference, drafter_kind, spec):
    """Plain decoding, a tiny drafter (few accepted) and the oracle (every draft accepted, so the stop falls inside
    an accepted run), 4 rows: each answer is the plain answer up to its loop cut."""
    drafter = {"none": None, "tiny": tiny_drafter(target, seed=1),
               "oracle": OracleDrafter(target.config, [p + r for p, r in zip(PROMPTS, reference)])}[drafter_kind]
    eng = Engine(target, None, EngineConfig(max_batch_size=4), drafter=drafter, spec=spec if drafter else None)
    outs = eng.generate(PROMPTS, SamplingParams(max_new_tokens=120, ignore_eos=True, stop_loop=LIMIT))
    for o, ref in zip(outs, reference):
        assert o.token_ids == ref[: loop_cut(ref, LIMIT)] and o.finish_reason == "loop"


def test_regeneration_stops_answers_in_loops(tmp_path):
    """RegenConfig.stop_loop (--regen-stop-loop): each regenerated answer is the plain one up to its loop cut (fewer
    new tokens), cached apart from the answers without it."""
    from test_train_cli import char_tokenizer

    from eaglespec.train.regenerate import RegenConfig, regenerate

    target, tok = tiny_llama(seed=0, vocab=80, eos_token_id=2, std=0.1), char_tokenizer()
    convs = [[{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": "old"}]
             for w in ("ab", "hello there", "x", "loop loop", "a b c")]
    full = regenerate(target, tok, convs, tmp_path, RegenConfig(max_new_tokens=100, max_len=256), progress=False)
    cut = regenerate(target, tok, convs, tmp_path, RegenConfig(max_new_tokens=100, max_len=256, stop_loop=LIMIT),
                     progress=False)
    assert len(list(tmp_path.glob("regen-*"))) == 2 and 0 < cut.new_tokens < full.new_tokens
    eng = Engine(target, tok, EngineConfig(max_batch_size=4))
    shorter = 0
    for c, f, conv in zip(cut.conversations, full.conversations, convs):
        ids = eng.generate([conv[:1]], SamplingParams(max_new_tokens=100))[0].token_ids
        want = eng.generate([conv[:1]], SamplingParams(max_new_tokens=100, stop_loop=LIMIT))[0]
        assert want.token_ids == ids[: loop_cut(ids, LIMIT)]
        assert c[1]["content"] == want.text.strip() and f[1]["content"].startswith(c[1]["content"])
        shorter += len(c[1]["content"]) < len(f[1]["content"])
    assert shorter >= 3
