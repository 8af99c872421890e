"""A launched step whose results the host has not read yet, and the asynchronous copies that bring them to the host.

The overlapped engine enqueues a step (or a prefill), then the copy of its results into a pinned host buffer and an
event, and reads them later (`ModelRunner.collect` / `collect_prefill`), once it has launched the next step. The
copy goes into a contiguous view of the buffer's first elements (`contiguous_prefix`): into a strided view it would
be synchronous.
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
