"""Does o_proj's add kernel (layers/add_linear_kernel.py) make the long steps cheaper, in whole graphs?

`triton_gemm_check.py` (session 29) timed o_proj alone: 2.3-2.4 us through the kernel with PDL against 3.1-3.2 for
cuBLAS at 64-256 rows. Here the steps that take `_forward_folded` (more rows than the fused kernels' 64), with the
kernel (`on`) and with cuBLAS's addmm_ (`off`: `add_linear_kernel.MAX_ROWS = 0`, so nothing fits), alternating
on / off / on / off in one process, each round on freshly captured graphs (random SmolLM2-135M weights and drafter,
bf16, CUDA graphs, PDL; probe_script): the 32-row S5 K2 D8 tree's verify graph and whole step, and one-prompt prefill
graphs of 128, 256 and 512 tokens, ms per replay. First the kernel against addmm_ on the GPU (max |difference|, in
units of the largest output) at the shapes it serves.

usage: python benchmarks/add_linear_check.py OUT_DIR [--rounds=2] [--cpu]
"""

from __future__ import annotations

from probe_script import (CPU, DEV, DT, Emitter, option, random_pair, replay_ms, spec_graph_ms,  # noqa: E402
                          stepped_engine)

import torch  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.layers import add_linear_kernel as alk  # noqa: E402

emit = Emitter("add_linear_check.json")
for M in (1, 65, 128, 256, 500):
    g = torch.Generator(device=DEV).manual_seed(M)
    h = torch.randn(M, 576, device=DEV, generator=g).to(DT)
    x = torch.randn(M, 576, device=DEV, generator=g).to(DT)
    w = (torch.randn(576, 576, device=DEV, generator=g) * 0.04).to(DT)
    want = h.clone().addmm_(x, w.t()).float()
    got = alk.add_linear_(h.clone(), x, w).float()
    emit({"check": M, "max_rel": (got - want).abs().max().item() / want.abs().max().item()})

m, d = random_pair()
PREFILLS = (32,) if CPU else (128, 256, 512)
CASES = ((SpecConfig(2, 2, 4), 2),) if CPU else ((SpecConfig(5, 2, 8), 32),)
full = alk.MAX_ROWS
for rnd in range(int(option("rounds", "2"))):
    for wiring, rows in (("on", full), ("off", 0)):
        alk.MAX_ROWS = rows
        row: dict = {"round": rnd, "wiring": wiring}
        for spec, r in CASES:
            if CPU:  # no graphs: the eager steps through the same layers (a check of the script)
                stepped_engine(m, d, spec, steps=2, cache=300, rows=r)
                continue
            key = f"rows{r}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}"
            row[f"{key}_verify_ms"], row[f"{key}_step_ms"] = spec_graph_ms(m, d, spec, rows=r)
        e = Engine(m, None, EngineConfig(max_batch_size=1, overlap=False, cuda_graphs=not CPU))
        e.reserve(1, 1024)
        for T in PREFILLS:
            if CPU:  # no graphs: the eager prefill through the same layers
                e.runner.prefill([0], [list(range(100, 100 + T))], True)
                continue
            g = e.runner.graphs
            g.prefill([0], [list(range(100, 100 + T))], True)  # captures (1, T) on first use
            row[f"prefill1x{T}_ms"] = round(replay_ms([g.graphs[("prefill", 1, T, True)][0][1]], n=100), 4)
        del e
        emit(row)
alk.MAX_ROWS = full
keys = [k for k in emit.rows[-1] if k.endswith("_ms")] or ["round"]
print("\nwiring  " + "  ".join(keys))
for r in emit.rows:
    if "wiring" in r:
        print(f"{r['wiring']:7s} " + "  ".join(f"{r[k]:{len(k)}.4f}" for k in keys))
