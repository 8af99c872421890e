"""Does one program per row (`norm_linear_kernel.ROW_GRID_ROWS`: each program of a 2..R-row step runs the one-row
row loop over its own row, so that a 4- or 8-row verify costs about what a decode step costs per kernel) make whole
steps faster than the 4-row blocks and cuBLAS past 4 rows?

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL), after a 128-token prompt and 30 steps,
three wirings in one process: `base` (blocks up to 4 rows, cuBLAS past), `grid4` (the row grid for 2-4 rows),
`grid8` (the row grid for 2-8 rows, the kernels wired up to 8 rows in target and drafter). For each: the one-row
decode graph, the verify graphs and whole steps of chains of 4 and 8 (S3 K1 D4, S7 K1 D8), a tree step (S4 K4 D16),
the decode graph of 8 rows; and the tokens of `generate` (256 after 128, chain S3 K1 D4) against `base` (sums in
another order can flip bf16 near-ties of random weights).

usage: python benchmarks/row_grid_check.py OUT_DIR [--wide | --groups]
  --groups: row-grid programs of several rows past 8 rows (ROWS_PER_PROGRAM), with 8-row speculative steps
  --wide: base, grid8, grid16, grid32, with decode graphs of 8, 16 and 32 rows
"""

from __future__ import annotations

import functools
import sys

from probe_script import (Emitter, agreement, decode_graph_ms, generated_tokens, random_pair,  # noqa: E402
                          spec_graph_ms)

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.transforms import use_linear_rows_kernel, use_norm_linear_kernel  # noqa: E402
from eaglespec.layers import norm_linear_kernel as nlk  # noqa: E402

m, d = random_pair()
emit = Emitter("row_grid_check.json")
tokens = {}
WIRINGS = [("base", 0, 4), ("grid4", 4, 4), ("grid8", 8, 8)] * 2
if "--wide" in sys.argv:  # session 13's second call: how far the row grid beats cuBLAS
    WIRINGS = [("base", 0, 4), ("grid8", 8, 8), ("grid16", 16, 16), ("grid32", 32, 32)]
GROUPS = {"grid8": {}, "groups_a": {8: 1, 16: 2, 32: 4, 128: 8}, "groups_b": {8: 1, 16: 4, 32: 8, 128: 16}}
if "--groups" in sys.argv:  # session 13's third call: programs of several rows past 8 rows
    WIRINGS = [("grid8", 8, 8), ("groups_a", 128, 128), ("groups_b", 128, 128)]
launch = nlk._launch


def grouped(h2, d2, nw, w, h_out, y, eps, gated, norm, blocks=None, groups=None):
    """`_launch` with row-grid programs of groups[limit] rows for steps of up to `limit` rows (explicit blocks)."""
    M, K = h2.shape
    per = next((r for limit, r in sorted(groups.items()) if M <= limit), 1)
    if blocks is None and 1 < M <= nlk.ROW_GRID_ROWS and per > 1:
        bn, warps = nlk._ROW_GRID_BLOCKS[(gated, norm)]
        blocks = (per, bn, 1 << (K - 1).bit_length(), warps, True, True)
    return launch(h2, d2, nw, w, h_out, y, eps, gated, norm, blocks)


for name, grid, rows in WIRINGS:
    nlk.ROW_GRID_ROWS = grid
    nlk._launch = functools.partial(grouped, groups=GROUPS.get(name, {}))
    for x in (m, d):
        use_linear_rows_kernel(use_norm_linear_kernel(x, max_rows=rows), max_rows=rows)
    row = {"wiring": name}
    row["decode_ms"] = decode_graph_ms(m)
    for spec in (SpecConfig(3, 1, 4), SpecConfig(7, 1, 8), SpecConfig(4, 4, 16)):
        key = f"S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
        row[f"{key}_verify_ms"], row[f"{key}_step_ms"] = spec_graph_ms(m, d, spec)
    if "--groups" in sys.argv:  # 8-row speculative steps: verify of 32 (chain) and 128 (tree) rows
        for spec in (SpecConfig(3, 1, 4), SpecConfig(4, 4, 16)):
            key = f"rows8_S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
            row[f"{key}_verify_ms"], row[f"{key}_step_ms"] = spec_graph_ms(m, d, spec, rows=8)
    for b in (8, 16, 32) if "--wide" in sys.argv or "--groups" in sys.argv else (8,):
        row[f"decode{b}_ms"] = decode_graph_ms(m, b)
    row["D4_over_decode"] = round(row["S3K1D4_verify_ms"] / row["decode_ms"], 3)
    row["D8_over_decode"] = round(row["S7K1D8_verify_ms"] / row["decode_ms"], 3)
    out = generated_tokens(m, d, SpecConfig(3, 1, 4))
    row["tokens_equal_base"] = agreement(out, tokens.setdefault("base", out))
    emit(row)
    torch.cuda.empty_cache()
