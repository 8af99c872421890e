"""Is the tensor-core kernel's product (`layers/norm_linear_dot_kernel.py`, steps of 5-64 rows) bound by its chain of
dependent MMAs? One-shot, a program multiplies its rows by a whole weight tile in one `tl.dot`: per warp a chain of K /
16 dependent MMA steps (36 for SmolLM2's 576, 96 for its MLP's 1536), on 18-48 programs per projection. With
`DOT_CHUNK = KC` the row's product is one batched `tl.dot` over K / KC chunks, summed after: chains of KC / 16 steps.

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, PDL), in one process per wiring (`kc0` = the
one-shot product as shipped, `kcN` = chunks of N):
- each projection of a SmolLM2 layer alone (q/k/v with the add + norm, o_proj, gate/up with the gating, down), us per
  call in a graph of 50 calls, at 1 row (the row kernels, unchanged: the reference) and 8, 16, 32 and 64 rows;
- whole graphs, ms per replay of stepped engines (probe_script): decode of 1, 8, 16 and 32 rows; the verify graph and
  whole step of a one-row chain of 8 (S7 K1 D8: the goal's verify of 8 tokens) and of an 8-row chain S3 K1 D4; the
  draft graph of a 32-row chain;
- the one-row chain S7 K1 D8's 256 greedy tokens against plain decoding's (bf16 near-ties flip with the sums' order).

usage: python benchmarks/dot_chunk_check.py OUT_DIR [--wirings=kc0,kc128,kc64,kc32,kc0] [--projections]
       (kcN@BMxBNxW: other blocks than DOT_BLOCKS; --projections: the projections alone, no graphs)
       python benchmarks/dot_chunk_check.py OUT_DIR --cpu     (the script itself: projections in the interpreter)
"""

from __future__ import annotations

from probe_script import (CPU, DEV, DT, Emitter, agreement, decode_graph_ms, generated_tokens, option,  # noqa: E402
                          per_call_us, random_pair, spec_graph_ms, stepped_engine)

import sys  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import norm_linear_dot_kernel as dk  # noqa: E402
from eaglespec.layers.norm_linear_kernel import add_norm_linear, linear_rows  # noqa: E402
from probe_script import current_graphs, replay_ms  # noqa: E402

arg = option("wirings", "kc0,kc128,kc64,kc32,kc0")
H, F = (576, 1536) if not CPU else (80, 48)
PROJECTIONS = {"qkv": (H, 960 if not CPU else 40, "norm"), "o": (H, H, "plain"), "gate_up": (H, F, "gated"),
               "down": (F, H, "plain")}
ROWS = (1, 8, 16, 32, 64) if not CPU else (1, 8)


def projection_us(name: str, rows: int) -> float:
    K, N, kind = PROJECTIONS[name]
    g = torch.Generator(device="cpu").manual_seed(rows + K + N)
    x = torch.randn(rows, 1, K, generator=g).to(DEV, DT)
    d = torch.randn(rows, 1, K, generator=g).to(DEV, DT)
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(DEV, DT)
    w = (torch.randn(2 * N if kind == "gated" else N, K, generator=g) / K ** 0.5).to(DEV, DT)
    if kind == "plain":
        return round(per_call_us(lambda: linear_rows(x, w)), 2)
    return round(per_call_us(lambda: add_norm_linear(x, d, nw, 1e-5, w, kind == "gated")), 2)


m, dr = random_pair() if not CPU else (None, None)  # --cpu: the projections only (the interpreter, tiny shapes)
emit = Emitter("dot_chunk_check.json")
plain = None
DEFAULT_BLOCKS = dk.DOT_BLOCKS
for name in arg.split(","):
    kc, _, blocks = name.partition("@")  # kcN[@BMxBNxW]: chunks of N, with other blocks than DOT_BLOCKS
    dk.DOT_CHUNK = int(kc.removeprefix("kc"))
    dk.DOT_BLOCKS = tuple(int(x) for x in blocks.split("x")) if blocks else DEFAULT_BLOCKS
    row: dict = {"wiring": name}
    try:
        for p in PROJECTIONS:
            row[p + "_us"] = {r: projection_us(p, r) for r in ROWS}
        if CPU or "--projections" in sys.argv:
            emit(row)
            continue
        for rows in (1, 8, 16, 32):
            row[f"decode{rows}_ms"] = decode_graph_ms(m, rows)
        for spec, rows in ((SpecConfig(7, 1, 8), 1), (SpecConfig(3, 1, 4), 8)):
            key = f"rows{rows}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
            row[f"{key}_verify_ms"], row[f"{key}_step_ms"] = spec_graph_ms(m, dr, spec, rows=rows)
        e = stepped_engine(m, dr, SpecConfig(3, 1, 4), rows=32)
        row["rows32_S3K1D4_draft_ms"] = round(replay_ms([dict(current_graphs(e, "spec", 32))["draft"]]), 4)
        del e
        row["verify8_over_decode1"] = round(row["rows1_S7K1D8_verify_ms"] / row["decode1_ms"], 3)
        if plain is None:
            plain = generated_tokens(m)
        row["chain8_tokens_equal_plain"] = agreement(generated_tokens(m, dr, SpecConfig(7, 1, 8)), plain)
    except Exception as exc:  # a chunking the compiler refuses: record and go on
        row["error"] = repr(exc)[:400]
    emit(row)
    if not CPU:
        torch.cuda.empty_cache()
