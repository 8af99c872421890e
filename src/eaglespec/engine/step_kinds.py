"""Names a runner step goes by: the rows it runs on (`Rows`), and the step kinds of speculation shapes ("spec",
"spec1", ...: `spec_kind(index)`, `shape_index(kind)`) by which the engine asks for a step and the graph cache keys
its graphs."""

from __future__ import annotations

from typing import Union

import torch

# the rows a step runs on: an index tensor (eager steps: any rows), or slice(0, B) (the graph phases: rows 0..B-1,
# read and written through views of the per-row state, where an index tensor costs a gather kernel per read)
Rows = Union[torch.Tensor, slice]


def spec_kind(index: int) -> str:
    """The step kind of speculation shape `index` (`ModelRunner.shapes`): "spec", "spec1", ..."""
    return "spec" if index == 0 else f"spec{index}"


def shape_index(kind: str) -> int:
    return int(kind[4:] or 0)
