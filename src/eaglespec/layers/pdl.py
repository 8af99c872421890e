"""Programmatic dependent launch (PDL) for our Triton kernels: the next kernel starts while this one runs.

A batch-1 step of a small model is a chain of ~200 kernels of 1-4 us each (SmolLM2-135M: 7 per layer), each of
which, on its own, pays its launch and then a DRAM round trip for its weights before it computes anything. With PDL
(Hopper and later: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, kept by CUDA graph capture as
programmatic edges) a kernel may be scheduled once every program of the kernel before it has started; it then loads
what no kernel of the step writes (its weights) and waits (`griddepcontrol.wait`) for the kernel before it to
complete and flush before it reads anything else.

Contract for a kernel that takes `PDL: tl.constexpr`:
  - first `gdc_launch_dependents()` (lets the next kernel be scheduled), then loads of weights only (never written
    while a step runs), then `gdc_wait()`, and only then any other load or any store. The wait returns when the
    previous kernel has completed, which itself waited for the one before it, so everything earlier in the stream is
    visible after it; a kernel that skipped the wait would race.
  - every program calls `gdc_wait()` (no early exit before it), so that a kernel completes only after its predecessor.
Kernels without PDL (PyTorch's, cuBLAS) keep full stream order: they start after everything before them completes,
and a PDL kernel after one of them starts early only by its launch, not by its body.

`launch_options(t, allow=True) -> dict`: the keyword arguments for a launch whose tensors live on t's device:
`{"PDL": True, "launch_pdl": True}` on CUDA devices of compute capability >= 9 when enabled and `allow`ed (a module's
own switch for the benchmarks' A/B), else `{"PDL": False}` (CPU, the interpreter of the CPU tests, older GPUs).
Enabled unless `ENABLED` is set False or the environment holds `EAGLESPEC_PDL=0` (read once, at the first launch):
the GPU benchmarks compare both in one process by setting ENABLED before they build an engine (a captured graph keeps
what it captured).
`interpreted()`: whether Triton's interpreter runs the kernels (the kernels' launchers ask it too).
"""

from __future__ import annotations

import functools
import os

import torch

ENABLED: bool | None = None  # None: from EAGLESPEC_PDL (default on); set True / False to override (benchmarks)


@functools.cache
def _env_enabled() -> bool:
    return os.environ.get("EAGLESPEC_PDL", "1") != "0" and not interpreted()


@functools.cache
def _supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """Whether launches on `device` use PDL (policy only: no launch here)."""
    if device.type != "cuda":
        return False
    on = _env_enabled() if ENABLED is None else ENABLED
    return on and _supports(device.index if device.index is not None else torch.cuda.current_device())


_ON = {"PDL": True, "launch_pdl": True}
_OFF = {"PDL": False}


def launch_options(t: torch.Tensor, allow: bool = True) -> dict:
    return _ON if allow and enabled(t.device) else _OFF


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (`TRITON_INTERPRET=1`: the CPU tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
