"""An nn.Linear for the CPU that computes its product weight-major: y^T = W x^T, one GEMM with the weight as the
left operand, instead of F.linear's x W^T.

Why: on the 2-core AMD EPYC of session 19 (torch 2.13.0+cpu, MKL 2024.2, AVX2) F.linear's GEMM costs about M times
its one-row cost for M = 1..4 rows, as if each row read the weights anew (SmolLM2's 3,072 x 576 gate/up over 30 cold
copies: 0.68 / 1.55 / 1.66 / 1.54 ms at 1 / 2 / 3 / 4 rows; the 49,152 x 576 lm_head 11.0 / 20.5 / 29.6 / 33.9 ms),
while the same product with W on the left stays near the weights' read time (0.50 / 0.50 / 0.63 / 0.52 ms; lm_head
7.6 / 7.6 / 9.8 / 7.7 ms), and wins at every row count measured up to 512 (prefills). Even row counts are its fast
ones: 1 and 3 rows cost more than 2 and 4, so they are padded to 2 and 4 (`PAD_ROWS`; the padding rows repeat the
first rows and are dropped). Speculation on the CPU rests on this: a verify of 3-4 tokens must cost about one decode
step (docs/benchmarks.md, "The shipped drafter", session 19).

`CpuLinear.forward(x)`: x [..., K] -> [..., N] (contiguous), the same function as nn.Linear up to floating-point
reassociation, the same weight (and bias) Parameter (state-dict names and values unchanged). Built by
`engine.transforms.use_cpu_linear` from an existing nn.Linear.
"""

from __future__ import annotations

import torch
from torch import nn

PAD_ROWS = {1: 2, 3: 4}  # rows -> rows computed (measured above: the odd counts' GEMMs cost more than the next even's)


def weight_major_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K]^T (+ bias [N]) -> [..., N], computed as weight @ x^T."""
    rows = x.reshape(-1, x.shape[-1])  # [M, K]
    m = rows.shape[0]
    pad = PAD_ROWS.get(m, m)
    if pad != m:
        rows = torch.cat((rows, rows[: pad - m]))  # [pad, K]
    y = torch.mm(weight, rows.t())[:, :m].t().contiguous()  # [N, pad] -> [M, N]
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


class CpuLinear(nn.Linear):
    @classmethod
    def wrap(cls, linear: nn.Linear) -> "CpuLinear":
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        m.weight = linear.weight  # the same Parameters: nothing copied, the checkpoint names kept
        if linear.bias is not None:
            m.bias = linear.bias
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return weight_major_linear(x, self.weight, self.bias)
