"""A launched step whose results the host has not read yet, and the asynchronous copies that bring them to the host.

The overlapped engine enqueues a step (or a prefill), then the copy of its results into a pinned host buffer and an
event, and reads them later (`ModelRunner.collect` / `collect_prefill`), once it has launched the next step. The
copy goes into a contiguous view of the buffer's first elements (`contiguous_prefix`): into a strided view it would
be synchronous. `ResultBuffers` owns those pinned buffers and makes the `PendingStep`s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class PendingStep:
    """A launched step (decode or speculative, or a prefill's first tokens) whose results the host has not read yet."""

    rows: list[int]
    tokens: torch.Tensor  # host copy (pinned on CUDA), valid once `event` completed: [B] decode, [B, S+1] spec
    accepted: torch.Tensor | None  # spec: [B] accepted draft counts m
    event: "torch.cuda.Event | None"
    steps: int = 0  # spec: S of the shape the step ran (its drafter forwards, for the statistics)
    # with lp: the packed log-probability rows (layers/logprobs.py), host copy: [rows 0..n-1, S+1, W] for a step (read
    # by row), [B, 1, W] for a prefill (in its prompts' order)
    logprobs: torch.Tensor | None = None


def contiguous_prefix(buffer: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """A contiguous view of `shape` over the first elements of `buffer`'s storage (a pinned host buffer sized for the
    widest step): a device-to-host copy into a strided view (say [B, S+1] columns of a [rows, envelope S+1] buffer,
    for a shape narrower than the engine's widest) goes through a temporary and is not asynchronous, which cost the
    overlap of host and device on every such step (H200, session 21: a 32-row schedule of S1 and S3 steps ran 0.34
    ms per step slower than S1 alone)."""
    return buffer.view(-1)[: math.prod(shape)].view(shape)


def copy_to_host(buffer: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """`t` copied, without waiting, into the first elements of the pinned `buffer` (`contiguous_prefix`): the view
    is valid once an event recorded after this call has completed."""
    return contiguous_prefix(buffer, t.shape).copy_(t, non_blocking=True)


def recorded_event() -> torch.cuda.Event:
    """An event recorded now on the current stream: the host waits on it for what was enqueued before it."""
    event = torch.cuda.Event()
    event.record()
    return event


class ResultBuffers:
    """The pinned host buffers that launched steps' results are copied into, sized for `rows` rows of up to `width`
    tokens (the widest shape's S+1) and, with `lp_width`, their packed log-probability rows of that width.

    Two sets for steps, alternated (with overlap, the one in flight's and the one being launched's), and one for a
    launched prefill (read before any later prefill is launched). Without CUDA (the CPU's static path, tests) there is
    nothing to wait for: results are cloned and the `PendingStep`s carry no event."""

    def __init__(self, rows: int, width: int, lp_width: int | None, cuda: bool) -> None:
        def pinned(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, pin_memory=True)

        self.cuda = cuda
        lp = (lambda: pinned(rows, width, lp_width, dtype=torch.float32)) if lp_width is not None else (lambda: None)
        self._steps = [(pinned(rows, width), pinned(rows), lp()) for _ in range(2)] if cuda else []
        self._next = 0
        self._prefill = (pinned(rows), lp()) if cuda else None

    def step(self, rows: list[int], tokens: torch.Tensor, accepted: torch.Tensor | None,
             logprobs: torch.Tensor | None, steps: int, columns: int | None = None) -> PendingStep:
        """A launched step's results (tokens [n] or [n, S+1], accepted [n] or None, logprobs [n, S+1, W] or None, over
        rows 0..n-1 of the graphs' static outputs), copied before any later replay can overwrite them. `columns`:
        the packed rows' columns the step wrote (1 + 2k of W): the host's view keeps only those (a column slice
        of the device buffer would make the copy synchronous; of the host copy it is free, and what the host reads
        into Python is 1 + 2k floats a token, not W)."""
        if not self.cuda:
            pending = PendingStep(rows, tokens.clone(), _clone(accepted), None, steps, logprobs=_clone(logprobs))
        else:
            pt, pm, plp = self._steps[self._next]
            self._next ^= 1
            host_m = copy_to_host(pm, accepted) if accepted is not None else None
            host_lp = copy_to_host(plp, logprobs) if logprobs is not None else None
            pending = PendingStep(rows, copy_to_host(pt, tokens), host_m, recorded_event(), steps, logprobs=host_lp)
        if pending.logprobs is not None and columns is not None:
            pending.logprobs = pending.logprobs[..., :columns]
        return pending

    def prefill(self, rows: list[int], tokens: torch.Tensor, logprobs: torch.Tensor | None) -> PendingStep:
        """A launched prefill's first tokens [B] (and their log-probability rows [B, 1, W]), in its prompts' order."""
        if not self.cuda:
            return PendingStep(rows, tokens.clone(), None, None, logprobs=_clone(logprobs))
        pt, plp = self._prefill
        host_lp = copy_to_host(plp, logprobs) if logprobs is not None else None
        return PendingStep(rows, copy_to_host(pt, tokens), None, recorded_event(), logprobs=host_lp)


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.clone() if t is not None else None
