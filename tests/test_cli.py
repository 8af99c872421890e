"""The command line: the happy path on the real SmolLM2, and each user mistake as one line with a non-zero exit."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch
from test_loading_gguf import Q, write_tiny_gguf
from tiny import tiny_llama

from eaglespec.cli import main
from eaglespec.loading.safetensors_io import save_safetensors


def write_tiny_folder(folder: Path, max_pos: int = 64, arch: str = "LlamaForCausalLM") -> Path:
    m = tiny_llama(max_position_embeddings=max_pos)
    cfg = dict(architectures=[arch], model_type="llama", vocab_size=97, hidden_size=64, intermediate_size=128,
               num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
               tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_safetensors({k: v.contiguous() for k, v in m.state_dict().items()}, folder / "model.safetensors")
    return folder


def run_cli(args, capsys):
    """Runs one CLI command in this process. A command that froze the heap (engine/gc_heap.py) has it unfrozen and
    collected after it, as the end of its process would: otherwise each engine the test's commands built stays in
    memory until the test ends (an engine is a cycle), and the next commands' allocations slow down."""
    try:
        code = main(args)
    finally:
        if gc.get_freeze_count():
            gc.unfreeze()
            gc.collect()
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l]
    assert len(lines) == 1 and lines[0].startswith("eaglespec: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


def cpu_forward_cost(monkeypatch, ratio: float | dict[int, float]) -> list[list[int]]:
    """`api.load`'s measurement of this machine (engine/verify_cost.py) replaced by `ratio` (every size's, or each
    size's), so that the CPU policy's outcome does not depend on the machine the tests run on; returns the sizes each
    timing was asked about, in order."""
    asked: list[list[int]] = []

    def ratios(model, sizes, repeats=5, record=None, as_verify=False) -> dict[int, float]:
        from eaglespec.engine.verify_cost import record_path

        assert record == record_path()  # auto_spec keeps this machine's rounds
        assert as_verify == getattr(model, "int4_weights", False)  # the 4-bit path's forwards timed as verifies
        asked.append(sorted(sizes))
        return {n: ratio[n] if isinstance(ratio, dict) else ratio for n in sizes}

    monkeypatch.setattr("eaglespec.api.verify_cost_ratios", ratios)
    return asked


def test_generate_default_model(tmp_path, capsys, monkeypatch):
    """The main job: the embedded SmolLM2 with its shipped drafter, on an x86-64 CPU on the 4-bit path (its GGUF's
    own weights, `cpu_weights="auto"`), speculating in the chain its cost model picks, to plain decoding's answer;
    `--cpu-weights dense` is the float32 engine, in the float32 cost model's shape."""
    import platform

    from eaglespec.engine.int4_weights import INT4_DEFAULT_MACHINES

    four_bit = platform.machine().lower() in INT4_DEFAULT_MACHINES
    asked = cpu_forward_cost(monkeypatch, 1.0)  # a machine where a 3-token forward costs what a 1-token one does
    stats = tmp_path / "stats.json"
    question = ["What is the capital of France?", "--max-new-tokens", "12"]
    code, out, err = run_cli(["generate", *question, "--stats-json", str(stats)], capsys)
    assert code == 0
    assert "Paris" in out
    assert "tok/s" in err and "Paris" not in err
    s = json.loads(stats.read_text())
    assert s["tokens"] > 0 and s["seconds"] > 0 and s["tok_per_s"] > 0
    assert s["int4_weights"] == four_bit and s["dtype"] == ("bfloat16" if four_bit else "float32")
    assert ("4-bit CPU weights" in err) == four_bit  # the stats line says which weights answered
    # the shipped drafter, in the shape the CPU's policy chooses (the 4-bit path: the chain of 3, 2.06 / (1 + 0.15 +
    # 3 x 0.08) = 1.48x against the chain of 2's 1.46x and of 1's 1.28x; float32: the tree S3 K2 D6)
    assert s["speculative"] and "accept length" in err
    assert (s["steps"], s["topk"], s["draft_tokens"]) == ((3, 1, 4) if four_bit else (3, 2, 6))
    assert asked == [[2, 3, 4] if four_bit else [3, 4, 6]]  # its one request's kind of step alone, once
    assert s["cpu_timing_s"] < 0.05 and "timed this CPU's forwards" not in err  # (the timing replaced: instant)
    code, plain, err = run_cli(["generate", *question, "--no-spec"], capsys)
    assert code == 0 and plain == out  # lossless
    code, dense, err = run_cli(["generate", *question, "--cpu-weights", "dense", "--stats-json", str(stats)], capsys)
    s = json.loads(stats.read_text())
    assert code == 0 and "Paris" in dense and s["dtype"] == "float32" and not s["int4_weights"]
    assert "4-bit" not in err
    assert (s["steps"], s["topk"], s["draft_tokens"]) == (3, 2, 6)


def test_generate_says_what_timing_this_cpu_cost(tmp_path, capsys, monkeypatch):
    """Where `auto`'s timing of this CPU's forwards takes a noticeable part of the start-up (a machine's first
    loads: later ones keep its rounds), `generate` says how much, and the stats give it."""
    import time

    def slow(model, sizes, repeats=5, record=None, as_verify=False) -> dict[int, float]:
        time.sleep(0.3)
        return dict.fromkeys(sizes, 1.0)

    monkeypatch.setattr("eaglespec.api.verify_cost_ratios", slow)
    stats = tmp_path / "stats.json"
    code, out, err = run_cli(["generate", "Hi", "--max-new-tokens", "2", "--stats-json", str(stats)], capsys)
    timing = json.loads(stats.read_text())["cpu_timing_s"]
    assert code == 0 and 0.3 <= timing < json.loads(stats.read_text())["load_s"]
    assert f", of which {timing:.1f} s timed this CPU's forwards)" in err
    code, out, err = run_cli(["generate", "Hi", "--max-new-tokens", "2", "--no-spec"], capsys)
    assert code == 0 and "timed this CPU's forwards" not in err  # plain by request: nothing timed


def test_api_default_drafter_policy_on_the_cpu(monkeypatch):
    """`eaglespec.load()` speculates with the shipped drafter on the CPU only in a one-row engine (a 2-row step
    verifies twice the tokens, measured slower than plain decoding there), in the shapes this machine's forwards
    make pay, timed once at load for every size either mode needs: greedy steps the shape of S3 K2 D6, S2 K2 D4 and
    S2 K1 D3 with the best cost-model estimate (tau / (ratio + 0.05 + 0.08 steps)) if it reaches
    CPU_MIN_GREEDY_SPEEDUP, sampled steps the chain of 2, else the one-step chain, where its forward costs at most
    CPU_MAX_VERIFY_COST_SAMPLED (session 67's Xeon here; the other machines measured, against `auto_spec` alone:
    test_auto_times_each_modes_draft_tokens_on_the_cpu); an explicit shape always speculates."""
    from types import SimpleNamespace

    from eaglespec import api
    from eaglespec.assets import CPU_MAX_VERIFY_COST_SAMPLED, CPU_MIN_GREEDY_SPEEDUP
    from eaglespec.config import EngineConfig, SpecConfig

    def load(**kw) -> SimpleNamespace:
        """api.load's choice, the engine itself released (a dozen SmolLM2 engines with their packed projections
        and KV caches alive at once made the test 4x slower through the memory they took)."""
        e = api.load(**kw)
        seen = SimpleNamespace(speculative=e.speculative, spec=e.spec, plain_note=e.plain_note, schedule=e.schedule)
        del e
        gc.collect()
        return seen

    def shapes(engine) -> list[SpecConfig | None]:  # (greedy, sampled) one-row steps' shapes
        return [engine.schedule.shape(1, greedy=g) for g in (True, False)]

    one_row = EngineConfig(device="cpu", max_batch_size=1, cpu_weights="dense")  # float32's policy
    wide, chain2 = SpecConfig(3, 2, 6), SpecConfig(2, 1, 3)
    asked = cpu_forward_cost(monkeypatch, {2: 1.05, 3: 1.1, 4: 1.35, 6: 1.43})  # session 67's Xeon: 3 rows cheap
    xeon = load(config=one_row)
    assert xeon.speculative and shapes(xeon) == [chain2, chain2] and xeon.plain_note is None
    assert asked == [[2, 3, 4, 6]]  # one timing for both modes' sizes
    asked = cpu_forward_cost(monkeypatch, 1.0)
    sampled = load(config=one_row, temperature=0.8)  # built to sample: its own mode decides whether it speculates
    assert sampled.speculative and shapes(sampled) == [wide, chain2] and asked == [[2, 3, 4, 6]]
    many = load(config=EngineConfig(device="cpu", max_batch_size=8))
    assert not many.speculative and len(asked) == 1  # no shape measured for 8 rows: nothing timed
    # speculative steps of at most one row (spec_max_rows, `eaglespec serve`'s CPU default): the one-row shapes
    lone = load(config=EngineConfig(device="cpu", max_batch_size=4, spec_max_rows=1, cpu_weights="dense"))
    assert lone.speculative and shapes(lone) == [wide, chain2] and len(asked) == 2
    forced = load(spec=SpecConfig(2, 1, 3), config=EngineConfig(device="cpu", max_batch_size=8))
    assert forced.speculative and forced.spec == SpecConfig(2, 1, 3) and len(asked) == 2  # not timed
    # under the greedy floor (1.91 / (1.46 + 0.21) = 1.144x at best): plain, and why
    cpu_forward_cost(monkeypatch, {2: 1.3, 3: 1.46, 4: 2.0, 6: 2.0})
    under = load(config=one_row)
    assert not under.speculative and under.plain_note == (
        "here forwards of 3 / 4 / 6 tokens cost 1.46x / 2.00x / 2.00x one of 1 token: greedy speculation's best "
        f"shape, S2 K1 D3, would run about 1.14x plain decoding by the CPU's cost model, under the "
        f"{CPU_MIN_GREEDY_SPEEDUP}x it takes to speculate")
    # sampled steps whose chains both cost over CPU_MAX_VERIFY_COST_SAMPLED: plain, the last one tried named
    asked = cpu_forward_cost(monkeypatch, 1.8)  # session 18's machine through F.linear: a 3-token forward 1.64-1.80x
    slow = load(config=one_row, temperature=0.8)
    assert not slow.speculative and asked == [[2, 3, 4, 6]]
    assert slow.plain_note == ("here a forward of 2 tokens costs 1.80x one of 1 token; sampled speculation pays on "
                               f"the CPU only up to {CPU_MAX_VERIFY_COST_SAMPLED}x")
    assert not load(config=one_row).speculative  # greedy: S3 K2 D6's 2.29 / 2.09 = 1.10x at best
    forced = load(spec=SpecConfig(2, 1, 3), config=one_row)
    assert forced.speculative and forced.plain_note is None  # an explicit shape is not second-guessed


def test_cpu_sampled_steps_try_the_one_step_chain_first_for_hot_unfiltered_requests(monkeypatch):
    """On the CPU `auto`'s sampled steps try the chain of 2, then the one-step chain; requests known to sample
    unfiltered at temperature 1 or hotter (`only`: generate, chat, bench) try the one-step chain first (measured
    faster there on two machines: docs/benchmarks.md, "Session 67"), while a filter (top-p, top-k, min-p), a cooler
    temperature or an engine for any request keeps the chain of 2 first; each shape still against its limit."""
    from eaglespec.api import auto_spec
    from eaglespec.assets import CPU_MAX_VERIFY_COST_SAMPLED
    from eaglespec.config import SpecConfig
    from eaglespec.sampling_params import SamplingParams

    one_step, chain2 = SpecConfig(1, 1, 2), SpecConfig(2, 1, 3)
    f32 = torch.nn.Linear(2, 2)
    asked = cpu_forward_cost(monkeypatch, CPU_MAX_VERIFY_COST_SAMPLED)  # both chains within the limit
    cases = [(SamplingParams(temperature=1.0), one_step), (SamplingParams(temperature=1.3, seed=1), one_step),
             (SamplingParams(temperature=0.8), chain2), (SamplingParams(temperature=1.0, top_p=0.95), chain2),
             (SamplingParams(temperature=1.0, top_k=40), chain2), (SamplingParams(temperature=1.0, min_p=0.05), chain2)]
    for params, shape in cases:
        asked.clear()
        spec, note = auto_spec(f32, "cpu", 1, only=params)  # (their steps' shape alone)
        assert note is None and spec == shape
        assert asked == [[2, 3]], params  # the sampled chains' sizes alone, once
    asked.clear()  # an engine for any request (`serve`), built to sample at temperature 1: the chain of 2 first
    schedule, note = auto_spec(f32, "cpu", 1, temperature=1.0)
    assert note is None and schedule.shape(1, greedy=False) == chain2 and asked == [[2, 3, 4, 6]]
    asked = cpu_forward_cost(monkeypatch, CPU_MAX_VERIFY_COST_SAMPLED + 0.01)  # both too dear: plain
    spec, note = auto_spec(f32, "cpu", 1, only=SamplingParams(temperature=1.0))
    assert spec is None and "forward of 3 tokens" in note  # the last one tried: here the chain of 2


def test_default_drafter_policy_per_device_and_engine_size(monkeypatch):
    """The measured policy (docs/benchmarks.md, "The shipped drafter", "Session 19", "Session 24", "Session 25",
    "Session 61"): the tree S3 K2 D6 in one-row CPU engines when greedy (untimed; `auto` weighs it, S2 K2 D4 and S2 K1
    D3 by timing) and a chain of 2 when sampling; on CUDA when greedy a chain of 3 at 1 and 9-16 rows, the tree S4 K4 D8
    at 2-8 and S5 K2 D8 at 17-32 rows, in engines of up to 32 rows (unmeasured above 32 rows), greedy in float32 the
    chain of 3 at 1-32 rows, and when sampling the chain of 3 in engines of up to 32 rows; plain decoding elsewhere, and
    an explanation for each case. A policy of several shapes gives engines of several rows a schedule, each step the
    shape of its rows; greedy and sampled steps each take their own mode's shapes (`SpecSchedule.sampled`), whatever
    temperature the engine is built for: the temperature decides only whether it speculates at all. Steps under count
    penalties decode plainly on CUDA and the CPU."""
    import eaglespec.assets as assets
    from eaglespec.assets import default_spec, slower_note
    from eaglespec.config import SpecConfig
    from eaglespec.spec_schedule import SpecSchedule

    def cuda(entries, sampled=None):  # CUDA's steps under count penalties decode plainly (session 50)
        return SpecSchedule(entries, sampled=sampled, penalized=())

    two, chain2 = SpecConfig(3, 2, 6), SpecConfig(2, 1, 3)
    # a greedy tree, a sampled chain; steps under count penalties decode plainly (session 52: 0.95-0.99x)
    cpu = SpecSchedule(((1, two),), sampled=((1, chain2),), penalized=())
    assert default_spec("cpu", 1) == cpu and default_spec("cpu", 2) is None
    assert default_spec("cpu", 1, temperature=1.0) == cpu and default_spec("cpu", 2, 1.0) is None
    assert [cpu.shape(1, greedy) for greedy in (True, False)] == [two, chain2]
    chain, tree, chain4 = SpecConfig(3, 1, 4), SpecConfig(4, 4, 16), SpecConfig(4, 1, 5)
    # sessions 19 and 25: the chain of 3 at 9-16 rows, the tree S4 K4 D8 at 2-8 rows and S5 K2 D8 at 17-32 rows;
    # session 65: the chain of 4 at one row (its 5-token verify on the row grid), session 66 at 9-12 rows too (a verify
    # of up to 60 rows on tensor cores): each shape where it measured faster (docs/benchmarks.md); sampled steps the
    # chain of 3 (sessions 24, 66)
    k4, k2 = SpecConfig(4, 4, 8), SpecConfig(5, 2, 8)
    assert default_spec("cuda", 1) == cuda(((1, chain4),), sampled=((1, chain),))  # penalized steps plain
    assert default_spec("cuda", 8) == cuda(((1, chain4), (8, k4)), sampled=((8, chain),))
    assert default_spec("cuda", 12) == cuda(((1, chain4), (8, k4), (12, chain4)), sampled=((12, chain),))
    assert default_spec("cuda", 14) == cuda(((1, chain4), (8, k4), (12, chain4), (14, chain)), sampled=((14, chain),))
    full = cuda(((1, chain4), (8, k4), (12, chain4), (16, chain), (32, k2)), sampled=((32, chain),))
    assert default_spec("cuda", 32) == full
    assert full.shapes == (chain4, k4, chain, k2)  # each step bucket takes one of them
    from eaglespec.engine.cuda_graphs import BATCH_BUCKETS
    from eaglespec.layers.norm_linear_kernel import MAX_ROWS

    # why 12: steps of 9-12 rows replay the 12-row graph, whose 60-row verify stays on the tensor-core kernel (80/80
    # answers identical, 2.03x), while 16 rows of the chain of 4 pass its 64 rows to cuBLAS (17/80, 1.79x)
    assert 12 in BATCH_BUCKETS and 12 * chain4.draft_tokens <= MAX_ROWS < 16 * chain4.draft_tokens
    assert [full.shapes[full.shape_index(r)] for r in (1, 2, 8, 9, 12, 13, 16, 17, 32)] == [
        chain4, k4, k4, chain4, chain4, chain, chain, k2, k2]
    assert {full.shapes[full.shape_index(r, greedy=False)] for r in (1, 2, 8, 9, 16, 17, 32)} == {chain}
    # steps under count penalties (session 50: 0.86x / 0.76x at 1 / 32 rows on the H200; session 52: 0.95-0.99x on the
    # CPU) decode plainly on both, greedy or sampled
    assert full.shape(1, penalized=True) is None and full.shape(32, greedy=False, penalized=True) is None
    assert cpu.shape(1, penalized=True) is None and cpu.shape(1, False, True) is None
    assert default_spec("cuda", 33) is None and "above 32 rows" in slower_note("cuda")
    # greedy float32 on CUDA (session 38): the bf16 trees lost there (0.92x / 0.86x at 8 / 32 rows), the chain of 3
    # at 1-32 rows; bf16 / float16 / unsaid keep the bf16 table, the CPU (float32 always) its own
    for rows in (1, 8, 16, 32):
        assert default_spec("cuda", rows, 0.0, torch.float32) == cuda(((rows, chain),))
    assert default_spec("cuda", 33, 0.0, torch.float32) is None
    for dtype in (None, torch.bfloat16, torch.float16):
        assert default_spec("cuda", 32, 0.0, dtype) == full
    assert default_spec("cpu", 1, 0.0, torch.float32) == cpu
    assert default_spec("cuda", 8, 1.0, torch.float32) == cuda(((8, chain),))
    from eaglespec.api import auto_spec  # `load` and `bench --spec auto` read the dtype off the target's weights
    assert auto_spec(torch.nn.Linear(2, 2), "cuda", 8) == (cuda(((8, chain),)), None)
    assert auto_spec(torch.nn.Linear(2, 2).to(torch.bfloat16), "cuda", 8) == (
        cuda(((1, chain4), (8, k4)), sampled=((8, chain),)), None)
    # a bench run's requests alone (`only`): their mode's shapes, or plain decoding under count penalties on CUDA
    from eaglespec.assets import PENALIZED_NOTE
    from eaglespec.sampling_params import SamplingParams

    bf16 = torch.nn.Linear(2, 2).to(torch.bfloat16)
    assert auto_spec(bf16, "cuda", 8, only=SamplingParams()) == (SpecSchedule(((1, chain4), (8, k4))), None)
    assert auto_spec(bf16, "cuda", 8, only=SamplingParams(temperature=1.0)) == (chain, None)
    assert auto_spec(bf16, "cuda", 8, only=SamplingParams(repetition_penalty=1.1)) == (None, PENALIZED_NOTE)
    wide = SpecConfig(5, 2, 8)  # session 15's policy: past 16 rows the K = 2 tree
    monkeypatch.setitem(assets._DEFAULT_SPEC, "cuda", ((16, chain), (32, wide)))
    assert default_spec("cuda", 32) == cuda(((16, chain), (32, wide)), sampled=((32, chain),))
    assert [default_spec("cuda", 24).shapes[default_spec("cuda", 24).shape_index(r)] for r in (1, 16, 17, 24)] == [
        chain, chain, wide, wide]
    monkeypatch.setitem(assets._DEFAULT_SPEC, "cuda", ((1, chain), (8, tree), (32, chain)))  # session 13's policy
    assert default_spec("cuda", 1) == cuda(((1, chain),))  # engines of several rows: a schedule, each step the shape of its rows
    assert default_spec("cuda", 2) == cuda(((1, chain), (2, tree)), sampled=((2, chain),))
    assert default_spec("cuda", 32) == cuda(((1, chain), (8, tree), (32, chain)), sampled=((32, chain),))
    assert [default_spec("cuda", 32).shapes[default_spec("cuda", 32).shape_index(r)] for r in (1, 5, 8, 9, 32)] == [
        chain, tree, tree, chain, chain]
    assert default_spec("cuda", 33) is None and "above 32 rows" in slower_note("cuda")
    assert default_spec("mps", 1) is None and "not measured on mps" in slower_note("mps")
    # sampled on CUDA (session 24's measurements): the chain of 3 at 1-32 rows; an engine built to sample still
    # gives greedy steps their trees
    three = SpecConfig(3, 1, 4)
    assert default_spec("cuda", 1, temperature=0.7) == cuda(((1, three),))
    assert default_spec("cuda", 32, 1.0) == cuda(((1, chain), (8, tree), (32, chain)), sampled=((32, three),))
    assert default_spec("cuda", 33, temperature=0.7) is None and "above 32 rows" in slower_note("cuda")
    # a mode the table does not reach: sampled steps decode plainly, greedy steps take the sampled shapes
    monkeypatch.setitem(assets._DEFAULT_SPEC_SAMPLED, "cuda", ((8, three),))
    assert default_spec("cuda", 16) == cuda(((1, chain), (8, tree), (16, chain)), sampled=())
    assert default_spec("cuda", 16, 1.0) is None  # built to sample: plain decoding
    monkeypatch.setitem(assets._DEFAULT_SPEC_SAMPLED, "cuda", ((64, three),))
    assert default_spec("cuda", 64, 1.0) == cuda(((64, three),)) and default_spec("cuda", 64) is None


def test_auto_times_each_modes_draft_tokens_on_the_cpu(monkeypatch):
    """On the CPU `auto` times, once, forwards of every size its modes' shapes verify (3 / 4 / 6 tokens greedy, 2 / 3
    sampled): greedy steps take the shape with the best cost-model estimate (`assets.cpu_greedy_estimates`), sampled
    steps the chain of 2 (3 tokens, up to 1.2x one token), else the one-step chain (2 tokens, up to 1.2x). Where the
    engine's own mode fails it decodes plainly and says why; where only the other mode fails, that mode's steps
    decode plainly (sampled) or take the sampled shape (greedy)."""
    from eaglespec.api import auto_spec
    from eaglespec.assets import CPU_DRAFT_STEP_COST, CPU_GREEDY_TAUS, CPU_STEP_OVERHEAD, cpu_greedy_estimates
    from eaglespec.config import SpecConfig
    from eaglespec.spec_schedule import SpecSchedule

    wide, two, chain2, chain1 = SpecConfig(3, 2, 6), SpecConfig(2, 2, 4), SpecConfig(2, 1, 3), SpecConfig(1, 1, 2)
    target = torch.nn.Linear(2, 2)

    def plan(greedy: SpecConfig, sampled: SpecConfig | None | tuple = ()) -> SpecSchedule:  # penalized: plain
        return SpecSchedule(((1, greedy),), sampled=((1, sampled),) if isinstance(sampled, SpecConfig) else sampled,
                            penalized=())

    ratios = {6: 1.43, 4: 1.35, 3: 1.1, 2: 1.05}
    assert [spec for spec, _ in CPU_GREEDY_TAUS] == [wide, two, chain2]
    assert cpu_greedy_estimates(ratios) == tuple(
        (spec, tau / (ratios[spec.draft_tokens] + CPU_STEP_OVERHEAD + CPU_DRAFT_STEP_COST * spec.steps))
        for spec, tau in CPU_GREEDY_TAUS)
    all_sizes = [[2, 3, 4, 6]]
    for ratios, want in [({6: 1.0, 4: 1.0, 3: 1.0, 2: 1.0}, plan(wide, chain2)),  # alike: the widest tree
                         ({6: 1.6, 4: 1.07, 3: 1.04, 2: 1.01}, plan(two, chain2)),  # 6 tokens dear: the narrower
                         (ratios, plan(chain2, None)),  # 4+ dear, 3 cheap: the chain of 2 for both modes
                         ({6: 1.27, 4: 1.24, 3: 1.26, 2: 1.05}, plan(wide, chain1))]:  # sampled: 3 over 1.2x
        asked = cpu_forward_cost(monkeypatch, ratios)
        assert auto_spec(target, "cpu") == (want, None), ratios
        assert asked == all_sizes
    # the greedy floor: the chain of 2 at 1.91 / (1.44 + 0.21) = 1.158x speculates (sampled steps: both chains over
    # 1.2x, plain), at 1.46 (1.144x) the engine decodes plainly (its message: test_api_default_drafter_policy_on_the_cpu)
    cpu_forward_cost(monkeypatch, {6: 2.0, 4: 2.0, 3: 1.44, 2: 1.3})
    assert auto_spec(target, "cpu") == (plan(chain2), None)
    cpu_forward_cost(monkeypatch, {6: 2.0, 4: 2.0, 3: 1.46, 2: 1.3})
    assert auto_spec(target, "cpu")[0] is None
    asked = cpu_forward_cost(monkeypatch, {6: 1.27, 4: 1.24, 3: 1.26, 2: 1.21})  # greedy pays, sampled does not
    assert auto_spec(target, "cpu") == (plan(wide), None)  # sampled steps decode plainly
    spec, note = auto_spec(target, "cpu", temperature=1.0)  # an engine built to sample decodes plainly
    assert spec is None and note == "here a forward of 2 tokens costs 1.21x one of 1 token; sampled speculation pays " \
                                    "on the CPU only up to 1.2x"  # the last shape tried
    assert asked == all_sizes * 2
    cpu_forward_cost(monkeypatch, {6: 1.9, 4: 1.9, 3: 1.5, 2: 1.1})  # sampled pays (one step), greedy does not
    assert auto_spec(target, "cpu", temperature=1.0) == (SpecSchedule(((1, chain1),), penalized=()), None)
    spec, note = auto_spec(target, "cpu")  # greedy steps took the sampled shape above; a greedy engine: plain
    assert spec is None and "best shape, S2 K1 D3, would run about 1.12x plain decoding" in note


def test_generate_with_penalties_speculates_to_plain_decodings_answer(capsys, monkeypatch, smollm2):
    """`--repetition-penalty` and `--frequency-penalty` reach the engine: the speculative answer (a shape given) is
    plain decoding's under them, and they change the answer; with the default drafter's `auto` such a request
    decodes plainly on the CPU (session 52: speculation 0.95-0.99x under penalties) and says why."""
    from eaglespec.engine.engine import Engine
    from eaglespec.sampling_params import SamplingParams

    cpu_forward_cost(monkeypatch, 1.0)  # speculate, whatever this machine's forwards cost
    question = "Name three primary colours."
    penalties = ["--repetition-penalty", "1.3", "--frequency-penalty", "0.5"]
    penalties += ["--cpu-weights", "dense"]  # the fixture's float32 engine below
    code, out, err = run_cli(["generate", question, "--max-new-tokens", "20", *penalties], capsys)
    assert code == 0 and "accept length" not in err and "steps under count penalties decode plainly" in err
    auto_out = out
    code, out, err = run_cli(["generate", question, "--max-new-tokens", "20", "--spec", "2,2,4", *penalties], capsys)
    assert code == 0 and "accept length" in err and out == auto_out
    plain = Engine(smollm2.model, smollm2.tokenizer)
    want = plain.generate([question], SamplingParams(max_new_tokens=20, repetition_penalty=1.3,
                                                     frequency_penalty=0.5))[0].text
    assert out.strip() == want.strip()
    assert want != plain.generate([question], SamplingParams(max_new_tokens=20))[0].text


def test_generate_with_a_json_schema_file_and_a_regex(tmp_path, capsys, monkeypatch, smollm2):
    """`--json-schema FILE` and `--regex` reach the engine: the speculative answer is plain constrained decoding's,
    and it parses; a regex that does not compile, or a schema that is not JSON, is one sentence."""
    from eaglespec.engine.engine import Engine
    from eaglespec.grammar import StructuredOutput
    from eaglespec.sampling_params import SamplingParams

    cpu_forward_cost(monkeypatch, 1.0)
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    question = "What is the capital of France? Answer as JSON."
    code, out, err = run_cli(["generate", question, "--max-new-tokens", "30", "--json-schema", str(path),
                              "--cpu-weights", "dense"], capsys)  # the fixture's float32 engine below
    assert code == 0 and "accept length" in err
    plain = Engine(smollm2.model, smollm2.tokenizer)
    want = plain.generate([question], SamplingParams(max_new_tokens=30,
                                                     structured=StructuredOutput.json_schema(schema)))[0].text
    assert out.strip() == want and json.loads(want)["city"] == "Paris"
    code, out, err = run_cli(["generate", "Is it?", "--max-new-tokens", "8", "--regex", "(yes|no)"], capsys)
    assert code == 0 and out.strip() in ("yes", "no")
    code, out, err = run_cli(["generate", "Is it?", "--regex", "(ab"], capsys)
    assert_one_line_error(code, err, "the structured output's regex does not compile")
    code, out, err = run_cli(["generate", "Is it?", "--json-schema", "{oops"], capsys)
    assert_one_line_error(code, err, "the JSON schema is not valid JSON")


def test_generate_default_model_decodes_plainly_where_the_drafter_is_slower(capsys, monkeypatch):
    """Where the shipped drafter was measured slower than plain decoding (as on the H200), `draft="auto"` decodes
    plainly and says why on stderr; an explicit shape speculates anyway."""
    import eaglespec.assets as assets

    monkeypatch.setitem(assets._DEFAULT_SPEC, "cpu", ())
    monkeypatch.setitem(assets._SLOWER, "cpu", "0.5x here")
    code, out, err = run_cli(["generate", "What is the capital of France?", "--max-new-tokens", "6"], capsys)
    assert code == 0 and out.strip()
    assert "no speculation: the shipped drafter is slower than plain decoding on cpu (0.5x here" in err
    # an explicit shape, here a schedule as `eaglespec tune` prints it: a one-row engine takes its first entry
    code, out, err = run_cli(["generate", "What is the capital of France?", "--max-new-tokens", "6", "--spec",
                              "1:2,1,3/8:4,2,8"], capsys)
    assert code == 0 and "accept length" in err and "S=2 K=1 D=3" in err


def test_generate_says_when_this_cpu_makes_speculation_slower(capsys, monkeypatch):
    """On a CPU whose few-token forwards cost too much (measured at load), `generate` decodes plainly and says what
    it measured; the answer is the same."""
    cpu_forward_cost(monkeypatch, 1.8)
    code, out, err = run_cli(["generate", "What is the capital of France?", "--max-new-tokens", "6", "--cpu-weights",
                              "dense"], capsys)  # the float32 cost model's (the 4-bit path's: test_int4_weights)
    assert code == 0 and "Paris" in out and "accept length" not in err
    assert "no speculation" in err and "here forwards of 3 / 4 / 6 tokens cost 1.80x / 1.80x / 1.80x one" in err
    assert "best shape, S3 K2 D6, would run about 1.10x plain decoding" in err


def test_the_embedded_model_and_the_shipped_drafter_named_by_path(tmp_path, capsys, monkeypatch):
    """`--model` naming the embedded GGUF anywhere (a renamed copy: same size and sha256) gets the shipped drafter and
    its measured shape, as no `--model` does, and the same explanation where it decodes plainly; `--draft` naming the
    shipped drafter (a copy of its folder) takes the shapes `auto` times and chooses, but speculates where `auto`
    would decode plainly (the user asked for it); a file of the same size with other bytes is another model, and an
    edited copy of the drafter another drafter (SpecConfig's default shape, untimed)."""
    import shutil

    from eaglespec import api
    from eaglespec.assets import default_drafter_path, is_default_drafter
    from eaglespec.config import EngineConfig, SpecConfig
    from eaglespec.loading.default import default_model_path, is_default_model

    gguf = default_model_path()
    copy = tmp_path / "my-smollm2.gguf"
    shutil.copyfile(gguf, copy)
    same_size = tmp_path / "same-size.gguf"
    with open(same_size, "wb") as f:
        f.truncate(gguf.stat().st_size)
    assert is_default_model(gguf) and is_default_model(copy)
    assert not any(is_default_model(p) for p in (same_size, tmp_path, tmp_path / "missing.gguf"))

    asked = cpu_forward_cost(monkeypatch, 1.0)
    # (float32: the CPU cost model's shapes; the 4-bit path's recognise the model alike)
    by_path = api.load(str(copy), config=EngineConfig(device="cpu", max_batch_size=1, cpu_weights="dense"))
    # timed (each mode's draft tokens), as for no --model
    assert by_path.speculative and by_path.spec == SpecConfig(3, 2, 6)
    assert asked == [[2, 3, 4, 6]]
    shipped = default_drafter_path()
    drafter = tmp_path / "drafter"
    shutil.copytree(shipped, drafter)
    assert is_default_drafter(shipped) and is_default_drafter(drafter) and not is_default_drafter(tmp_path)
    lone = EngineConfig(device="cpu", max_batch_size=4, spec_max_rows=1, cpu_weights="dense")
    named = api.load(str(copy), draft=str(drafter), config=lone)
    # timed as `auto` times (both modes' sizes): the one-row shapes it chooses
    assert named.schedule.shape(1, greedy=True) == SpecConfig(3, 2, 6) and asked == [[2, 3, 4, 6]] * 2
    assert named.schedule.shape(1, greedy=False) == SpecConfig(2, 1, 3)
    # a CPU where every shape is estimated under the floor and every sampled forward over its limit: `auto` decodes
    # plainly, the named drafter (asked for) speculates in the best of them: greedy steps the best estimate (S2 K1 D3:
    # 1.91 / (1.5 + 0.21) = 1.12x, against S2 K2 D4's 1.01x and S3 K2 D6's 1.00x), sampled the cheapest forward (the
    # one-step chain's 2 tokens, 1.4x against the chain of 2's 1.5x)
    asked = cpu_forward_cost(monkeypatch, {2: 1.4, 3: 1.5, 4: 1.8, 6: 2.0})
    assert not api.load(str(copy), config=lone).speculative
    slow = api.load(str(copy), draft=str(drafter), config=lone)
    assert slow.speculative and slow.plain_note is None and asked == [[2, 3, 4, 6]] * 2
    assert [slow.schedule.shape(1, greedy=g) for g in (True, False)] == [SpecConfig(2, 1, 3), SpecConfig(1, 1, 2)]
    del slow
    asked = cpu_forward_cost(monkeypatch, 1.0)
    config = drafter / "config.json"
    config.write_text(config.read_text() + "\n")  # the same drafter to json, other bytes: not the shipped one
    assert not is_default_drafter(drafter)
    assert api.load(str(copy), draft=str(drafter), config=lone).spec == SpecConfig() and not asked

    cpu_forward_cost(monkeypatch, 1.8)  # a slow CPU: the CLI explains plain decoding for the named GGUF too
    code, out, err = run_cli(["generate", "What is the capital of France?", "--max-new-tokens", "4", "--model",
                              str(copy), "--cpu-weights", "dense"], capsys)
    assert code == 0 and "here forwards of 3 / 4 / 6 tokens cost 1.80x / 1.80x / 1.80x one of 1 token" in err


def test_spec_text_round_trip():
    from eaglespec.config import SpecConfig
    from eaglespec.spec_schedule import SpecSchedule, parse_spec, spec_text
    from eaglespec.errors import ConfigError

    for text in ("3,1,4", "1:3,1,4/8:4,2,8/16:3,1,4/32:4,2,8", "1:3,1,4/8:4,4,8;sampled=3,1,4",
                 "4,2,8;sampled=1:2,1,3/8:3,1,4", "1:3,1,4/8:4,4,8;sampled=plain", "3,1,4;penalized=plain",
                 "1:3,1,4/8:4,4,8;sampled=3,1,4;penalized=2,1,3"):
        assert spec_text(parse_spec(text)) == text
    assert parse_spec(" 5, 4, 16 ") == SpecConfig(5, 4, 16)
    assert parse_spec("2:2,1,3/4:2,2,4") == SpecSchedule(((2, SpecConfig(2, 1, 3)), (4, SpecConfig(2, 2, 4))))
    # sampled steps' own shapes: a lone shape covers every step, as a lone greedy shape does
    assert parse_spec("2:2,1,3/4:2,2,4; sampled = 3,1,4").shape(100, greedy=False) == SpecConfig(3, 1, 4)
    assert parse_spec("4,2,8;sampled=plain") == SpecSchedule(((1 << 30, SpecConfig(4, 2, 8)),), sampled=())
    assert parse_spec("3,1,4;penalized=plain;sampled=2,1,3") == parse_spec("3,1,4;sampled=2,1,3;penalized=plain")
    for bad in ("3,1,4;greedy=3,1,4", "3,1,4;sampled=", "3,1,4;sampled=3,1,4;sampled=plain", "3,1,4;3,1,4",
                "3,1,4;penalized=plain;penalized=3,1,4"):
        with pytest.raises(ConfigError, match="--spec takes a greedy shape or schedule, then optionally ;sampled="):
            parse_spec(bad)
    import argparse

    from eaglespec.cli.options import spec_config

    blank = dict(steps=None, topk=None, draft_tokens=None)
    assert spec_config(argparse.Namespace(spec="auto", **blank)) is None  # generate's `--spec auto`: the default
    assert spec_config(argparse.Namespace(spec="1:3,1,4/8:4,2,8", **blank)) == parse_spec("1:3,1,4/8:4,2,8")


def test_verify_cost_ratios_time_the_forwards(monkeypatch):
    """The measurement itself: a warm-up of each size, then rounds of 1 token and each size in turn (a busy spell on
    a shared machine then slows a round's sizes alike), each size's ratio the median over the rounds of its time over
    its round's 1-token time; positive ratios (their sizes are the machine's)."""
    from eaglespec.engine import verify_cost
    from eaglespec.engine.verify_cost import verify_cost_ratios

    m = tiny_llama(seed=0)
    lengths: list[int] = []
    m.register_forward_pre_hook(lambda mod, args: lengths.append(args[0].shape[1]))
    ratios = verify_cost_ratios(m, {6, 3}, repeats=2)
    assert sorted(ratios) == [3, 6] and all(r > 0 for r in ratios.values())
    assert lengths == [1, 3, 6, 1, 3, 6, 1, 3, 6]  # a warm-up, then two rounds
    for bad in ([], [0, 3]):
        with pytest.raises(ValueError, match="sizes must be >= 1 and repeats >= 1"):
            verify_cost_ratios(m, bad)
    with pytest.raises(ValueError, match="sizes must be >= 1 and repeats >= 1"):
        verify_cost_ratios(m, [3], repeats=0)

    costs = iter([10, 12, 15, 10, 12, 15, 40, 48, 15, 10, 13, 30])  # warm-up, then three rounds of 1 / 3 / 6 tokens
    monkeypatch.setattr(verify_cost, "_forward_s", lambda model, ids, context: float(next(costs)))
    # 3 tokens a round: 1.2, 1.2 (a busy round), 1.3 -> 1.2; 6 tokens: 1.5, 0.375 (that round's 1 token), 3.0 -> 1.5
    assert verify_cost_ratios(m, [3, 6], repeats=3) == pytest.approx({3: 1.2, 6: 1.5})


def test_verify_cost_ratios_keep_a_record_per_machine_and_model(tmp_path, monkeypatch):
    """With a record, a machine's first timing takes `repeats` rounds and keeps them (per `machine_key` and size);
    later ones time one round more of each size (after the warm-up) and answer the median over all kept, until a
    size has RECORD_ROUNDS, when it is not timed; a size not yet kept, rounds older than RECORD_DAYS or an
    unreadable record are timed afresh; a model of other shapes keeps its own; an empty EAGLESPEC_CACHE_DIR keeps
    none."""
    import statistics
    import time

    from eaglespec.engine.verify_cost import RECORD_DAYS, RECORD_ROUNDS, machine_key, record_path, verify_cost_ratios

    m = tiny_llama(seed=0)
    forwards: list[int] = []
    m.register_forward_pre_hook(lambda mod, args: forwards.append(args[0].shape[1]))
    record = tmp_path / "cache" / "costs.json"
    key = machine_key(m)

    def kept() -> dict[str, list]:
        return json.loads(record.read_text())[key]

    first = verify_cost_ratios(m, [6, 3], repeats=3, record=record)
    assert len(forwards) == 3 + 3 * 3 and sorted(kept()) == ["3", "6"] and all(len(v) == 3 for v in kept().values())
    assert first == {n: statistics.median(r for _, r in kept()[str(n)]) for n in (3, 6)}
    forwards.clear()
    again = verify_cost_ratios(m, [3, 6], repeats=3, record=record)  # one round more, after a warm-up
    assert forwards == [1, 3, 6, 1, 3, 6] and all(len(v) == 4 for v in kept().values())
    assert again == {n: statistics.median(r for _, r in kept()[str(n)]) for n in (3, 6)}
    forwards.clear()
    verify_cost_ratios(m, [2, 3], repeats=3, record=record)  # 2 tokens not kept yet: its three rounds, 3 tokens one
    assert forwards == [1, 2, 3, 1, 2, 3, 1, 2, 1, 2] and [len(kept()[n]) for n in ("2", "3", "6")] == [3, 5, 4]
    now = time.time()
    doc = json.loads(record.read_text())
    doc[key]["3"] = [[now, 1.0]] * (RECORD_ROUNDS - 1) + [[now, 9.0]]  # a full record: its median, nothing timed
    doc[key]["6"] = [[now, 2.0]] * RECORD_ROUNDS
    record.write_text(json.dumps(doc))
    forwards.clear()
    assert verify_cost_ratios(m, [3, 6], repeats=3, record=record) == {3: 1.0, 6: 2.0} and forwards == []
    doc[key]["6"] = [[now - RECORD_DAYS * 86400 - 1, 2.0]] * RECORD_ROUNDS  # too old: dropped, timed afresh
    record.write_text(json.dumps(doc))
    verify_cost_ratios(m, [3, 6], repeats=3, record=record)  # (3 tokens full: not timed)
    assert forwards == [1, 6] * 4 and len(kept()["6"]) == 3 and len(kept()["3"]) == RECORD_ROUNDS
    other = tiny_llama(seed=0, hidden=32)
    assert machine_key(other) != key and machine_key(tiny_llama(seed=1)) == key  # shapes count, not values
    verify_cost_ratios(other, [3], repeats=2, record=record)
    assert sorted(json.loads(record.read_text())) == sorted([key, machine_key(other)])
    record.write_text("{oops")  # unreadable: timed afresh, rewritten
    forwards.clear()
    verify_cost_ratios(m, [3], repeats=2, record=record)
    assert len(forwards) == 2 + 2 * 2 and len(kept()["3"]) == 2
    monkeypatch.setenv("EAGLESPEC_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert record_path() == tmp_path / "elsewhere" / "cpu_forward_costs.json"
    monkeypatch.setenv("EAGLESPEC_CACHE_DIR", "")
    assert record_path() is None
    monkeypatch.delenv("EAGLESPEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert record_path() == tmp_path / "xdg" / "eaglespec" / "cpu_forward_costs.json"
    monkeypatch.delenv("XDG_CACHE_HOME")

    def homeless() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(homeless))
    assert record_path() is None  # no home to be found: no record, and no error


def test_missing_model_path(capsys):
    code, _, err = run_cli(["generate", "hi", "--model", "/no/such/model"], capsys)
    assert_one_line_error(code, err, "/no/such/model", "does not exist")


def test_corrupt_safetensors_header(tmp_path, capsys):
    folder = write_tiny_folder(tmp_path / "m")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:8] + b"{not json" + data[17:200])
    code, _, err = run_cli(["generate", "hi", "--model", str(folder), "--no-chat-template"], capsys)
    assert_one_line_error(code, err, "model.safetensors")


def test_unknown_architecture(tmp_path, capsys):
    folder = write_tiny_folder(tmp_path / "m", arch="FancyNewForCausalLM")
    code, _, err = run_cli(["generate", "hi", "--model", str(folder)], capsys)
    assert_one_line_error(code, err, "FancyNewForCausalLM", "LlamaForCausalLM")


def test_gguf_unsupported_tensor_type(tmp_path, capsys):
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, types={"ffn_up": Q.Q8_1})
    code, _, err = run_cli(["generate", "hi", "--model", str(path)], capsys)
    assert_one_line_error(code, err, "Q8_1")


def test_prompt_longer_than_context(tmp_path, capsys):
    folder = write_tiny_folder(tmp_path / "m", max_pos=32)
    code, _, err = run_cli(["generate", "hello " * 40, "--model", str(folder), "--no-chat-template"], capsys)
    # this folder has no tokenizer: that is reported first, as one line
    assert_one_line_error(code, err, "tokenizer")
    from eaglespec import api
    from eaglespec.errors import RequestError

    engine = api.load(str(folder), draft=None)
    with pytest.raises(RequestError, match="the prompt has 40 tokens but the model's context is 32 tokens"):
        engine.generate([list(range(40))])


def test_prompt_longer_than_context_cli(capsys):
    code, _, err = run_cli(["generate", "word " * 9000, "--no-chat-template"], capsys)
    assert_one_line_error(code, err, "context is 8192 tokens")


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--top-k", "-3"], "top_k must be >= 0"),
    (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["--repetition-penalty", "0"], "repetition_penalty must be > 0 (got 0.0); 1 turns it off"),
    (["--frequency-penalty", "3"], "frequency_penalty must be between -2 and 2 (got 3.0)"),
    (["--min-p", "2"], "min_p must be between 0 and 1 (got 2.0)"),
    (["--steps", "3", "--topk", "2", "--draft-tokens", "9"], "between 1 and 1 + steps*topk = 7"),
    (["--spec", "3,2,9"], "between 1 and 1 + steps*topk = 7"),
    (["--spec", "3,1"], "--spec takes S,K,D"),
    (["--spec", "1:3,1,4/x:4,2,8"], "a schedule ROWS:S,K,D/ROWS:S,K,D/..."),
    (["--spec", "3,1,4", "--steps", "2"], "--spec and --steps/--topk/--draft-tokens exclude each other"),
])
def test_bad_sampling_and_spec_parameters(args, needle, capsys):
    code, _, err = run_cli(["generate", "hi", *args], capsys)
    assert_one_line_error(code, err, needle)


def test_convert_then_generate_from_folder(tmp_path, capsys, smollm2_gguf):
    out_dir = tmp_path / "hf"
    code, _, _ = run_cli(["convert", str(smollm2_gguf), str(out_dir)], capsys)
    assert code == 0 and (out_dir / "config.json").exists() and (out_dir / "tokenizer.json").exists()
    code, out, _ = run_cli(["generate", "What is the capital of France?", "--model", str(out_dir),
                            "--max-new-tokens", "8", "--no-spec"], capsys)
    assert code == 0 and "Paris" in out


def test_check_folder(tmp_path, capsys):
    folder = write_tiny_folder(tmp_path / "m")
    code, out, _ = run_cli(["check", str(folder)], capsys)
    assert code == 0 and "LlamaForCausalLM implements the EAGLE-3 target protocol" in out


def test_generate_reports_the_shape_its_kind_of_step_took(capsys, monkeypatch):
    """A schedule with other shapes for sampled steps and plain decoding under penalties: `generate` names the shape
    its request's steps took, and none where they decoded plainly."""
    cpu_forward_cost(monkeypatch, 1.0)
    spec = "2,2,4;sampled=2,1,3;penalized=plain"
    base = ["generate", "What is the capital of France?", "--max-new-tokens", "6", "--spec", spec]
    code, out, err = run_cli(base, capsys)
    assert code == 0 and "(S=2 K=2 D=4)" in err
    code, out, err = run_cli(base + ["--temperature", "0.8", "--seed", "1"], capsys)
    assert code == 0 and "(S=2 K=1 D=3)" in err
    code, out, err = run_cli(base + ["--repetition-penalty", "1.2"], capsys)
    assert code == 0 and "accept length" not in err and "tok/s" in err
