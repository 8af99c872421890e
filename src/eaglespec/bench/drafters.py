"""The drafters a benchmark can speculate with, by name: a checkpoint folder, `oracle` or `random`.

Contract:
- `DrafterPool(target, device, dtype, seed, fuse, compile).get(kind)` -> a drafter module, built once per kind and
  shared by the runs (an engine wires it to the target each time), with the engine's inference transforms applied:
  `random` is `random_model.random_drafter` (a lower bound), a path is loaded with `api.load_drafter`.
- `oracle(target_config, rows, longest)` -> an `OracleDrafter` sized for one run; before each static batch the run
  calls its `set_references` with the reference sequences (prompt ids + the baseline's greedy output) of that
  batch, row i of the batch being cache row i.
- `references(prompt_ids, outputs, finished_by_eos, eos_ids)` builds those sequences; a single EOS id is appended
  after an output that stopped on EOS, so that the oracle also proposes the end.
- `verify_step_seconds(target, prompt, reference, spec, config, new_tokens)`: one verify step's mean time with an
  oracle chain or tree at batch 1 (benchmarks compare it with a decode step);
- `decode_step_seconds(target, prompt, config, new_tokens)`: one plain decode step's mean time at batch 1 and the
  tokens generated (the baseline of that comparison, and the oracle's reference).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..spec.oracle import OracleDrafter

ORACLE, RANDOM = "oracle", "random"


def drafter_label(kind: str) -> str:
    return kind if kind in (ORACLE, RANDOM) else f"draft:{Path(kind).name}"


def is_oracle(drafter: nn.Module | None) -> bool:
    return isinstance(drafter, OracleDrafter)


def oracle(target_config: ModelConfig, rows: int, longest: int) -> OracleDrafter:
    """An oracle with room for `rows` references of up to `longest` tokens (its table never grows afterwards, so
    CUDA graphs captured over it stay valid)."""
    return OracleDrafter(target_config, [[0] * longest] * rows)


def references(prompt_ids: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], stopped: Sequence[bool],
               eos_ids: Sequence[int]) -> list[list[int]]:
    tail = [int(eos_ids[0])] if len(eos_ids) == 1 else []
    return [list(p) + list(o) + (tail if s else []) for p, o, s in zip(prompt_ids, outputs, stopped)]


class DrafterPool:
    def __init__(self, target: nn.Module, device: torch.device, dtype: torch.dtype, seed: int = 0,
                 fuse: bool | None = None, compile: bool | None = None) -> None:
        self.target, self.device, self.dtype, self.seed = target, device, dtype, seed
        self.fuse, self.compile = fuse, compile  # EngineConfig's inference transforms, as api.load applies them
        self._built: dict[str, nn.Module] = {}

    def get(self, kind: str) -> nn.Module:
        if kind not in self._built:
            self._built[kind] = self._build(kind)
        return self._built[kind]

    def _build(self, kind: str) -> nn.Module:
        from ..engine.transforms import prepare_for_inference

        assert kind != ORACLE, "an oracle is built per run (drafters.oracle)"
        if kind == RANDOM:
            from .random_model import random_drafter

            d = random_drafter(self.target.config, self.device, self.dtype, self.seed)
        elif not Path(kind).exists():
            raise ConfigError(f"--draft {kind!r} is neither 'oracle', 'random' nor an existing drafter folder")
        else:
            from ..api import load_drafter

            d = load_drafter(kind, self.device, self.dtype)
        return prepare_for_inference(d, self.device, self.fuse, self.compile)


def verify_step_seconds(target: nn.Module, prompt: Sequence[int], reference: Sequence[int], spec, config,
                        new_tokens: int) -> float:
    """Mean time of one verify step (graphs and the phase timer as configured) when an oracle drafter proposes
    `reference` (prompt + the target's own greedy continuation) with `spec`, generating `new_tokens` after `prompt`
    (ignore_eos) at batch 1: the verify-vs-decode ratio of issue 4's targets. bf16 near-ties may end the oracle's
    runs early, which does not change a verify step's cost."""
    from ..engine.engine import Engine
    from ..sampling_params import SamplingParams

    d = OracleDrafter(target.config, [list(reference)], capacity=len(reference) + 64)
    e = Engine(target, None, config, drafter=d, spec=spec)
    e.reserve(1, len(prompt) + new_tokens + 64)
    e.warmup([1])
    e.generate([list(prompt)], SamplingParams(max_new_tokens=8, ignore_eos=True))
    e.stats.__init__()
    e.runner.timer.enabled = True
    e.runner.timer.reset()
    e.generate([list(prompt)], SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
    return e.runner.timer.totals()["verify"] / max(e.stats.verify_steps, 1)


def decode_step_seconds(target: nn.Module, prompt: Sequence[int], config, new_tokens: int) -> tuple[float, list[int]]:
    """Mean time of one plain decode step at batch 1 by the engine's phase timer, generating `new_tokens` after
    `prompt` (ignore_eos), and the generated ids. Timed without overlap (`config.overlap` is replaced): an overlapped
    step is launched and read apart, so its timer would not bracket it."""
    from dataclasses import replace

    from ..engine.engine import Engine
    from ..sampling_params import SamplingParams

    e = Engine(target, None, replace(config, overlap=False))
    e.reserve(1, len(prompt) + new_tokens + 64)
    e.warmup([1])
    e.generate([list(prompt)], SamplingParams(max_new_tokens=8, ignore_eos=True))
    e.runner.timer.enabled = True
    e.runner.timer.reset()
    o = e.generate([list(prompt)], SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))[0]
    return e.runner.timer.totals()["decode"] / max(len(o.token_ids) - 1, 1), list(o.token_ids)
