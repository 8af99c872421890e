"""An nn.Linear for the CPU: its product weight-major (y^T = W x^T, one GEMM with the weight as the left operand,
instead of F.linear's x W^T) for one and two rows, and through a oneDNN copy of the weight in its blocked layout
(`pack`) from three rows on; bfloat16 weights through that copy at every row count.

Why weight-major: on the 2-core AMD EPYC of session 19 (torch 2.13.0+cpu, MKL 2024.2, AVX2) F.linear's GEMM costs
about M times its one-row cost for M = 1..4 rows, as if each row read the weights anew (SmolLM2's 3,072 x 576
gate/up over 30 cold copies: 0.68 / 1.55 / 1.66 / 1.54 ms at 1 / 2 / 3 / 4 rows; the 49,152 x 576 lm_head 11.0 /
20.5 / 29.6 / 33.9 ms), while the same product with W on the left stays near the weights' read time (0.50 / 0.50 /
0.63 / 0.52 ms; lm_head 7.6 / 7.6 / 9.8 / 7.7 ms). Even row counts are its fast ones: 1 and 3 rows cost more than 2
and 4, so they are padded to 2 and 4 (`PAD_ROWS`; the padding rows repeat the first rows and are dropped).
Why packed from 3 rows: on session 61's 2-core AMD EPYC (AVX-512, the same torch and MKL) the weight-major GEMM of 4
rows cost 1.3-2.3x its 2-row one for some shapes (down_proj 576 x 1,536: 0.106 -> 0.248 ms; a cache-free SmolLM2
forward of 3-4 tokens 1.30x one of 1 token, of 8 tokens 1.96x), while oneDNN's GEMM over a weight reordered once
into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, as PyTorch's inductor freezes CPU linears)
costs about the same from 3 to 8 rows (down_proj 0.112-0.152 ms; the forward of 3-4 tokens 1.14-1.26x, of 8
tokens 1.37-1.43x) and half the weight-major time for prefills (gate/up at 256 rows 10.7 -> 4.8 ms); at 1-2
rows it is ~40% slower than weight-major, so the original weight stays for those (docs/benchmarks.md, "Session
61"). Speculation on the CPU rests on this: a verify of D tokens must cost about one decode step. In bfloat16
(`--dtype bfloat16`) on a CPU with AVX-512 BF16 (where `torch.ops.mkldnn._is_mkldnn_bf16_supported()`), the packed
copy wins at every row count (session 61: gate/up 0.16-0.20 ms at 1-8 rows against the weight-major 0.24-0.45,
the lm_head 1.8-2.4 against 4.4-5.6), so bfloat16 projections take it from one row on.

Why measured (session 66): on a 2-core Intel Xeon with AVX-512 and AMX (the same torch) the padded weight-major
product is the slow one: SmolLM2's 121 projections, one cold pass, 1 / 2 rows: weight-major (padded) 75.5 / 76.6 ms,
F.linear 32.2 / 34.1 ms, the packed copy 37.2 / 40.5 (at 3 rows F.linear 39.0 against the copy's 43.0, from 4 rows
the copy: 45.9 against 59.3 at 4), so plain decoding there ran at 13 tok/s instead of ~25. `direct_rows` times
both products on the model's own weights when it is prepared (`engine.transforms.use_cpu_linear`), and
`CpuLinear.direct_rows` > 0 takes F.linear where the packed copy does not serve.
Why F.linear at 3 rows there too (session 67, the same Intel Xeon; `benchmarks/cpu_linear_check.py`, us): MKL's
F.linear stays near its one-row cost up to 3 rows and jumps at 4 (q/k/v 60 / 70 / 59 / 171 at 1-4 rows, gate/up 341 /
354 / 423 / 614, down_proj 115 / 127 / 135 / 189), so at 3 rows it beat the packed copy (q/k/v 150, gate/up 447,
down_proj 261; from 4 rows the copy: 111 / 447 / 260): SmolLM2's forward of 3 tokens cost 1.15x one of 1 token
against 1.28x, and in one process the sampled chain of 2 (3-token verifies) ran 13% faster (benchmarks/
cpu_direct_rows_ab.py: 37.8 against 33.4 tok/s at temperature 0.7, top-p 0.9). So where
F.linear wins at 1-2 rows, `direct_rows` goes on timing it against the packed copy at 3 rows (DIRECT_MAX_ROWS; its
comment says why not further): where F.linear wins there too, packed copies serve from 4 rows.

`CpuLinear.forward(x)`: x [..., K] -> [..., N] (contiguous), the same function as nn.Linear up to floating-point
reassociation, the same weight (and bias) Parameter (state-dict names and values unchanged). Built by
`engine.transforms.use_cpu_linear` from an existing nn.Linear, which also calls `pack` where the copy fits the
host's memory. The packed copy is a plain attribute (not in the state dict); it is used only while the weight is
the tensor it was made from, unmodified (its data pointer and in-place version), for inputs of the weight's dtype
and without autograd (training steps, or a weight changed in place, take the weight-major product, or F.linear where
`direct_rows` is set; a stale copy is dropped). `measure_direct_rows` sets a model's `direct_rows` at load.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

PAD_ROWS = {1: 2, 3: 4}  # rows -> rows computed (measured above: the odd counts' GEMMs cost more than the next even's)
PACKED = True  # rows >= PACKED_MIN_ROWS through the packed copy where `pack` made one (False: weight-major, A/B runs)
PACKED_MIN_ROWS = 3  # float32; bfloat16 from one row
PACK_HINT_ROWS = 4  # the row count oneDNN's reorder is told to expect (measured the same as 2, 8 and 64 from 3 rows on)
# `direct_rows`: models whose projections hold fewer bytes than this keep the weight-major product unmeasured (their
# weights stay in cache, where the measurement would not speak for decoding; the tests' tiny models); a timing pass
# reads the first MEASURE_BYTES of the projections' weights (past a CPU's last-level cache: decoding reads them cold)
MEASURE_MIN_BYTES = 8 << 20
MEASURE_BYTES = 64 << 20
MEASURE = True  # False: never measured, weight-major at 1-2 rows everywhere (A/B runs)
MEASURE_ROUNDS = 3
# the most rows F.linear is timed at against the packed copy (from 3 rows, while it wins). Not further: the timing
# passes read 64 MB, which a large last-level cache holds (session 67's Xeon reports 300 MB), and there the two
# products' costs at 4-8 rows came out within noise of each other (F.linear "won" up to 6 and 8 rows in two loads),
# while over all of SmolLM2's 513 MB of projections the packed copy was 1.3-1.6x faster at 4-8 rows (3 rows: F.linear
# 30.6 against 33.6 ms over the 513 MB, 3.0 against 3.8 over the 64 MB: the same side)
DIRECT_MAX_ROWS = 3


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


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """x [..., K] (the weight's dtype) times a weight [n, K] reordered by `pack_weight` (+ bias [n]) -> [..., n]."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]
    y = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")  # [M, n]
    return y.reshape(*x.shape[:-1], n)


def packable(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build can pack CPU weights of this dtype: float32 wherever it has oneDNN, bfloat16 where
    oneDNN also has the CPU's native bf16 instructions."""
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.float32, torch.bfloat16):
        return False
    try:
        return dtype == torch.float32 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's blocked copy of a float32 or bfloat16 CPU weight [N, K], or None where it cannot serve: another dtype
    or device, a PyTorch build or CPU without it (`packable`; the private reorder op's name may change between
    releases), or a copy whose product differs from the weight-major one on PACK_HINT_ROWS fixed rows (beyond
    float32 reassociation, or bfloat16's rounding of the output)."""
    if weight.device.type != "cpu" or not packable(weight.dtype):
        return None
    w = weight.detach()
    k = w.shape[1]
    probe = torch.arange(PACK_HINT_ROWS * k, dtype=torch.float32).reshape(-1, k).mul_(0.37).sin_().to(w.dtype)
    try:  # (the probe uses no RNG)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_HINT_ROWS)
        got = packed_linear(probe, packed, None, w.shape[0]).float()
    except (AttributeError, RuntimeError):
        return None
    want = weight_major_linear(probe.float(), w.float())
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1.0)
    rtol, atol = (1e-4, 1e-5 * scale) if w.dtype == torch.float32 else (2e-2, 1e-2 * scale)
    return packed if torch.allclose(got, want, rtol=rtol, atol=atol) else None


def _pass_seconds(product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], weights: list[torch.Tensor],
                  rows: int) -> float:
    """Seconds of one pass of `product(x, weight)` over `weights`, x [rows, K] of each weight's width and dtype."""
    xs = {(w.shape[1], w.dtype): torch.ones(rows, w.shape[1], dtype=w.dtype) for w in weights}
    t = time.perf_counter()
    for w in weights:
        product(xs[(w.shape[1], w.dtype)], w)
    return time.perf_counter() - t


def _best_seconds(products: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
                  weights: list[torch.Tensor], rows: tuple[int, ...]) -> dict[tuple[str, int], float]:
    """(product, rows) -> the best of MEASURE_ROUNDS passes over `weights`, after one warm pass each, the products
    alternating round by round (a pass slowed by another process does not decide)."""
    best: dict[tuple[str, int], float] = {}
    with torch.no_grad():
        for rnd in range(MEASURE_ROUNDS + 1):  # round 0: warm
            for name, product in products.items():
                for r in rows:
                    t = _pass_seconds(product, weights, r)
                    if rnd:
                        best[name, r] = min(best.get((name, r), t), t)
    return best


def direct_rows(weights: list[torch.Tensor], copies: dict[int, torch.Tensor] | None = None) -> int:
    """The most rows a step should give F.linear instead of the padded weight-major product or the packed copy,
    timed over these distinct weights [N, K] (a model's projections, in module order; `copies`: their packed copies
    by the weight's data pointer, where `pack` made them): over the first MEASURE_BYTES of them, F.linear against the
    weight-major product at 1 and 2 rows (the two row counts' best passes summed; 0 where the weight-major product
    wins), then, for float32 weights that all have copies, F.linear against the copy at 3, 4, ... rows up to the
    first row count where the copy wins (at most DIRECT_MAX_ROWS). 16 passes over at most 64 MB for 1-2 rows, 8 per
    row count after: 0.08-0.10 s in all for SmolLM2 on session 67's CPU (a load's other work takes 1.1-1.7 s)."""
    chosen, total = [], 0
    for w in weights:
        if total >= MEASURE_BYTES:
            break
        chosen.append(w.detach())
        total += w.numel() * w.element_size()
    best = _best_seconds({"weight_major": weight_major_linear, "direct": F.linear}, chosen, (1, 2))
    if sum(best["direct", r] for r in (1, 2)) >= sum(best["weight_major", r] for r in (1, 2)):
        return 0
    copies = copies or {}
    if not PACKED or not chosen or any(w.dtype != torch.float32 or w.data_ptr() not in copies for w in chosen):
        return 2

    def packed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, copies[w.data_ptr()], None, w.shape[0])

    rows = 2
    while rows < DIRECT_MAX_ROWS:
        best = _best_seconds({"packed": packed, "direct": F.linear}, chosen, (rows + 1,))
        if best["direct", rows + 1] >= best["packed", rows + 1]:
            break
        rows += 1
    return rows


class CpuLinear(nn.Linear):
    _packed: torch.Tensor | None = None
    # `direct_rows` (measured) > 0: F.linear, not the weight-major product, where the packed copy does not serve, and
    # the float32 copy only for steps of more rows than this
    direct_rows = 0
    _packed_of: tuple[int, int] = (0, -1)  # (data pointer, in-place version) of the weight the copy was made from

    @classmethod
    def wrap(cls, linear: nn.Linear) -> "CpuLinear":
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        m.weight = linear.weight  # the same Parameters: nothing copied, the checkpoint names kept
        if linear.bias is not None:
            m.bias = linear.bias
        return m

    def pack(self, packed: torch.Tensor | None = None) -> bool:
        """Make (or take, for a weight shared with another CpuLinear) the packed copy; False where none can serve."""
        packed = pack_weight(self.weight) if packed is None else packed
        self._packed = packed
        self._packed_of = (self.weight.data_ptr(), self.weight._version)
        return packed is not None

    @property
    def packed(self) -> torch.Tensor | None:
        """The packed copy while it is the weight's, else None (a stale copy is dropped)."""
        if self._packed is not None and self._packed_of != (self.weight.data_ptr(), self.weight._version):
            self._packed = None
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (PACKED and self._packed is not None and x.dtype == self.weight.dtype
                and (x.dtype == torch.bfloat16
                     or x.numel() >= max(PACKED_MIN_ROWS, self.direct_rows + 1) * self.in_features)
                and not (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))):
            packed = self.packed
            if packed is not None:
                return packed_linear(x, packed, self.bias, self.out_features)
        if self.direct_rows:
            return F.linear(x, self.weight, self.bias)
        return weight_major_linear(x, self.weight, self.bias)


def measure_direct_rows(lins: list[CpuLinear]) -> None:
    """Give one model's CpuLinears the `direct_rows` timed on their distinct CPU weights (and packed copies), where
    MEASURE is on and those weights hold at least MEASURE_MIN_BYTES; otherwise they keep 0 (weight-major at 1-2
    rows)."""
    weights = list({m.weight.data_ptr(): m.weight for m in lins if m.weight.device.type == "cpu"}.values())
    if not MEASURE or sum(w.numel() * w.element_size() for w in weights) < MEASURE_MIN_BYTES:
        return
    copies = {m.weight.data_ptr(): m.packed for m in lins if m.packed is not None}
    rows = direct_rows(weights, copies)
    for m in lins:
        m.direct_rows = rows
