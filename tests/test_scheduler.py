"""The batching policy (engine/scheduler.py) in plain Python, and batched admission through the whole engine."""

from __future__ import annotations

import pytest
from tiny import tiny_llama

from eaglespec.config import EngineConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.request import Request
from eaglespec.engine.scheduler import Scheduler
from eaglespec.errors import ConfigError
from eaglespec.sampling_params import SamplingParams


def _req(i: int, n: int = 4) -> Request:
    return Request(rid=i, prompt_ids=list(range(1, n + 1)), params=SamplingParams(max_new_tokens=8), eos_ids=())


def _finish(s: Scheduler, k: int) -> list[Request]:
    for r in s.running[:k]:
        r.finish_reason = "length"
    return s.release_finished()


def test_immediate_admission_by_default():
    s = Scheduler(4)
    for i in range(6):
        s.add(_req(i))
    b = s.schedule()
    assert b.kind == "prefill" and [r.rid for r in b.requests] == [0, 1, 2, 3] and b.rows == [0, 1, 2, 3]
    assert s.schedule().kind == "decode"
    _finish(s, 1)
    b = s.schedule()  # one free row: the next waiting request is admitted at once
    assert b.kind == "prefill" and [r.rid for r in b.requests] == [4] and b.rows == [0]


def test_batched_admission_waits_for_enough_free_rows():
    s = Scheduler(8, min_prefill_rows=3)
    for i in range(12):
        s.add(_req(i))
    assert [r.rid for r in s.schedule().requests] == list(range(8))  # nothing runs: admit at once
    _finish(s, 2)
    assert s.schedule().kind == "decode"  # 2 free rows < 3: keep decoding
    _finish(s, 1)
    b = s.schedule()
    assert b.kind == "prefill" and [r.rid for r in b.requests] == [8, 9, 10]
    _finish(s, 1)  # 1 free row, 1 waiting request: everything that waits fits, admit it
    b = s.schedule()
    assert b.kind == "prefill" and [r.rid for r in b.requests] == [11]


def test_batched_admission_never_starves():
    s = Scheduler(4, min_prefill_rows=4)
    for i in range(6):
        s.add(_req(i))
    s.schedule()
    for r in list(s.running):
        r.finish_reason = "length"
    s.release_finished()
    b = s.schedule()  # nothing runs: whatever is free is used, however few rows that is
    assert b.kind == "prefill" and [r.rid for r in b.requests] == [4, 5]
    assert Scheduler(2, min_prefill_rows=99).min_prefill_rows == 2  # capped by the rows there are


def test_prefill_token_budget_still_applies():
    s = Scheduler(8, prefill_token_budget=10, min_prefill_rows=2)
    for i in range(4):
        s.add(_req(i, n=4))
    assert [r.rid for r in s.schedule().requests] == [0, 1]  # 4 + 4 fit in 10 tokens, a third would not


def test_min_prefill_rows_is_validated():
    with pytest.raises(ConfigError, match="min_prefill_rows must be >= 1"):
        EngineConfig(min_prefill_rows=0)


def test_engine_outputs_do_not_depend_on_admission():
    """More prompts than rows, with lengths that make rows free at different steps: same greedy outputs."""
    target = tiny_llama(seed=0)
    prompts = [list(range(1 + i, 6 + 2 * i)) for i in range(9)]
    params = [SamplingParams(max_new_tokens=4 + 3 * (i % 4), ignore_eos=True) for i in range(9)]
    ref = [o.token_ids for o in Engine(target, None).generate(prompts, params)]  # default rows (8), admit at once
    for rows, k in ((3, 1), (3, 2), (4, 3), (8, 8)):
        eng = Engine(target, None, EngineConfig(max_batch_size=rows, min_prefill_rows=k))
        assert [o.token_ids for o in eng.generate(prompts, params)] == ref, (rows, k)
