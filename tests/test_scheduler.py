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


def test_drop_waiting_takes_out_only_a_waiting_request():
    """An aborted request that waits leaves the queue (the others keep their order); a running one is not there."""
    s = Scheduler(1)
    reqs = [_req(i) for i in range(4)]
    for r in reqs:
        s.add(r)
    s.schedule()  # request 0 runs, 1-3 wait
    assert s.drop_waiting(reqs[2]) and list(s.waiting) == [reqs[1], reqs[3]]
    assert not s.drop_waiting(reqs[2]) and not s.drop_waiting(reqs[0]) and s.running == [reqs[0]]


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
    for rows, k, ahead in ((3, 1, 0), (3, 2, 0), (4, 3, 0), (8, 8, 0), (3, 1, 2), (2, 1, 4), (4, 2, 1)):
        eng = Engine(target, None, EngineConfig(max_batch_size=rows, min_prefill_rows=k, prefill_ahead=ahead))
        assert [o.token_ids for o in eng.generate(prompts, params)] == ref, (rows, k, ahead)
        assert (eng.step_counts["join"] > 0) == (ahead > 0), (rows, k, ahead)  # the eager path joins too


def test_prefill_ahead_parks_requests_and_joins_them_into_freed_rows():
    """`ahead` spare rows: an admission while rows run also prefills that many more waiting requests into spare rows
    (listed after the admitted ones); a freed row goes to the oldest of them (`join`), before anything waiting is
    admitted; a parked request that ends on its prefill's token frees its spare row."""
    s = Scheduler(2, ahead=2)
    for i in range(7):
        s.add(_req(i))
    b = s.schedule()  # nothing runs yet: nothing to spare the running rows from, no parking
    assert [r.rid for r in b.requests] == [0, 1] and b.rows == [0, 1] and not s.parked
    _finish(s, 1)
    b = s.schedule()
    assert b.kind == "prefill" and [r.rid for r in b.requests] == [2, 3, 4] and b.rows == [0, 2, 3]
    assert [r.rid for r in s.running] == [1, 2] and [r.rid for r in s.parked] == [3, 4] and s.spare == []
    assert not s.may_admit() and s.schedule().kind == "decode"  # no free row, and parked requests come first
    assert s.join() == []  # no free row to join
    _finish(s, 1)  # request 1 leaves row 1
    assert not s.may_admit()  # row 1 is for a parked request, not for a prefill
    moves = s.join()
    assert [(q.rid, src, q.slot) for q, src in moves] == [(3, 2, 1)] and s.spare == [2]
    assert [r.rid for r in s.running] == [2, 3] and [r.rid for r in s.parked] == [4]
    s.parked[0].finish_reason = "stop"  # ended on its first token, while parked
    assert [r.rid for r in s.release_finished()] == [4] and s.spare == [2, 3] and not s.parked
    _finish(s, 2)
    b = s.schedule()  # both rows free, nothing parked: a prefill again, parking two more
    assert [r.rid for r in b.requests] == [5, 6] and b.rows == [0, 1] and not s.parked  # nothing ran: no parking
    assert s.has_work()


def test_parked_requests_count_as_work():
    s = Scheduler(2, ahead=1)
    for i in range(4):
        s.add(_req(i))
    s.schedule()
    _finish(s, 1)
    assert [r.rid for r in s.schedule().requests] == [2, 3] and [r.rid for r in s.parked] == [3]
    _finish(s, 2)
    assert not s.running and not s.waiting and s.has_work()  # only a parked request left
    assert s.schedule() is None  # nothing to prefill or decode until it joins
    assert [(q.rid, src, q.slot) for q, src in s.join()] == [(3, 2, 0)]
    assert s.schedule().kind == "decode"


def test_prefill_ahead_never_makes_a_prefill_larger_than_the_cap():
    """The engine caps prefills with requests prefilled ahead at the most rows its prefill graphs take (past them a
    prefill runs eagerly): rows freed at once are admitted in full, the parked ones only up to the cap."""
    s = Scheduler(4, ahead=4, ahead_cap=5)
    for i in range(12):
        s.add(_req(i))
    s.schedule()
    _finish(s, 3)
    b = s.schedule()
    assert [r.rid for r in b.requests] == [4, 5, 6, 7, 8] and [r.rid for r in s.parked] == [7, 8]
    s2 = Scheduler(4, ahead=4, ahead_cap=2)
    for i in range(12):
        s2.add(_req(i))
    s2.schedule()
    _finish(s2, 3)
    assert [r.rid for r in s2.schedule().requests] == [4, 5, 6] and not s2.parked  # the free rows always fill


def test_prefill_ahead_is_validated():
    with pytest.raises(ConfigError, match="prefill_ahead must be >= 0"):
        EngineConfig(prefill_ahead=-1)


def test_compaction_moves_the_rows_past_the_running_counts_bucket_into_holes():
    """`Scheduler.compaction(bucket)`: with 3 of 8 rows running in rows 1, 5 and 6, steps cover rows 0..7 (bucket 8)
    where 3 requests need 4: rows 5 and 6 move into the free rows 0 and 2; nothing moves while requests wait or when
    the highest row is already within the count's bucket."""
    def bucket(n: int) -> int:
        return next(b for b in (1, 2, 4, 8) if b >= n)

    s = Scheduler(8)
    for i in range(8):
        s.add(_req(i))
    s.schedule()
    for r in s.running:
        if r.slot not in (1, 5, 6):
            r.finish_reason = "length"
    s.release_finished()
    assert sorted(q.slot for q in s.running) == [1, 5, 6]
    moves = s.compaction(bucket)
    assert moves == [(5, 0), (6, 2)]
    for src, dst in moves:
        s.move(next(q for q in s.running if q.slot == src), dst)
    assert sorted(q.slot for q in s.running) == [0, 1, 2] and s.compaction(bucket) == []
    s.add(_req(9))
    s.running[0].slot, s.free = 7, [r for r in range(8) if r not in (1, 2, 7)]  # a hole below, but one waits
    assert s.compaction(bucket) == []


def test_reusable_positions_stop_one_short_of_the_shared_prefix_and_the_prompt():
    """A kept row's entries serve positions below the shared prefix less one (the drafter's pair at p needs the token
    at p + 1), never the prompt's last token (its logits choose the first token); nothing without a shared start."""
    from eaglespec.engine.scheduler import common_prefix, reusable

    kept = (1, 2, 3, 4, 5, 6)
    assert common_prefix(kept, [1, 2, 3, 9]) == 3 and common_prefix(kept, list(kept) + [7]) == 6
    assert common_prefix((), [1]) == 0 and common_prefix(kept, [2]) == 0
    long = tuple(range(3000))
    assert common_prefix(long, list(range(1234)) + [-1]) == 1234
    assert reusable(kept, [1, 2, 3, 9, 9]) == 2  # 3 shared
    assert reusable(kept, list(kept) + [7, 8]) == 5  # all kept tokens shared: the last one's pair is unknown
    assert reusable(kept, [1, 2, 3]) == 2 and reusable(kept, [1, 2]) == 1  # the prompt's last token is computed
    assert reusable(kept, [1]) == 0 and reusable(kept, [9, 2, 3]) == 0 and reusable((), [1, 2]) == 0


def test_admission_takes_the_kept_row_sharing_the_longest_prefix():
    """A waiting request takes the free row whose kept tokens share most with its prompt (else the lowest free row),
    the prefill budget counts only what it computes, and a row's kept tokens go once any request takes it;
    prompts with images never reuse."""
    s = Scheduler(4, prefill_token_budget=30)
    s.keep(1, list(range(1, 11)))  # rows 1 and 2 hold finished requests' entries
    s.keep(2, list(range(1, 21)))
    s.keep(3, list(range(1, 10)))
    s.keep(9, [1, 2, 3])  # not a free row: ignored
    assert set(s.kept) == {1, 2, 3}
    a = Request(rid=0, prompt_ids=list(range(1, 31)), params=SamplingParams(), eos_ids=())  # 20 shared with row 2
    b = Request(rid=1, prompt_ids=list(range(1, 8)) + [50], params=SamplingParams(), eos_ids=())  # 7 with row 1
    c = Request(rid=2, prompt_ids=[60, 61], params=SamplingParams(), eos_ids=())
    d = Request(rid=3, prompt_ids=list(range(1, 10)), params=SamplingParams(), eos_ids=(), mm_inputs=object())
    for q in (a, b, d, c):
        s.add(q)
    batch = s.schedule()
    # a (30 - 19 = 11 to compute) and b (8 - 6 = 2) reuse; d (images) takes the lowest free row, not row 3 that holds
    # its tokens; c the next; the budget, 30 - 11 - 2 - 9 = 8, still lets c in
    assert [(q.rid, q.slot, q.reused) for q in batch.requests] == [(0, 2, 19), (1, 1, 6), (3, 0, 0), (2, 3, 0)]
    assert s.kept == {}
    _finish(s, 4)
    s.keep(3, list(range(1, 21)))
    s.add(Request(rid=4, prompt_ids=list(range(1, 13)), params=SamplingParams(), eos_ids=()))
    s.add(Request(rid=5, prompt_ids=list(range(1, 13)), params=SamplingParams(), eos_ids=()))
    batch = s.schedule()  # the first takes the kept row; the second (the same prompt) finds none left
    assert [(q.slot, q.reused) for q in batch.requests] == [(3, 11), (0, 0)]
    s.keep(1, [1, 2, 3])
    s.forget()
    assert s.kept == {}


def test_a_prompt_that_shares_nothing_leaves_kept_rows_for_their_next_turns():
    """Without a shared prefix a request takes the lowest free row that keeps nothing; with every free row kept, the
    one kept longest ago (keeping a row again makes it the newest)."""
    s = Scheduler(3)
    s.keep(0, [1, 2, 3])
    s.keep(1, [4, 5, 6])
    s.add(Request(rid=0, prompt_ids=[9, 9, 9], params=SamplingParams(), eos_ids=()))
    assert [(q.slot, q.reused) for q in s.schedule().requests] == [(2, 0)] and set(s.kept) == {0, 1}
    _finish(s, 1)
    s.keep(0, [1, 2, 3, 7])  # row 0 again: now the newest; row 2 keeps nothing
    s.keep(1, [4, 5, 6])  # (row 1 again: the newest)
    s.add(Request(rid=1, prompt_ids=[8, 8], params=SamplingParams(), eos_ids=()))
    assert [q.slot for q in s.schedule().requests] == [2]
    s.add(Request(rid=2, prompt_ids=[8, 7], params=SamplingParams(), eos_ids=()))
    assert [q.slot for q in s.schedule().requests] == [0] and set(s.kept) == {1}  # row 0 was kept longest ago
    s.add(Request(rid=3, prompt_ids=[4, 5, 6, 1], params=SamplingParams(), eos_ids=()))
    assert [(q.slot, q.reused) for q in s.schedule().requests] == [(1, 2)]


def test_a_row_taken_by_a_join_or_a_move_drops_its_kept_tokens():
    s = Scheduler(2, ahead=1)
    s.add(_req(0))
    s.schedule()  # request 0 in row 0
    s.add(_req(1))
    s.add(_req(2))
    assert [(q.rid, q.slot) for q in s.schedule().requests] == [(1, 1), (2, 2)]  # request 2 parked in spare row 2
    _finish(s, 1)  # request 0 leaves row 0, which keeps its tokens
    s.keep(0, [1, 2, 3, 4])
    s.keep(2, [1, 2])  # a spare row: never kept
    assert set(s.kept) == {0}
    moves = s.join()  # the parked request takes row 0 by a copy: its kept tokens are gone
    assert [(q.rid, src, q.slot) for q, src in moves] == [(2, 2, 0)] and s.kept == {}
    s2 = Scheduler(3)
    s2.add(_req(0))
    s2.schedule()
    s2.keep(1, [1, 2])
    s2.move(s2.running[0], 1)  # a compaction's move into the kept free row
    assert s2.kept == {} and s2.running[0].slot == 1
