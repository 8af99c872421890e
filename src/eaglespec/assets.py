"""Files shipped inside the package: the trained EAGLE-3 drafter of the embedded default model."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
DEFAULT_DRAFTER = ASSETS / "smollm2-135m-eagle3"


def default_drafter_path() -> Path | None:
    """The shipped drafter for the embedded SmolLM2, or None when this build carries none."""
    return DEFAULT_DRAFTER if (DEFAULT_DRAFTER / "config.json").exists() else None
