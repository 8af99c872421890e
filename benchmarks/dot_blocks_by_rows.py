"""Which tensor-core blocks (`norm_linear_dot_kernel.DOT_BLOCKS`) serve steps of 33-64 rows best, with the blocks of
smaller steps left at the default? Session 14 chose 16 x 32 x 4 warps on steps of 16-32 rows and on 128-row steps
(which then went back to cuBLAS); steps of 33-64 rows (an 8-row tree S4 K2 D8's verify of 64 rows, a 16-row chain's
of 64) were never swept.

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL), engines stepped 30 steps after 128-token
prompts; per block choice for steps of more than 32 rows, ms per replay of the verify graph and of the whole step:
the 8-row tree S4 K2 D8 and the 16-row chain S3 K1 D4 (the first choice repeated last, as a check on drift).

usage: python benchmarks/dot_blocks_by_rows.py OUT_DIR [--blocks=16x32x4,32x32x4,...]
"""

from __future__ import annotations

from probe_script import Emitter, option, random_pair, spec_graph_ms  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import norm_linear_dot_kernel as dk  # noqa: E402

arg = option("blocks", "16x32x4,32x32x4,64x32x4,32x64x4,64x64x4,32x32x8,16x32x4")
m, d = random_pair()
launch, small = dk.launch, dk.DOT_BLOCKS
big = small


def launch_by_rows(h2, *a):
    dk.DOT_BLOCKS = big if h2.shape[0] > 32 else small  # `launch` reads DOT_BLOCKS through `_blocks` at each call
    return launch(h2, *a)


dk.launch = launch_by_rows  # norm_linear_kernel calls `dot.launch` through the module, so this takes every step
emit = Emitter("dot_blocks_by_rows.json")
for name in arg.split(","):
    big = tuple(int(x) for x in name.split("x"))
    row: dict = {"blocks_past_32_rows": name}
    try:
        row["rows8_S4K2D8_verify_ms"], row["rows8_S4K2D8_step_ms"] = spec_graph_ms(m, d, SpecConfig(4, 2, 8), rows=8)
        row["rows16_S3K1D4_verify_ms"], row["rows16_S3K1D4_step_ms"] = spec_graph_ms(m, d, SpecConfig(3, 1, 4), rows=16)
    except Exception as exc:  # a block choice the compiler refuses: record and go on
        row["error"] = repr(exc)[:300]
    emit(row)
