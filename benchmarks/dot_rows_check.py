"""Do steps of 9-128 rows get faster when the add + norm + projection kernels take them on tensor cores
(`layers/norm_linear_dot_kernel.py`) instead of cuBLAS plus separate norm and gating kernels?

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL), engines stepped 30 steps after 128-token
prompts, wirings in one process (usage below): `grid8` (the kernels wired up to 8 rows: the policy before session
14) against the tensor-core kernel for 9..R rows. For each, ms per graph replay: decode of 8 / 16 / 32 rows, the
verify graph and whole step of a one-row tree (S4 K4 D16: 16 rows), of 8-row chains and trees (32 and 128 rows), of
a 32-row chain (128 rows); the tokens of an 8-row tree engine's `generate` (8 prompts, 96 tokens) against grid8's
(sums in another order can flip bf16 near-ties of random weights); with --trace, the verify graphs of the 8-row tree
and the 32-row chain (128 rows each) kernel by kernel for the first two wirings.

usage: python benchmarks/dot_rows_check.py OUT_DIR [--trace] [--rows64] [--only128] [--wirings=grid8,dot32,...]
  wirings: gridR / dotR: the kernels wired up to R rows (the default blocks); BMxBNxW[@R]: those tensor-core blocks,
  up to R rows (default 32; with @R only the 128-row steps are measured, as with --only128). --rows64: steps of
  32-64 rows instead (decode of 64 rows, a one-row tree S6 K8 D32, 8-row trees S3 K2 D4 and S4 K2 D8, a 32-row
  chain S1 K1 D2).
"""

from __future__ import annotations

import sys

from probe_script import (Emitter, current_graphs, decode_graph_ms, kernel_advance, print_advance,  # noqa: E402
                          random_pair, spec_graph_ms, stepped_engine)

import torch  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import use_linear_rows_kernel, use_norm_linear_kernel  # noqa: E402
from eaglespec.layers import norm_linear_dot_kernel as dk  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

arg = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--wirings=")), "grid8,dot32")
WIRINGS = arg.split(",")
DEFAULT = dk.DOT_BLOCKS
m, d = random_pair()
emit = Emitter("dot_rows_check.json")
tokens = {}
for n, name in enumerate(WIRINGS):
    if "x" in name:  # BMxBNxWARPS[@R]: those blocks, the kernels wired up to R rows (default 32)
        blocks, _, at = name.partition("@")
        rows, dk.DOT_BLOCKS = int(at or 32), tuple(int(x) for x in blocks.split("x"))
    else:  # grid8 (the kernels up to 8 rows), dotR (up to R rows, the default blocks)
        rows, dk.DOT_BLOCKS = int(name.removeprefix("grid").removeprefix("dot")), DEFAULT
    for x in (m, d):
        use_linear_rows_kernel(use_norm_linear_kernel(x, max_rows=rows), max_rows=rows)
    row = {"wiring": name}
    try:
        only128 = "@" in name or "--only128" in sys.argv  # only the 128-row steps (blocks for them)
        for b in () if "--rows64" in sys.argv or only128 else (8, 16, 32):
            row[f"decode{b}_ms"] = decode_graph_ms(m, b)
        shapes = [(SpecConfig(4, 4, 16), 1), (SpecConfig(3, 1, 4), 8), (SpecConfig(4, 4, 16), 8),
                  (SpecConfig(3, 1, 4), 32)]
        if "--rows64" in sys.argv:  # 32-64 rows: a one-row tree of 32, 8-row trees of 4 and 8, a 32-row chain of 2
            row["decode64_ms"] = decode_graph_ms(m, 64)
            shapes = [(SpecConfig(6, 8, 32), 1), (SpecConfig(3, 2, 4), 8), (SpecConfig(4, 2, 8), 8),
                      (SpecConfig(1, 1, 2), 32)]
        if only128:
            shapes = [(SpecConfig(3, 1, 4), 32), (SpecConfig(4, 4, 16), 8)]
        for spec, r in shapes:
            key = f"rows{r}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
            row[f"{key}_verify_ms"], row[f"{key}_step_ms"] = spec_graph_ms(m, d, spec, rows=r)
        traced = ((SpecConfig(4, 4, 16), 8), (SpecConfig(3, 1, 4), 32)) if "--trace" in sys.argv and n < 2 else ()
        for spec, r in traced:
            e = stepped_engine(m, d, spec, rows=r)
            graphs = dict(current_graphs(e, "spec", r))
            adv = kernel_advance(graphs["verify"])
            print_advance(f"{name}: {r}-row S{spec.steps} K{spec.topk} D{spec.draft_tokens} verify (128 rows)", adv)
            row[f"rows{r}_verify_advance_sequence"] = adv["advance_sequence"]
            del e
        e = Engine(m, None, EngineConfig(max_batch_size=8), drafter=d, spec=SpecConfig(4, 4, 16))
        prompts = [list(range(100 + 7 * i, 160 + 7 * i)) for i in range(8)]
        outs = [o.token_ids for o in e.generate(prompts, SamplingParams(max_new_tokens=96, ignore_eos=True))]
        del e
        base = tokens.setdefault("base", outs)
        row["tokens_equal_grid8"] = f"{sum(a == b for o, p in zip(outs, base) for a, b in zip(o, p))}/{8 * 96}"
    except Exception as exc:  # a block choice the compiler refuses (shared memory, registers): record and go on
        row["error"] = repr(exc)[:300]
    emit(row)
    torch.cuda.empty_cache()
