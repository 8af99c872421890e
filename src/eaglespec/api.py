"""The Python API, the same path the CLI takes.

    engine = eaglespec.load()                                   # embedded SmolLM2 (+ its shipped drafter)
    engine = eaglespec.load("path/to/model", draft="path/to/eagle3", spec=SpecConfig(5, 4, 16))
    outs = engine.generate(["What is the capital of France?"], SamplingParams(max_new_tokens=64))

`draft="auto"` (the default) speculates with the shipped drafter when the model is the embedded default (None, or a path
to its GGUF or a copy of it) and plainly otherwise; without an explicit `spec` it takes the measured shapes of
`assets.default_spec` for the device, the engine's rows (on the CPU: one-row engines, as `eaglespec generate` builds; a
`SpecSchedule` where the shapes measured differ by rows, each step the shape of the rows it runs) and the dtype (greedy
float32 on CUDA: the chain of 3 up to 32 rows, where bf16 takes the chain of 4 at 1 and 9-12 rows, trees at 2-8 and
17-32 rows and the chain of 3 at 13-16), greedy steps and sampled steps each their own (sampled: the chain of 2 in
one-row CPU engines (the one-step chain first where `only` samples unfiltered at temperature 1 or hotter:
`assets.hot_sampling`), on CUDA the chain of 3 up to 32 rows; `SpecSchedule.sampled`; steps under count penalties decode
plainly on CUDA: `SpecSchedule.penalized`). It decodes plainly where the drafter was measured slower than plain decoding
at the `temperature` the engine is meant to serve; on the CPU it first times the target's forwards on this machine
(`engine/verify_cost.py`): greedy steps take the shape among S3 K2 D6, S2 K2 D4 and S2 K1 D3 that a cost model
over those timings rates fastest, sampled ones the first of their chains whose forward is cheap enough, and it decodes
plainly where its mode's shapes do not pay (`assets.cpu_choice`; `auto_spec` makes that choice; the engine's
`plain_note` then says why; the other mode's steps decode plainly, or take the sampled shapes, where theirs fail).
`spec` may be a SpecConfig or a SpecSchedule.
`EngineConfig(cpu_weights="q4")`: the 4-bit CPU path (engine/int4_weights.py: the target loaded in float32, its GGUF
4-bit groups multiplied as stored, bf16 activations, lossless speculation), where `auto`'s greedy steps choose among
the chains of 1-3 by the path's own cost model over forwards timed as verifies (`assets.INT4_GREEDY`) and its sampled
steps decode plainly (`assets.INT4_SAMPLED_NOTE`).
`draft=None` never speculates; a path loads that EAGLE-3 drafter checkpoint (the shipped drafter's folder, or a copy
of it, without `spec`: the shapes `auto` takes, on the CPU timed, but speculating where `auto` would decode plainly).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .config import EngineConfig, SpecConfig

from .spec_schedule import SpecSchedule
from .engine.engine import Engine
from .engine.int4_weights import int4_mode, on_int4_path
from .engine.target_load import load_target
from .engine.transforms import prepare_for_inference
from .errors import ConfigError
from .loading.checkpoint import load_model, resolve_device, resolve_dtype
from .assets import (CPU_GREEDY, INT4_GREEDY, INT4_SAMPLED_NOTE, PENALIZED_NOTE, cpu_choice, cpu_sizes,
                     default_drafter_path, default_spec, hot_sampling, is_default_drafter, mode_entries,
                     penalized_entries, schedule_of, slower_note)
from .loading.default import is_default_model
from .sampling_params import SamplingParams
from .engine.verify_cost import record_path, verify_cost_ratios


def load_drafter(path: str | Path, device: torch.device | str, dtype: torch.dtype) -> torch.nn.Module:
    """An EAGLE-3 drafter checkpoint (config.json with LlamaForCausalLMEagle3 + safetensors)."""
    loaded = load_model(path, device=device, dtype=dtype)
    if loaded.config.eagle is None:
        raise ConfigError(
            f"{path} is not an EAGLE-3 drafter (its architectures is {loaded.config.architecture!r}, "
            "expected LlamaForCausalLMEagle3)"
        )
    return loaded.model


def spec_rows(max_batch_size: int, spec_max_rows: int | None) -> int:
    """The most rows a speculative step of such an engine runs (EngineConfig.spec_max_rows caps them)."""
    return min(max_batch_size, spec_max_rows or max_batch_size)


def auto_spec(target: torch.nn.Module, device_type: str, max_batch_size: int = 1, temperature: float = 0.0,
              spec_max_rows: int | None = None, only: SamplingParams | None = None, speculate: bool = False
              ) -> tuple[SpecConfig | SpecSchedule | None, str | None]:
    """What `draft="auto"` speculates with on the shipped drafter for an engine of `max_batch_size` rows on this device
    type in `target`'s dtype, built for steps at this temperature (greedy and sampled steps each take their mode's
    shapes, steps under count penalties theirs: `assets.schedule_of`): (`assets.default_spec`'s shape or schedule, on
    the CPU the shapes its timing chose, None), or (None, why not) where plain decoding is the choice for the engine's
    temperature: measured slower there (`assets.slower_note`), or, on the CPU, where the mode's shapes do not pay for
    the forwards of their draft tokens timed on this machine against one-token ones (`assets.cpu_sizes`,
    `assets.cpu_choice`; one timing of every size both modes need, `target` prepared as the engine runs it; the other
    mode's steps are chosen the same way, and decode plainly where theirs fail). With `spec_max_rows` (EngineConfig) no
    speculative step runs more rows than that, so the choice is the one for that many rows.
    `only`: the steps of requests with these parameters alone (a bench run's, all alike; the engine built for their
    temperature): the other modes are neither timed nor scheduled, and (None, why) where such steps decode plainly.
    `load` and `eaglespec bench --spec auto` both take it. `speculate` (the shipped drafter named by the user): on the
    CPU each mode takes its best timed shape where the policy would decode plainly (`assets.cpu_choice`). A target on
    the 4-bit CPU path times its forwards as verifies and takes its own greedy cost model (`assets.INT4_GREEDY`);
    its sampled steps decode plainly (`assets.INT4_SAMPLED_NOTE`), unless `speculate`."""
    if only is not None:
        temperature = only.temperature
    greedy, sampled = mode_entries(device_type, spec_rows(max_batch_size, spec_max_rows),
                                   next(target.parameters()).dtype)
    # the 4-bit CPU path: its own greedy cost model over forwards timed as verifies; sampled steps plain (assets)
    int4 = device_type == "cpu" and on_int4_path(target)
    if int4 and not speculate and sampled is not None:
        if temperature > 0:
            return None, INT4_SAMPLED_NOTE
        sampled = None
    penalized = penalized_entries(device_type)
    if only is not None:
        if only.penalized and penalized == ():
            return None, PENALIZED_NOTE
        penalized = None
    if schedule_of(greedy, sampled, temperature) is None:
        return None, slower_note(device_type)
    own = temperature > 0  # the engine's own mode: sampled?
    if device_type == "cpu":  # the CPU's premise (a few-token forward costs about a 1-token one) is measured
        modes = {False: greedy, True: sampled}  # sampled? -> entries
        timed = [m for m in (own, not own) if modes[m] is not None and (only is None or m == own)]
        cost_model = INT4_GREEDY if int4 else CPU_GREEDY
        sizes = {n for m in timed for n in cpu_sizes(modes[m], m, cost_model)}
        # this machine's, kept (`record_path`)
        ratios = verify_cost_ratios(target, sizes, record=record_path(), as_verify=int4) if timed else {}
        for mode in timed:  # the engine's own mode first
            hot = mode and only is not None and hot_sampling(only)  # unfiltered at T >= 1: the one-step chain first
            entries, note = cpu_choice(modes[mode], mode, ratios, hot, speculate, cost_model)
            if entries is None and mode == own:  # the engine's own steps lose: it decodes plainly
                return None, note
            modes[mode] = entries
        greedy, sampled = modes[False], modes[True]
    if only is not None:
        greedy = sampled = sampled if own else greedy
    return schedule_of(greedy, sampled, temperature, penalized), None


def load(
    model: str | Path | None = None,
    draft: str | Path | None = "auto",
    spec: SpecConfig | SpecSchedule | None = None,
    config: EngineConfig = EngineConfig(),
    temperature: float = 0.0,
    only: SamplingParams | None = None,
) -> Engine:
    """Load a target (None: the embedded default) and, optionally, its drafter, and build an engine. `temperature`
    only informs `draft="auto"`'s choice of whether to speculate (requests still carry their own sampling parameters,
    and each step takes the shapes of its mode, greedy or sampled), which is made for the most rows a speculative
    step runs: `max_batch_size`, or `spec_max_rows` where that is smaller. `only`: the parameters every request will
    carry (`eaglespec generate`, `chat`): `auto` schedules their kind of step alone (`auto_spec`; `temperature` is
    theirs), and on the CPU times no other."""
    if only is not None:
        temperature = only.temperature
    # (EngineConfig refuses q4 with another device)
    device = resolve_device("cpu" if config.cpu_weights == "q4" else config.device)
    # True, None (where the weights allow), False
    int4 = int4_mode(config.cpu_weights, device, config.dtype, config.compile, config.max_batch_size)
    dtype_name = config.dtype if config.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    loaded = load_target(model, device, dtype_name, config.fuse_projections, config.compile, int4)  # before the timing
    dtype = next(loaded.model.parameters()).dtype
    draft_path: Path | None
    plain_note = None  # why draft="auto" decodes plainly (measured slower here, or this machine's forwards timed)
    timing_s = 0.0  # seconds auto_spec spent timing this CPU's forwards

    def timed_auto_spec(speculate: bool) -> tuple[tuple[SpecConfig | SpecSchedule | None, str | None], float]:
        """`auto_spec` for this engine, and the seconds it spent timing this CPU's forwards (0 elsewhere: it times
        nothing there)."""
        t0 = time.perf_counter()
        chosen = auto_spec(loaded.model, device.type, config.max_batch_size, temperature, config.spec_max_rows, only,
                           speculate)
        return chosen, time.perf_counter() - t0 if device.type == "cpu" else 0.0

    if draft == "auto":
        # the embedded model, however it was named (its GGUF anywhere: loading.default.is_default_model)
        embedded = model is None or is_default_model(model)
        draft_path = default_drafter_path() if embedded else None
        if draft_path is not None and spec is None:
            (spec, plain_note), timing_s = timed_auto_spec(speculate=False)
            if spec is None:
                draft_path = None
    else:
        draft_path = Path(draft) if draft is not None else None
        if spec is None and draft_path is not None and is_default_drafter(draft_path):
            # the shipped drafter named by the user: `auto`'s shapes, on the CPU timed as `auto` times them, but asked
            # for, it speculates where `auto` would decode plainly; where no shape was measured for this engine (or its
            # steps all run under count penalties), `default_spec`'s schedule or SpecConfig's default
            if device.type == "cpu":
                (spec, _), timing_s = timed_auto_spec(speculate=True)
            if spec is None:
                spec = default_spec(device.type, spec_rows(config.max_batch_size, config.spec_max_rows), temperature,
                                    dtype)
    drafter = load_drafter(draft_path, device, dtype) if draft_path is not None else None
    if drafter is not None:
        prepare_for_inference(drafter, device, config.fuse_projections, config.compile)
    engine = Engine(loaded.model, loaded.tokenizer, config, drafter=drafter, spec=spec)
    engine.plain_note = plain_note
    engine.cpu_timing_s = timing_s
    return engine


__all__ = ["auto_spec", "load", "load_drafter", "resolve_device", "resolve_dtype"]
