"""Files shipped inside the package: the trained EAGLE-3 drafter of the embedded default model, and the policy for
using it.

`draft="auto"` on the embedded model speculates with the shipped drafter in the shape
`default_spec(device_type, max_batch_size)` gives, a measured choice per device type and engine size
(docs/benchmarks.md, "The shipped drafter"), and decodes plainly where every measured shape was slower than plain
decoding (`default_spec` returns None; `slower_note` says what was measured).
An explicit shape (`--steps/--topk/--draft-tokens`, `api.load(spec=...)`) always speculates.
"""

from __future__ import annotations

from pathlib import Path

from .config import SpecConfig

ASSETS = Path(__file__).parent / "assets"
DEFAULT_DRAFTER = ASSETS / "smollm2-135m-eagle3"

# Measured with `eaglespec bench` on MT-bench first turns, greedy (docs/benchmarks.md): on this project's 2-core CPU a
# forward of up to 3 tokens costs about one of 1 token (4 cost 1.5x: MKL leaves its small-M path), so the one-step
# chain (2 tokens) pays at batch 1 (1.10x) but not with 2 rows (4 tokens per step: 68 vs 44 ms, step_anatomy.py):
# engines of one row only. On the H200 every measured shape was slower than plain decoding (float32).
_DEFAULT_SPEC: dict[str, SpecConfig | None] = {"cpu": SpecConfig(steps=1, topk=1, draft_tokens=2), "cuda": None}
_ONE_ROW_ONLY = {"cpu"}
_SLOWER: dict[str, str] = {"cuda": "0.91x with a chain of 3, 0.78x with a 48-token tree on an H200 in float32",
                           "cpu": "with several rows a step verifies 4+ tokens, 1.5x a plain step on the CPU"}


def default_drafter_path() -> Path | None:
    """The shipped drafter for the embedded SmolLM2, or None when this build carries none."""
    return DEFAULT_DRAFTER if (DEFAULT_DRAFTER / "config.json").exists() else None


def default_spec(device_type: str, max_batch_size: int = 1) -> SpecConfig | None:
    """The shape `draft="auto"` speculates with on this device type for an engine of this many rows; None: plain
    decoding is faster there."""
    if device_type in _ONE_ROW_ONLY and max_batch_size > 1:
        return None
    return _DEFAULT_SPEC.get(device_type)


def slower_note(device_type: str) -> str:
    """What was measured where the shipped drafter is not used by default (for the CLI's one-line explanation)."""
    return _SLOWER.get(device_type, f"not measured on {device_type}")
