"""Do independent MMA chains make the tensor-core projection cheaper? Session 28 found an 8-row projection's time
following K (o_proj 1.93 us for K = 576, down_proj 3.08 us for K = 1,536): a program's product is one chain of K / 16
dependent MMAs per warp, since Triton folds `dot(a, b, 0) + c` into `dot(a, b, c)`. `CHAIN_K` in
`layers/norm_linear_dot_kernel.py` multiplies chunks of that many inputs on their own accumulators, summed after
(the SASS then holds chains of CHAIN_K / 16 MMAs). This probe alternates settings in one process:

- each projection alone (SmolLM2's q/k/v + add + norm, gate/up + add + norm + SiLU, o_proj, down_proj; random
  weights), us per call in a graph of 50, at M = 8, 16 and 64 rows, and its largest difference from CHAIN_K = 0's
  output (bf16 sums in another order);
- whole graphs of random SmolLM2 weights with a random drafter (ms per replay): an 8-row decode step, a one-row
  verify of 8 tokens (S7 K1 D8) and its whole step, an 8-row tree S4 K4 D8's verify and step; the one-row decode
  step (row kernels, untouched) as the denominator.

usage: python benchmarks/chain_k_check.py OUT_DIR [--settings=0,128,256,0,128,256] [--cpu]
"""

from __future__ import annotations

from probe_script import CPU, DEV, DT, Emitter, decode_graph_ms, option, per_call_us, random_pair, spec_graph_ms  # noqa: E402,E501

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import norm_linear_dot_kernel as dk  # noqa: E402
from eaglespec.layers.norm_linear_kernel import add_norm_linear, linear_rows  # noqa: E402

emit = Emitter("chain_k_check.json")
settings = [int(s) for s in option("settings", "0,128,256,0,128,256").split(",")]
H, FF = (576, 1536) if not CPU else (80, 96)
g = torch.Generator().manual_seed(0)
cases = {}  # name -> (kind, K, weight)
for name, (K, N, kind) in {"qkv": (H, 960 if not CPU else 40, "norm"), "gate_up": (H, FF, "gated"),
                           "o_proj": (H, H, "plain"), "down": (FF, H, "plain")}.items():
    cases[name] = (kind, K, (torch.randn(2 * N if kind == "gated" else N, K, generator=g) / K ** 0.5).to(DEV, DT))
inputs = {(K, M): (torch.randn(M, 1, K, generator=g).to(DEV, DT), torch.randn(M, 1, K, generator=g).to(DEV, DT))
          for K in (H, FF) for M in (8, 16, 64)}
nws = {K: (1 + 0.1 * torch.randn(K, generator=g)).to(DEV, DT) for K in (H, FF)}


def call(name: str, M: int):
    kind, K, w = cases[name]
    x, d = inputs[(K, M)]
    if kind == "plain":
        return lambda: linear_rows(x, w)
    return lambda: add_norm_linear(x, d, nws[K], 1e-5, w, kind == "gated")[1]


reference = {}
m, dr = random_pair() if not CPU else (None, None)
if not CPU:
    emit({"decode1_ms": decode_graph_ms(m, 1)})
for ck in settings:
    dk.CHAIN_K = ck
    row: dict = {"chain_k": ck, "plan_576": dk._chunk_plan(H), "plan_1536": dk._chunk_plan(FF)}
    for name in cases:
        for M in (8, 16, 64):
            fn = call(name, M)
            out = fn().float()
            ref = reference.setdefault((name, M), out)
            row[f"{name}_M{M}_diff"] = round(float((out - ref).abs().max() / ref.abs().max()), 5)
            row[f"{name}_M{M}_us"] = round(per_call_us(fn), 2) if not CPU else None
    if not CPU:
        row["decode8_ms"] = decode_graph_ms(m, 8)
        row["rows1_S7K1D8_verify_ms"], row["rows1_S7K1D8_step_ms"] = spec_graph_ms(m, dr, SpecConfig(7, 1, 8), rows=1)
        row["rows8_S4K4D8_verify_ms"], row["rows8_S4K4D8_step_ms"] = spec_graph_ms(m, dr, SpecConfig(4, 4, 8), rows=8)
    emit(row)
