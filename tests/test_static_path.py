"""The GPU fast path's bookkeeping on the CPU: the bucketed, all-rows steps (the code CUDA graphs capture) run eagerly
with `GraphCache(capture=False)` and must give exactly the outputs of the plain eager path."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_drafter, tiny_llama

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.cuda_graphs import GraphCache
from eaglespec.engine.engine import Engine
from eaglespec.engine.row_sampling import StepExtras
from eaglespec.errors import RequestError
from eaglespec.sampling_params import SamplingParams
from eaglespec.spec.oracle import OracleDrafter

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40)), [5], [9, 9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6]]


def static_engine(target, drafter=None, spec=None, rows=8, overlap=False, spec_max_rows=None, **kw):
    eng = Engine(target, None, EngineConfig(max_batch_size=rows, overlap=overlap, spec_max_rows=spec_max_rows, **kw),
                 drafter=drafter, spec=spec)
    eng.runner.graphs = GraphCache(eng.runner, capture=False)
    return eng


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def reference(target):
    return [o.token_ids for o in Engine(target, None).generate(PROMPTS, SamplingParams(max_new_tokens=40,
                                                                                           ignore_eos=True))]


def test_buckets():
    class R:
        rows, step_rows, cache_len = 24, 20, 3000  # 4 spare rows (requests prefilled ahead): no step covers them
        step_extras = StepExtras()

        @staticmethod
        def headroom() -> int:
            return 8

    g = GraphCache(R(), capture=False)
    assert [g.batch_bucket(n) for n in (1, 2, 3, 5, 9, 13, 17, 20)] == [1, 2, 4, 8, 12, 16, 20, 20]
    assert [g.len_bucket(n) for n in (1, 256, 257, 1000, 2048, 2049, 5000)] == [256, 256, 512, 1024, 2048, 3000, 3000]
    # a step's graph: the batch bucket of its rows, the length bucket of its longest row plus the step's headroom
    assert g.key("decode", 3, 248, True) == ("decode", 4, 256, True, None, StepExtras())
    assert g.key("spec", 9, 249, False) == ("spec", 12, 512, False, None, StepExtras())
    assert g.key("spec", 9, 249, False, lp=5) == ("spec", 12, 512, False, 5, StepExtras())  # 5 alternatives per token


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_warm_up_rounds_stay_inside_a_cache_sized_to_its_requests(target, reference, temperature):
    """The capture protocol's warm-up (run by the static path too, on each key's first use) restores the row state
    after every round, so a round writes only where the step itself will. With rounds chained on the advanced state,
    a drafter that is always right (the oracle: every draft accepted) wrote 2 x D past the lengths, past the end of a
    cache sized to 3 + 3 tokens plus headroom: an IndexError here, a device-side assert on CUDA (session 22). The
    draws are restored too: a sampled static run draws what the eager one does."""
    rows, n = 8, 3
    oracle = OracleDrafter(target.config, [PROMPTS[1] + reference[1]] * rows)
    spec = SpecConfig(3, 1, 4)
    params = SamplingParams(max_new_tokens=n, ignore_eos=True, temperature=temperature)
    outs = static_engine(target, oracle, spec, rows=rows).generate([PROMPTS[1]] * rows, params)
    eager = Engine(target, None, EngineConfig(max_batch_size=rows), drafter=oracle, spec=spec)
    assert [o.token_ids for o in outs] == [o.token_ids for o in eager.generate([PROMPTS[1]] * rows, params)]
    assert all(len(o.token_ids) == n for o in outs)
    if temperature == 0.0:
        assert all(o.token_ids == reference[1][:n] for o in outs) and outs[0].stats.hist[-1] == 1  # all 4 accepted


def test_host_copies_land_in_contiguous_views():
    """The pinned buffers of step results are sized for the widest shape; a step's results land in a contiguous
    view of their first elements (a strided destination made CUDA's copy synchronous: the overlap was lost)."""
    from eaglespec.engine.pending_step import contiguous_prefix

    buf = torch.full((8, 4), -1, dtype=torch.int64)
    v = contiguous_prefix(buf, torch.Size((3, 2)))
    assert v.is_contiguous() and v.shape == (3, 2) and v.data_ptr() == buf.data_ptr()
    v.copy_(torch.arange(6).view(3, 2))
    assert buf.view(-1)[:6].tolist() == list(range(6)) and int(buf.view(-1)[6]) == -1
    assert contiguous_prefix(torch.zeros(8, dtype=torch.int64), (5,)).shape == (5,)  # decode: [B] of [rows]


def test_static_decode_equals_eager(target, reference):
    eng = static_engine(target)
    outs = eng.generate(PROMPTS, SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert [o.token_ids for o in outs] == reference


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)], ids=["chain", "tree"])
def test_static_spec_equals_plain_with_rows_finishing_and_joining(target, reference, spec):
    """Fewer rows than requests: rows finish at different times (inert rows inside a bucket) and are reused."""
    eng = static_engine(target, tiny_drafter(target, seed=1), spec, rows=4)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (40, 13, 40, 7, 40, 22)]
    reqs = [eng.add_request(p, q) for p, q in zip(PROMPTS, params)]
    while eng.has_work():
        eng.step()
    assert [r.output_ids for r in reqs] == [ref[: q.max_new_tokens] for ref, q in zip(reference, params)]
    # finished rows were released: inert (inactive, length 0)
    assert not eng.runner.active.any() and int(eng.runner.seq_len.abs().sum()) == 0


@pytest.mark.parametrize("spec,spec_max_rows", [(None, None), (SpecConfig(3, 1, 4), None), (SpecConfig(5, 4, 8), None),
                                                (SpecConfig(3, 1, 4), 2), (SpecConfig(5, 4, 8), 1)],
                         ids=["plain", "chain", "tree", "chain-by-load", "tree-by-load"])
def test_overlapped_steps_equal_plain(target, reference, spec, spec_max_rows):
    """EngineConfig.overlap: step n+1 (decode or speculative) is launched before step n's results are read. Fewer
    rows than requests (rows finish, are released and taken by new requests), different budgets, and an EOS that
    stops some requests early (what the next step computed for them is dropped): the outputs are the plain greedy
    ones, and launches really ran ahead. "by-load": speculative and plain steps alternate (`spec_max_rows`)."""
    eos = reference[2][9]
    # one request ends on its prefill's token: the step launched before that token was read computes it for nothing
    params = [SamplingParams(max_new_tokens=n) for n in (40, 13, 40, 1, 40, 22)]

    def run(eng):
        eng.eos_ids = (eos,)
        reqs = [eng.add_request(p, q) for p, q in zip(PROMPTS, params)]
        while eng.has_work():
            eng.step()
        return [(r.output_ids, r.finish_reason) for r in reqs]

    plain = run(Engine(target, None, EngineConfig(max_batch_size=3)))
    assert any(reason == "stop" for _, reason in plain) and any(reason == "length" for _, reason in plain)
    drafter = tiny_drafter(target, seed=1) if spec else None
    eng = static_engine(target, drafter, spec, rows=3, overlap=True, spec_max_rows=spec_max_rows)
    assert eng.overlapping
    events: list[str] = []
    r = eng.runner
    launch, collect, prefill, read_prefill = r.launch, r.collect, r.launch_prefill, r.collect_prefill
    r.launch = lambda *a: events.append("launch") or events.append(a[0]) or launch(*a)
    r.collect = lambda *a: events.append("collect") or collect(*a)
    r.launch_prefill = lambda *a: events.append("prefill") or prefill(*a)
    r.collect_prefill = lambda *a: events.append("read_prefill") or read_prefill(*a)
    calls: list[str] = []
    step = eng.step

    def traced_step():
        n = len(events)
        out = step()
        calls.append(",".join(e for e in events[n:] if e in ("launch", "collect", "prefill", "read_prefill")))
        return out

    eng.step = traced_step
    assert run(eng) == plain
    if spec_max_rows is not None:
        assert "spec" in events and "decode" in events
    assert "launch,collect" in calls  # a step was launched while the previous one was unread
    # a prefill launches the next step of every running row before its first tokens are read (the device does not
    # wait for the host after an admission), and admissions (6 requests, 3 rows) came while others ran
    prefills = [c for c in calls if "prefill" in c]
    assert len(prefills) >= 2 and all(c == "prefill,launch,read_prefill" for c in prefills)
    events = [e for e in events if e in ("launch", "collect")]
    assert events.count("launch") == events.count("collect")
    assert not eng.runner.active.any() and int(eng.runner.seq_len.abs().sum()) == 0  # every row released, inert
    assert not Engine(target, None, EngineConfig(overlap=True)).overlapping  # needs the graph path (CPU: none)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlapped"])
@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)], ids=["plain", "chain", "tree"])
def test_requests_prefilled_ahead_join_and_equal_plain(target, reference, spec, overlap):
    """EngineConfig.prefill_ahead: admissions also prefill waiting requests into spare rows, which take freed rows
    later by a copy of their caches and row state (no prefill of their own). Rows finish at different steps, one
    request ends on its prefill's token while parked, another by EOS: the outputs are the plain greedy ones, with
    fewer prefills than requests admitted while others ran, and every row (spare ones included) inert at the end."""
    prompts = PROMPTS * 2
    eos = reference[2][9]
    params = [SamplingParams(max_new_tokens=n) for n in (30, 12, 25, 7, 40, 1, 19, 9, 3, 22, 1, 14)]

    def run(eng):
        eng.eos_ids = (eos,)
        return [(o.token_ids, o.finish_reason) for o in eng.generate(prompts, params)]

    plain = run(Engine(target, None, EngineConfig(max_batch_size=3)))
    assert any(reason == "stop" and len(toks) > 1 for toks, reason in plain)
    drafter = tiny_drafter(target, seed=1) if spec else None
    eng = Engine(target, None, EngineConfig(max_batch_size=3, overlap=overlap, prefill_ahead=2), drafter=drafter,
                 spec=spec)
    eng.runner.graphs = GraphCache(eng.runner, capture=False)
    r = eng.runner
    if spec is None:  # a decode step advances the host lengths when launched: after every step (the CPU computes at
        # once) they equal the device's lengths, joined rows included (0ab3c47's reads set them one short there)
        step = eng.step

        def checked_step():
            out = step()
            assert all(r.host_len[q.slot] == int(r.seq_len[q.slot]) for q in eng.scheduler.running)
            return out

        eng.step = checked_step
    assert run(eng) == plain
    assert r.rows == 5 and r.step_rows == 3  # two spare rows past the steps' three
    assert eng.step_counts["join"] >= 4 and eng.step_counts["prefill"] <= 4  # 12 requests, 3 rows
    assert not r.active.any() and int(r.seq_len.abs().sum()) == 0 and not any(r.host_len)
    assert len(eng.scheduler.spare) == 2 and not eng.scheduler.parked


def test_a_joined_request_keeps_its_own_sampling_parameters(target, reference):
    """A request prefilled ahead takes a row a sampled request left: its sampling parameters move with it
    (`ModelRunner.move_row`), so greedy requests among sampled ones, each joined into such a row, still give the plain
    greedy tokens. (Plain decoding: its schedule is fixed by the lengths alone; the copy does not depend on the
    step's kind.)"""

    def params(n, temperature):
        return SamplingParams(max_new_tokens=n, ignore_eos=True, temperature=temperature)

    # 2 rows, 2 spare, lengths fixed (EOS ignored), so the schedule is: 0-1, then 2-3, then 4 are admitted into
    # running rows; 5 and 6 are prefilled ahead (greedy) and join the rows that 3 and 4 (sampled) leave
    plist = [params(4, 1.0), params(5, 1.0), params(6, 1.0), params(20, 1.0), params(20, 1.0), params(6, 0.0),
             params(20, 0.0), params(20, 1.0)]
    prompts = [PROMPTS[i % 6] for i in range(8)]
    eng = Engine(target, None, EngineConfig(max_batch_size=2, overlap=True, prefill_ahead=2, seed=3))
    eng.runner.graphs = GraphCache(eng.runner, capture=False)
    outs = eng.generate(prompts, plist)
    assert eng.step_counts["join"] == 2 and eng.step_counts["prefill"] == 4
    for i in (5, 6):
        assert outs[i].token_ids == reference[i % 6][: plist[i].max_new_tokens], i


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlapped"])
@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)], ids=["plain", "chain", "tree"])
def test_compacted_rows_replay_smaller_graphs_and_equal_plain(target, reference, spec, overlap):
    """EngineConfig.compact_rows: once nothing waits, requests in rows past the bucket of their count move into free
    rows below it (cache entries and row state), so the drain's steps take smaller batch buckets. Requests in the
    high rows outlive those in the low ones here: the outputs are still the plain greedy ones, and the steps after
    the moves replay the smallest bucket that holds the running requests."""
    lens = (6, 6, 6, 6, 6, 40, 30, 35)  # 8 rows: the last three rows run longest
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lens]
    prompts = [PROMPTS[i % 6] for i in range(8)]
    drafter = tiny_drafter(target, seed=1) if spec else None
    eng = Engine(target, None, EngineConfig(max_batch_size=8, overlap=overlap, compact_rows=True, prefill_ahead=0),
                 drafter=drafter, spec=spec)
    eng.runner.graphs = GraphCache(eng.runner, capture=False)
    graphs = eng.runner.graphs
    sizes: list[int] = []  # the batch bucket of every step replayed
    run = graphs.run

    def logged(kind, n_rows, *a, **k):
        sizes.append(graphs.batch_bucket(n_rows))
        return run(kind, n_rows, *a, **k)

    graphs.run = logged
    outs = eng.generate(prompts, params)
    assert [o.token_ids for o in outs] == [reference[i % 6][:n] for i, n in enumerate(lens)]
    # rows 5-7 (40, 30, 35 tokens) move into rows 0-2; once the 30-token one ends, row 2 moves into row 1
    assert eng.step_counts["compact"] == 4
    assert sizes[0] == 8 and sizes[-1] == 1 and sorted(set(sizes), reverse=True) == [8, 4, 2, 1]
    assert sizes == sorted(sizes, reverse=True)  # the buckets only shrink
    assert not eng.runner.active.any() and int(eng.runner.seq_len.abs().sum()) == 0


def test_rows_are_not_compacted_while_requests_wait_or_off_the_graph_path(target, reference):
    """No moves while requests wait (they fill the rows anyway) nor without graphs (eager steps run on exactly the
    requested rows); nor when the option is off."""
    lens = (6, 6, 6, 6, 6, 40, 30, 35, 12)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lens]
    prompts = [PROMPTS[i % 6] for i in range(9)]
    for cfg, graphs in ((EngineConfig(max_batch_size=8, compact_rows=True), False),
                        (EngineConfig(max_batch_size=8, compact_rows=False, overlap=True), True)):
        eng = Engine(target, None, cfg)
        if graphs:
            eng.runner.graphs = GraphCache(eng.runner, capture=False)
        outs = eng.generate(prompts, params)
        assert [o.token_ids for o in outs] == [reference[i % 6][:n] for i, n in enumerate(lens)]
        assert eng.step_counts["compact"] == 0


def test_prefill_ahead_by_default_on_overlapped_graph_engines_of_8_rows(target):
    """None: 4 spare rows for an overlapped graph engine of 8 rows or more (measured on the H200), none otherwise."""
    def spare(rows, graphs=True, **kw):
        eng = Engine(target, None, EngineConfig(max_batch_size=rows, **kw))
        if graphs:
            eng.runner.graphs = GraphCache(eng.runner, capture=False)
        eng.reserve(rows, 64)
        return eng.runner.rows - eng.runner.step_rows

    assert [spare(8, overlap=True), spare(32, overlap=True), spare(4, overlap=True)] == [4, 4, 0]
    assert [spare(8, overlap=False), spare(8, graphs=False), spare(8, prefill_ahead=0)] == [0, 0, 0]
    assert spare(2, graphs=False, prefill_ahead=3) == 3  # asked for: any engine


@pytest.mark.parametrize("compact", [False, True], ids=["", "compact"])
@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4), SpecConfig(5, 2, 8)], ids=["plain", "chain", "tree"])
def test_static_steps_read_no_uninitialized_memory(target, spec, compact):
    """With PyTorch's deterministic mode every fresh allocation is filled with NaN (integers with their largest value),
    so a step that read memory it had not written (on CUDA: whatever an earlier graph left in the pool, which differs
    from run to run) would change the tokens. The static, overlapped path, rows finishing, requests prefilled ahead
    joining them, and (compact) the drain's requests moving to lower rows, still gives the plain greedy outputs."""
    prompts = PROMPTS * 2
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (30, 12, 25, 7, 40, 19) * 2]
    plain = [o.token_ids for o in Engine(target, None, EngineConfig(max_batch_size=4)).generate(prompts, params)]
    fill, was = torch.utils.deterministic.fill_uninitialized_memory, torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        eng = static_engine(target, tiny_drafter(target, seed=1) if spec else None, spec, rows=8, overlap=True,
                            compact_rows=compact)
        assert torch.empty(4).isnan().all()  # the fill is on
        assert [o.token_ids for o in eng.generate(prompts, params)] == plain
        assert (eng.step_counts["compact"] > 0) == compact and eng.step_counts["join"] > 0  # 4 spare rows by default
    finally:
        torch.use_deterministic_algorithms(was)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def test_overlapped_decoding_streams_and_samples(target):
    """Streaming through an overlapped engine gives the whole answer (the last launched step is read and dropped
    after the request ends), and sampling (plain and speculative) draws valid tokens, the same for the same seed."""
    eng = static_engine(target, rows=2, overlap=True)
    text_free = [eng.add_request(PROMPTS[0], SamplingParams(max_new_tokens=12, ignore_eos=True))]
    while not text_free[0].finished:
        eng.step()
    assert len(text_free[0].output_ids) == 12 and eng.has_work()  # one launched step still unread
    eng.step()
    assert not eng.has_work()
    for spec in (None, SpecConfig(3, 2, 5)):
        outs = []
        for _ in range(2):
            e = Engine(target, None, EngineConfig(max_batch_size=2, overlap=True, seed=5),
                       drafter=tiny_drafter(target, seed=1) if spec else None, spec=spec)
            e.runner.graphs = GraphCache(e.runner, capture=False)
            sp = SamplingParams(max_new_tokens=10, temperature=0.8, ignore_eos=True)
            outs.append([o.token_ids for o in e.generate(PROMPTS[:2], sp)])
        assert outs[0] == outs[1] and all(len(o) == 10 and all(0 <= t < 97 for t in o) for o in outs[0])


def test_moe_models_opt_out_of_cuda_graphs():
    """A model holding a layer with data-dependent shapes (MoE dispatch) is never captured; Llama is."""
    from test_deepseek_v3 import CASES
    from transformers import DeepseekV3Config

    from eaglespec.config import ModelConfig
    from eaglespec.engine.cuda_graphs import capturable
    from eaglespec.models.deepseek_v3 import DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(**CASES["grouped_yarn"]).to_dict()
    cfg["architectures"] = ["DeepseekV3ForCausalLM"]
    with torch.device("meta"):
        moe_model = DeepseekV3ForCausalLM(ModelConfig.from_hf(cfg))
    target = tiny_llama(seed=0)
    assert capturable(target, tiny_drafter(target))
    assert not capturable(moe_model) and not capturable(target, moe_model)


def test_growing_the_caches_drops_the_graphs_and_takes_a_fresh_pool(target, reference, monkeypatch):
    """A second, longer `generate` reallocates the caches: every graph is dropped and later captures go to a new
    memory pool (PyTorch's allocator asserts when a pool whose graphs were all freed is captured into again). The
    pool handle is faked here (no CUDA); the static steps still give the eager outputs before and after the growth."""
    handles = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool", next(handles)))
    eng = static_engine(target)
    short = eng.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4, ignore_eos=True))
    g = eng.runner.graphs
    g.capture, g.pool = True, torch.cuda.graph_pool_handle()  # as a capturing cache holding one graph
    g.graphs[("decode", 8, 256, True)] = []
    first_pool = g.pool
    eng._ensure_capacity(eng.runner.rows, eng.runner.max_len)  # fits: nothing changes
    assert g.pool == first_pool and g.graphs
    eng._ensure_capacity(eng.runner.rows, eng.runner.max_len + 100)  # what a longer generate does first
    assert g.pool != first_pool and not g.graphs
    g.capture = False  # the static steps run eagerly on the CPU
    long = eng.generate(PROMPTS, SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert [o.token_ids for o in short] == [r[:4] for r in reference[:2]]
    assert [o.token_ids for o in long] == reference


def test_prefill_buckets():
    class R:
        cache_len = 1000

    g = GraphCache(R(), capture=False)
    assert [g.prefill_bucket(n) for n in (1, 64, 65, 300, 512, 513)] == [64, 64, 128, 512, 512, None]  # cache 1000
    R.cache_len = 5000
    assert g.prefill_bucket(2048) == 2048 and g.prefill_bucket(2049) is None  # long prompts prefill eagerly
    # several prompts: one graph per (rows <= 8, bucket) while rows x bucket <= PREFILL_GRAPH_TOKENS (8192)
    assert g.prefill_bucket(100, 8) == 128 and g.prefill_bucket(1000, 8) == 1024
    assert g.prefill_bucket(1025, 8) is None and g.prefill_bucket(1025, 4) == 2048
    assert g.prefill_bucket(100, 9) is None  # more rows than PREFILL_GRAPH_ROWS (8): eager
    g.prefill_graphs = False
    assert g.prefill_bucket(10) is None and g.prefill_bucket(10, 4) is None


@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)], ids=["plain", "chain", "tree"])
def test_prefill_graph_path_equals_eager(target, reference, spec):
    """Prefills through the bucketed static path (the prompts padded to 64 tokens, written into whichever rows are
    free, target and drafter catch-up together), one row and several rows of different lengths: same outputs."""
    drafter = tiny_drafter(target, seed=1) if spec is not None else None
    eng = static_engine(target, drafter, spec, rows=2)
    eng.reserve(2, 200)  # room for the 64-token bucket
    calls = []
    core = eng.runner._prefill_core
    eng.runner._prefill_core = lambda *a: calls.append(tuple(a[0].tolist())) or core(*a)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (40, 13, 40, 7, 40, 22)]
    reqs = [eng.add_request(p, q) for p, q in zip(PROMPTS, params)]
    while eng.has_work():
        eng.step()
    assert [r.output_ids for r in reqs] == [ref[: q.max_new_tokens] for ref, q in zip(reference, params)]
    # prefills ran through the graph path: the first two prompts together, later ones one by one, in both rows
    assert calls[0] == (0, 1) and len(calls) >= 3 and {r for c in calls[1:] for r in c} == {0, 1}
    one = eng.generate([PROMPTS[2]], SamplingParams(max_new_tokens=40, ignore_eos=True))[0]
    assert one.token_ids == reference[2]
    calls.clear()
    two = eng.generate(PROMPTS[3:5], SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert [o.token_ids for o in two] == reference[3:5] and calls == [(0, 1)]


def test_prefill_plan_splits_up_to_32_rows_into_graph_groups():
    class R:
        cache_len = 5000

    g = GraphCache(R(), capture=False)
    assert g.prefill_plan([100] * 8) == [list(range(8))]  # one graph takes it
    lens = [300, 20, 70, 100, 5, 64, 2000, 90, 30, 40, 50]  # 11 rows: no single graph; by length, 8 then 3
    plan = g.prefill_plan(lens)
    assert plan == [[4, 1, 8, 9, 10, 5, 2, 7], [3, 0, 6]] and all(g.prefill_bucket(max(lens[i] for i in grp), len(grp))
                                                                  for grp in plan)
    assert g.prefill_plan([2000] * 12) is None  # 8 rows of 2048 exceed PREFILL_GRAPH_TOKENS: eager
    assert g.prefill_plan([10] * 33) is None  # more than PREFILL_SPLIT_ROWS rows: eager


@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4)], ids=["plain", "chain"])
def test_prefill_of_many_rows_in_graph_groups_equals_eager(target, spec):
    """A 20-row admission runs as graph groups of <= 8 rows sorted by length (target and drafter catch-up each);
    every row's tokens equal the plain engine's, in the order of the prompts."""
    prompts = [list(range(1 + i % 3, 2 + i % 3 + (7 * i) % 23)) for i in range(20)]  # 1-23 tokens
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    ref = [o.token_ids for o in Engine(target, None, EngineConfig(max_batch_size=20)).generate(prompts, params)]
    drafter = tiny_drafter(target, seed=1) if spec is not None else None
    eng = static_engine(target, drafter, spec, rows=20)
    eng.reserve(20, 200)
    calls = []
    core = eng.runner._prefill_core
    eng.runner._prefill_core = lambda *a: calls.append(len(a[0])) or core(*a)
    assert [o.token_ids for o in eng.generate(prompts, params)] == ref
    assert calls == [8, 8, 4]


def test_single_prompt_prefill_graph_path_samples_like_eager(target):
    """Sampling (temperature, top-k) through the prefill graph path draws exactly what the eager path draws."""
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_k=20, ignore_eos=True)
    eager = Engine(target, None, EngineConfig(max_batch_size=1, seed=3))
    eager.reserve(1, 200)
    # without overlap: an overlapped engine also runs (and drops) one step past each answer's end, which draws
    # random numbers too, so the next prompt's draws would differ from the eager engine's (same distribution)
    static = Engine(target, None, EngineConfig(max_batch_size=1, seed=3, overlap=False))
    static.runner.graphs = GraphCache(static.runner, capture=False)
    static.reserve(1, 200)
    for p in PROMPTS[:3]:
        assert static.generate([p], params)[0].token_ids == eager.generate([p], params)[0].token_ids
    assert static.runner.graphs._prefill_in  # the graph path's buffers exist: it ran


def test_precapture_prefill_takes_every_bucket_that_fits(target):
    eng = static_engine(target, rows=2)
    eng.reserve(2, 600)  # cache length ~600: buckets 64..512
    g = eng.runner.graphs
    captured = []
    g._capture = lambda key: captured.append(key) or g.graphs.__setitem__(key, [])
    assert g.precapture_prefill(True) == 4
    assert [k[2] for k in captured] == [64, 128, 256, 512] and all(k[:2] == ("prefill", 1) for k in captured)
    ids, lens, rows = g._prefill_in[captured[0]]
    assert ids.shape == (1, 64) and int(lens) == 1 and int(rows) == 0  # a one-token prompt in row 0 (idle engine)
    assert g.precapture_prefill(True) == 0  # already captured
    assert g.precapture_prefill(True, rows=8) == 4  # 2 prompts (the engine's rows bound the 8 asked): 64..512 again
    two = captured[4:]
    assert [k[:3] for k in two] == [("prefill", 2, b) for b in (64, 128, 256, 512)]
    ids, lens, rows = g._prefill_in[two[0]]
    assert ids.shape == (2, 64) and lens.tolist() == [1, 1] and rows.tolist() == [0, 1]


def test_warmup_captures_the_prefill_graphs_a_batch_admits(target):
    """`Engine.warmup(batch_sizes)` captures the prefill graphs of up to max(batch_sizes) prompts (PREFILL_GRAPH_ROWS
    at most, within the rows x bucket token bound), so that a batch's admissions replay graphs that exist: session
    53 saw 1-4 captures of ~60 ms inside each timed 80-prompt run on an H100 when only one-prompt graphs were."""
    eng = static_engine(target, rows=4)
    eng.reserve(4, 300)
    g = eng.runner.graphs
    g.capture = True
    captured: list = []
    g._capture = lambda key: captured.append(key) or g.graphs.__setitem__(key, [])
    eng.warmup(range(1, 5))
    prefill_keys = {k[1:3] for k in captured if k[0] == "prefill"}
    assert prefill_keys == {(b, t) for b in range(1, 5) for t in (64, 128, 256)}
    g.capture = False  # now run requests through the static path, noting the (prompts, bucket) of each prefill
    taken: list = []
    real = g.prefill

    def prefill(rows, prompts, greedy, lp=None):
        taken.append((len(rows), g.prefill_bucket(max(len(p) for p in prompts), len(rows))))
        return real(rows, prompts, greedy, lp)

    g.prefill = prefill
    eng.generate(PROMPTS[:4], SamplingParams(max_new_tokens=4))
    eng.generate(PROMPTS[2:5], SamplingParams(max_new_tokens=4))
    assert taken == [(4, 64), (3, 64)] and set(taken) <= prefill_keys  # each admission replays a captured graph


class _HostBoundOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the operators a CUDA graph cannot hold: reads of a device value on the host (`.item()`, `bool(t)`),
    data-dependent output shapes, and (through `Tensor.__setitem__`) a Python scalar assigned at tensor indices
    (`t[idx] = True`: on CUDA it copied a host scalar during capture and failed on the H200, 2026-11-29;
    `index_fill_` passes the scalar as a kernel argument)."""

    FORBIDDEN = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
                 "aten.unique_consecutive.default", "aten._unique2.default"}

    def __init__(self) -> None:
        super().__init__()
        self.bad: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in self.FORBIDDEN:
            self.bad.append(str(func))
        return func(*args, **(kwargs or {}))

    def setitem(self, setitem):
        def checked(t, index, value):
            parts = index if isinstance(index, tuple) else (index,)
            if isinstance(value, (bool, int, float)) and any(isinstance(i, torch.Tensor) for i in parts):
                self.bad.append(f"t[tensor index] = {value!r}")
            return setitem(t, index, value)
        return checked


@pytest.mark.parametrize("spec,temperature", [(None, 0.0), (SpecConfig(3, 1, 4), 0.0), (SpecConfig(5, 4, 8), 0.0),
                                              (SpecConfig(3, 1, 4), 0.8), (SpecConfig(5, 4, 8), 0.8)],
                         ids=["plain", "chain", "tree", "chain-sampled", "tree-sampled"])
def test_captured_phases_hold_no_host_bound_operator(target, spec, temperature, monkeypatch):
    """Every phase the CUDA graphs capture (prefill of one or several prompts, decode, draft, verify, commit) runs
    without an operator that needs the host mid-step, so capture cannot fail on the GPU for a reason the CPU tests
    miss."""
    eng = static_engine(target, tiny_drafter(target, seed=1) if spec else None, spec, rows=2)
    eng.reserve(2, 200)
    seen: set[str] = set()
    mode = _HostBoundOps()
    phases = GraphCache._phases
    setitem = torch.Tensor.__setitem__

    prefill_rows: set[int] = set()

    def watched(self, *key):
        if key[0] == "prefill":
            prefill_rows.add(key[1])

        def wrap(name, fn):
            def run():
                seen.add(name)
                with monkeypatch.context() as m, mode:
                    m.setattr(torch.Tensor, "__setitem__", mode.setitem(setitem))
                    return fn()
            return run
        return [(name, wrap(name, fn)) for name, fn in phases(self, *key)]

    monkeypatch.setattr(GraphCache, "_phases", watched)
    eng.generate(PROMPTS[:3], SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=temperature))
    assert seen == ({"prefill", "decode"} if spec is None else {"prefill", "draft", "verify", "commit"})
    assert prefill_rows == {1, 2}  # the first two prompts together, the third alone
    assert mode.bad == []


def test_no_gc_restores_the_collector_also_on_errors():
    import gc

    from eaglespec.engine.cuda_graphs import no_gc
    assert gc.isenabled()
    with no_gc():
        assert not gc.isenabled()
    with pytest.raises(RuntimeError), no_gc():
        raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with no_gc():
            pass
        assert not gc.isenabled()  # a caller's own "off" is kept
    finally:
        gc.enable()


def test_graphs_are_recorded_with_the_garbage_collector_off(target, monkeypatch):
    """A collection during a capture can free an earlier engine's CUDA graph while the stream is capturing, which
    invalidates the capture (H200, engines built one after another): `_capture` records every phase with the
    automatic collector off. CUDA's primitives are faked here; the phases themselves run on the CPU."""
    import contextlib
    import gc

    class FakeGraph:
        def replay(self):
            pass

    recorded: list[bool] = []

    @contextlib.contextmanager
    def fake_graph(g, pool=None):
        recorded.append(gc.isenabled())
        yield

    fake_stream = type("S", (), {"wait_stream": lambda self, other: None})
    for name, value in {"CUDAGraph": FakeGraph, "graph": fake_graph, "Stream": lambda device=None: fake_stream(),
                        "current_stream": lambda device=None: fake_stream(),
                        "stream": lambda s: contextlib.nullcontext(),
                        "get_rng_state": lambda device=None: torch.get_rng_state(),
                        "set_rng_state": lambda state, device=None: None,
                        "graph_pool_handle": lambda: "pool"}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    eng = static_engine(target, tiny_drafter(target, seed=1), SpecConfig(3, 1, 4), rows=2)
    eng.reserve(2, 200)
    g = eng.runner.graphs
    g.capture, g.pool = True, "pool"
    g._capture(("spec", 2, min(256, eng.runner.cache_len), True, None, StepExtras()))
    assert recorded == [False, False, False]  # draft, verify, commit
    assert gc.isenabled()


@pytest.mark.parametrize("static", [False, True])
def test_bf16_chain_engine_runs_greedy_and_sampled(static):
    """A bfloat16 speculative chain engine (the CUDA default's dtype and shape) keeps the catch-up's logits in the
    drafter's dtype: in session 7 a float32 buffer made every bf16 chain engine fail at its first commit, on the
    H200 and on the CPU alike, and only float32 engines were tested."""
    target = tiny_llama(seed=0).to(torch.bfloat16)
    drafter = tiny_drafter(target, seed=1).to(torch.bfloat16)
    spec = SpecConfig(3, 1, 4)
    eng = static_engine(target, drafter, spec, rows=4) if static else Engine(
        target, None, EngineConfig(max_batch_size=4), drafter=drafter, spec=spec)
    for params in (SamplingParams(max_new_tokens=12, ignore_eos=True),
                   SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=1.0)):
        outs = eng.generate(PROMPTS[:3], params)
        assert [len(o.token_ids) for o in outs] == [12, 12, 12]
        assert all(o.stats.verify_steps > 0 for o in outs)
    assert eng.runner.draft.logits.dtype == torch.bfloat16
    # the bench's oracle (no weights: float32 logits) in a bf16 engine, as `step_kernels_check.py` runs it (session 8)
    ref = Engine(target, None, EngineConfig()).generate(PROMPTS[:1], SamplingParams(max_new_tokens=12,
                                                                                    ignore_eos=True))[0].token_ids
    oracle = OracleDrafter(target.config, [list(PROMPTS[0]) + ref])
    # bf16: a verify and a decode step round differently, so the answers may part after a near-tie (this prompt's
    # second token on some CPUs: then every draft of the plain answer is rejected). The second run's reference is
    # the speculative engine's own answer, which it reproduces.
    for _ in range(2):
        eng = static_engine(target, oracle, spec, rows=4) if static else Engine(
            target, None, EngineConfig(max_batch_size=4), drafter=oracle, spec=spec)
        out = eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, ignore_eos=True))[0]
        oracle.set_references([list(PROMPTS[0]) + out.token_ids])
    assert len(out.token_ids) == 12 and eng.stats.accept_length_mean > 1.5


def test_graph_build_scope_nests_and_restores():
    """`graph_build()` marks a CUDA graph's warm-up and capture (where SDPA keeps its cuDNN backend, so that the
    warm-up picks what the capture will); outside it eager CUDA calls drop cuDNN. The mark nests and survives errors."""
    from eaglespec.layers import attention

    assert attention._graph_build is False
    with attention.graph_build():
        assert attention._graph_build is True
        with attention.graph_build():
            assert attention._graph_build is True
        assert attention._graph_build is True
    assert attention._graph_build is False
    with pytest.raises(RuntimeError), attention.graph_build():
        raise RuntimeError("capture failed")
    assert attention._graph_build is False
    assert torch.nn.attention.SDPBackend.CUDNN_ATTENTION not in attention.SDPA_BACKENDS


@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4)], ids=["plain", "chain"])
def test_steps_write_no_host_values_into_tensors(target, spec):
    """Between steps the engine changes the rows' device state: admissions set sampling parameters, finished rows are
    released, requests prefilled ahead join freed rows, the drain's requests move to lower rows. Each write must be an
    enqueued kernel: `t[row] = value` with a host value copies it to the device, which on CUDA synchronises the
    stream, so the device idles until the host launches the next step (H200, 32 rows: ~0.1-0.3 ms per released or
    joined row, ~3% of a continuous MT-bench run; docs/benchmarks.md, "Session 31"). Every path runs here, sampled
    and greedy requests mixed, and no tensor element is assigned a host value (`t[i] = v` with a Python number is
    a host-to-device copy of one element; `t[:, i] = v` is a fill kernel and allowed)."""
    lens = (5, 9, 13, 17, 6, 6, 30, 25, 12, 9, 40, 14)  # 4 rows freeing one by one: admissions park, then join
    plist = [SamplingParams(max_new_tokens=n, ignore_eos=True, temperature=0.0 if i % 3 else 1.0, top_k=5)
             for i, n in enumerate(lens)]
    prompts = [PROMPTS[i % 6] for i in range(len(lens))]
    eng = static_engine(target, tiny_drafter(target, seed=1) if spec else None, spec, rows=4, overlap=True,
                        prefill_ahead=2, compact_rows=True, seed=0)
    writes: list[str] = []
    setitem = torch.Tensor.__setitem__

    def checked(t, index, value):
        # a host value into one element is a copy (on CUDA: with a stream synchronisation); into several, a fill
        if not isinstance(value, torch.Tensor) and t[index].dim() == 0:
            writes.append(f"{tuple(t.shape)}[{index!r}] = {value!r}")
        return setitem(t, index, value)

    torch.Tensor.__setitem__ = checked
    try:
        eng.generate(prompts, plist)
    finally:
        torch.Tensor.__setitem__ = setitem
    assert all(eng.step_counts[k] > 0 for k in ("join", "compact", "prefill")), eng.step_counts
    assert writes == []


def test_warm_for_reserves_and_captures_what_one_request_needs(target, reference, monkeypatch):
    """`eaglespec generate` allocates the one request's caches and captures its graphs before timing the answer
    (`Engine.warm_for`): the length buckets of its steps and its prompt's prefill bucket only; the request then
    runs in those caches (no reallocation, which would drop the graphs) and answers as the eager path does."""
    eng = static_engine(target, tiny_drafter(target, seed=1), SpecConfig(3, 1, 4), rows=1)
    g = eng.runner.graphs
    g.capture = True  # bookkeeping only: the captures are recorded, not made
    captured = []
    monkeypatch.setattr(g, "_capture", captured.append)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)  # allocate() resets the graph pool
    prompt = PROMPTS[2]  # 30 tokens: the 64-token prefill bucket
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    n = eng.warm_for(prompt, params)
    assert eng.runner.max_len == len(prompt) + 40 and eng.runner.step_rows == 1
    assert n == len(captured)
    assert [k for k in captured if k[0] == "prefill"] == [("prefill", 1, 64, True, None, StepExtras())]
    assert {k[0] for k in captured} == {"prefill", eng._step_kind([0], True, False)} and all(k[1] == 1 for k in captured)
    assert eng.warm_for(prompt, params) == 0  # caches held: nothing more
    g.capture = False
    kv = eng.runner.kv
    assert eng.generate([prompt], params)[0].token_ids == reference[2]
    assert eng.runner.kv is kv


def test_warm_for_leaves_bad_prompts_to_the_request(target, monkeypatch):
    eng = static_engine(target, rows=1)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    eng.runner.graphs.capture = True
    assert eng.warm_for([], SamplingParams()) == 0 and eng.runner.kv is None
    assert eng.warm_for([1] * 10_000, SamplingParams()) == 0 and eng.runner.kv is None
    eng.runner.graphs.capture = False
    with pytest.raises(RequestError, match="prompt has 10000 tokens"):
        eng.add_request([1] * 10_000)


def test_warmup_captures_each_modes_own_shapes(target, monkeypatch):
    """`Engine.warmup(greedy=...)` captures the shapes the schedule gives that kind of step: a greedy warm-up the
    greedy entries' tree, a sampled one the sampled entries' chain (`serve --warmup-both-modes` asks for both), and a
    mode that decodes plainly its decode graphs."""
    from eaglespec.spec_schedule import SpecSchedule

    tree, chain = SpecConfig(4, 2, 6), SpecConfig(3, 1, 4)
    for sampled, want_sampled in (((8, chain),), "spec1"), ((), "decode"):
        eng = static_engine(target, tiny_drafter(target, seed=1), SpecSchedule(((8, tree),), sampled=sampled), rows=2)
        eng.reserve(2, 64)
        g = eng.runner.graphs
        g.capture = True  # bookkeeping only: the captures are recorded, not made
        captured = []
        monkeypatch.setattr(g, "_capture", captured.append)
        eng.warmup((1, 2), greedy=True, prefill=False)
        assert {k[0] for k in captured} == {"spec"} and all(k[3] is True for k in captured)
        captured.clear()
        eng.warmup((1, 2), greedy=False, prefill=False)
        assert {k[0] for k in captured} == {want_sampled} and all(k[3] is False for k in captured)


def test_caches_the_device_cannot_hold_are_refused_with_the_state_unchanged(target, monkeypatch):
    """KV caches larger than what the device can still give: `DeviceMemoryError` naming their size and what to
    lower, before any of the runner's state changes, so the same engine serves on with the caches it had; with room
    for exactly the target's and the drafter's caches (`KVCache.bytes_for`) the step goes ahead."""
    from eaglespec import device_memory
    from eaglespec.engine.kv_cache import KVCache
    from eaglespec.errors import DeviceMemoryError

    drafter = tiny_drafter(target, seed=1)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    long = [[1 + i % 50 for i in range(400)]]

    def grown(room):  # an engine that decoded two short prompts, then asked for a long one's caches
        eng = static_engine(target, drafter, SpecConfig(3, 1, 4), rows=2)
        ref = [o.token_ids for o in eng.generate(PROMPTS[:2], params)]
        monkeypatch.setattr(device_memory, "room", room)
        return eng, ref

    eng, ref = grown(lambda device: 0)
    r = eng.runner
    state = (r.kv, r.dkv, r.rows, r.max_len, r.cache_len, r.step_rows)
    with pytest.raises(DeviceMemoryError, match=r"the KV caches for \d+ rows of \d+ positions take \d+\.\d GiB and "
                                                r"cpu has 0\.0 GiB left; lower the batch size \(--max-batch-size\)"):
        eng.generate(long, params)
    assert (r.kv, r.dkv, r.rows, r.max_len, r.cache_len, r.step_rows) == state
    assert [o.token_ids for o in eng.generate(PROMPTS[:2], params)] == ref  # the caches it had still serve
    monkeypatch.setattr(device_memory, "room", lambda device: None)  # the CPU: not checked
    eng.generate(long, params)
    need = r.kv.nbytes() + r.dkv.nbytes()
    assert need == (KVCache.bytes_for(target.config.num_hidden_layers, target.kv_cache_shapes(), r.rows, r.cache_len,
                                      r.dtype) + KVCache.bytes_for(1, drafter.kv_cache_shapes(), r.rows, r.cache_len,
                                                                   r.dtype))
    eng, _ = grown(lambda device: need - 1)
    with pytest.raises(DeviceMemoryError):
        eng.generate(long, params)
    monkeypatch.setattr(device_memory, "room", lambda device: need)  # exactly enough
    assert len(eng.generate(long, params)[0].token_ids) == 6
