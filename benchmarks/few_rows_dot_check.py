"""Do steps of 2-8 rows (SmolLM2's 4- and 8-token verifies at one row, plain decoding at 8 rows, an 8-row chain's
drafter forwards) get faster on the tensor-core kernel (`layers/norm_linear_dot_kernel.py`, rows padded to 16) than
on the row grid (`norm_linear_kernel`, one program per row, each re-reading its weight tile from L2)?

Sessions 5 and 10 tried tensor cores at 2-8 rows before the weight tiles were loaded ahead of the programmatic-launch
wait (they lost 4-7% in whole verify steps); session 14's kernel does load them first, and was never measured below 9
rows. Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL), engines stepped 30 steps after
128-token prompts; wirings in one process: `grid` (the row grid up to 8 rows, the policy before session 24) and
`dotBMxBNxW[@R]` (the tensor-core kernel from R rows on, default 2, with those blocks; session 24 adopted
dot16x32x4@5). Per wiring, ms per graph replay: decode of 1 and 8 rows, the verify
graph and whole step of one-row chains S3 K1 D4 and S7 K1 D8, of an 8-row chain S3 K1 D4; the one-row chain's 256
greedy tokens against plain decoding's under the same wiring.

usage: python benchmarks/few_rows_dot_check.py OUT_DIR [--wirings=grid,dot16x32x4,dot16x64x4@5,...]
"""

from __future__ import annotations

from probe_script import (Emitter, agreement, decode_graph_ms, generated_tokens, option, random_pair,  # noqa: E402
                          spec_graph_ms)

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import norm_linear_dot_kernel as dk  # noqa: E402
from eaglespec.layers import norm_linear_kernel as nk  # noqa: E402

arg = option("wirings", "grid,dot16x32x4,dot16x16x4,dot16x64x4,dot16x16x2")
DEFAULT_BLOCKS = dk.DOT_BLOCKS
m, d = random_pair()
emit = Emitter("few_rows_dot_check.json")
for name in arg.split(","):
    if name == "grid":  # the row grid up to ROW_GRID_ROWS (8), tensor cores past it
        dk.DOT_BLOCKS, nk.DOT_MIN_ROWS = DEFAULT_BLOCKS, nk.ROW_GRID_ROWS + 1
    else:  # dotBMxBNxW[@R]: tensor cores from R rows on (default 2)
        blocks, _, at = name.removeprefix("dot").partition("@")
        dk.DOT_BLOCKS, nk.DOT_MIN_ROWS = tuple(int(x) for x in blocks.split("x")), int(at or 2)
    row: dict = {"wiring": name}
    try:
        row["decode1_ms"] = decode_graph_ms(m, 1)
        row["decode8_ms"] = decode_graph_ms(m, 8)
        for spec, rows in ((SpecConfig(3, 1, 4), 1), (SpecConfig(7, 1, 8), 1), (SpecConfig(3, 1, 4), 8)):
            key = f"rows{rows}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
            row[f"{key}_verify_ms"], row[f"{key}_step_ms"] = spec_graph_ms(m, d, spec, rows=rows)
        row["verify8_over_decode1"] = round(row["rows1_S7K1D8_verify_ms"] / row["decode1_ms"], 3)
        plain = generated_tokens(m)
        row["chain_tokens_equal_plain"] = agreement(generated_tokens(m, d, SpecConfig(3, 1, 4)), plain)
    except Exception as exc:  # a block choice the compiler refuses: record and go on
        row["error"] = repr(exc)[:300]
    emit(row)
    torch.cuda.empty_cache()
