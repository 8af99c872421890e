"""Files shipped inside the package: the trained EAGLE-3 drafter of the embedded default model, and the policy for
using it.

`draft="auto"` on the embedded model speculates with the shipped drafter in the shape `default_spec(device_type)`
gives, a measured choice per device type (docs/benchmarks.md, "The shipped drafter"), and decodes plainly where every
measured shape was slower than plain decoding (`default_spec` returns None; `slower_note` says what was measured).
An explicit shape (`--steps/--topk/--draft-tokens`, `api.load(spec=...)`) always speculates.
"""

from __future__ import annotations

from pathlib import Path

from .config import SpecConfig

ASSETS = Path(__file__).parent / "assets"
DEFAULT_DRAFTER = ASSETS / "smollm2-135m-eagle3"

# Measured with `eaglespec bench` on MT-bench first turns, greedy (docs/benchmarks.md): on this project's 2-core CPU a
# verification of up to 3 tokens costs about one decode step (a 4-token one 1.5x: MKL leaves its GEMV path), and the
# one-step chain was the fastest shape; on the H200 every measured shape was slower than plain decoding.
_DEFAULT_SPEC: dict[str, SpecConfig | None] = {"cpu": SpecConfig(steps=1, topk=1, draft_tokens=2), "cuda": None}
_SLOWER: dict[str, str] = {"cuda": "0.91x with a chain of 3, 0.78x with a 48-token tree on an H200"}


def default_drafter_path() -> Path | None:
    """The shipped drafter for the embedded SmolLM2, or None when this build carries none."""
    return DEFAULT_DRAFTER if (DEFAULT_DRAFTER / "config.json").exists() else None


def default_spec(device_type: str) -> SpecConfig | None:
    """The shape `draft="auto"` speculates with on this device type; None: plain decoding is faster there."""
    return _DEFAULT_SPEC.get(device_type)


def slower_note(device_type: str) -> str:
    """What was measured where the shipped drafter is not used by default (for the CLI's one-line explanation)."""
    return _SLOWER.get(device_type, f"not measured on {device_type}")
