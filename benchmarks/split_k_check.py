"""Does splitting a row into two power-of-two chunks (`norm_linear_kernel.SPLIT_K`: SmolLM2's 576 as 512 + 64, 1536
as 1024 + 512, instead of 1024 / 2048 lanes with a quarter to a half computing zeros) make whole steps faster?

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL), batch 1, after a 128-token prompt and 30
steps; SPLIT_K off, then on, in one process (the kernel compiles per chunking): the decode graph, the verify graph
of a chain of 4 (S3 K1 D4) and its whole step, a tree step (S4 K4 D16), each replayed 200 times; and the tokens of
`generate` (256 after 128) with and without it (the float32 sums change order, so bf16 near-ties may flip).

usage: python benchmarks/split_k_check.py OUT_DIR
"""

from __future__ import annotations

from probe_script import (Emitter, agreement, decode_graph_ms, generated_tokens, random_pair,  # noqa: E402
                          spec_graph_ms)


from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import norm_linear_kernel as nlk  # noqa: E402

m, d = random_pair()
emit = Emitter("split_k_check.json")
tokens = {}
for split in (False, True, False, True):
    nlk.SPLIT_K = split
    row = {"split_k": split}
    row["decode_ms"] = decode_graph_ms(m)
    for spec in (SpecConfig(3, 1, 4), SpecConfig(4, 4, 16)):
        name = f"S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
        row[f"{name}_verify_ms"], row[f"{name}_step_ms"] = spec_graph_ms(m, d, spec)
    tokens[split] = generated_tokens(m)
    row["verify_over_decode"] = round(row["S3K1D4_verify_ms"] / row["decode_ms"], 3)
    emit(row)
emit({"tokens_equal_on_off": agreement(tokens[False], tokens[True])})
