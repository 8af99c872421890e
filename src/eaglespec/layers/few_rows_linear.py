"""An nn.Linear that projects steps of a few rows through a Triton kernel: the few-row kernel of small (bias-free)
layers, or the GEMV kernel of wide ones (with or without a bias).

At batch 1 a small model's o_proj and down_proj are ~1 MB GEMVs that cuBLAS runs in ~4 us on the H200 (SmolLM2-135M:
60 of them per decode step, 245 of its 756 us; `benchmarks/decode_profile.py`, 2026-11-30), bound by the kernel's
latency, not by bytes; a large model's 4096-wide o_proj and q/k/v cuBLAS reads at only 2.5-3.2 TB/s.
`FewRowsLinear.forward(x)`: x [..., K] -> [..., N], through its `kernel` (`norm_linear_kernel.linear_rows` by default,
`gemv_kernel.gemv_rows` for wide layers) when x holds at most `max_rows` rows, else F.linear; the same weight (and
bias) Parameters either way (state-dict names and values unchanged). A bias goes to the kernel as `bias=`: only
kernels in BIASED_KERNELS take one. Built by `engine.transforms.use_linear_rows_kernel` /
`use_gemv_kernel` from an existing nn.Linear (the policy of which layers and how many rows lives there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from typing import Callable

from .gemv_kernel import gemv_rows
from .norm_linear_kernel import linear_rows

RowsKernel = Callable[..., torch.Tensor]  # (x [..., K], weight [N, K][, bias=[N]]) -> [..., N]
BIASED_KERNELS = (gemv_rows,)  # the kernels that add a `bias=` [N] to their float32 sums


class FewRowsLinear(nn.Linear):
    max_rows: int = 0
    kernel: RowsKernel = staticmethod(linear_rows)

    @classmethod
    def wrap(cls, linear: nn.Linear, max_rows: int, kernel: RowsKernel | None = None) -> "FewRowsLinear":
        assert linear.bias is None or kernel in BIASED_KERNELS, "FewRowsLinear: this kernel takes no bias"
        m = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        m.weight = linear.weight  # the same Parameter: nothing copied, the checkpoint name kept
        m.bias = linear.bias
        m.max_rows = max_rows
        if kernel is not None:
            m.kernel = kernel
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= self.max_rows * x.shape[-1]:
            return self.kernel(x, self.weight) if self.bias is None else self.kernel(x, self.weight, bias=self.bias)
        return F.linear(x, self.weight, self.bias)
