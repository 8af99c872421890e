"""Which few-row kernel blocks make a whole verify step fastest? (Session 12: the per-call sweep's winners at 2-8
rows, weights cold, made whole verify steps slower, so blocks are chosen here on whole steps.) Since session 13 steps
of 2-8 rows take the row grid (`norm_linear_kernel.ROW_GRID_ROWS`), so these 4-row blocks serve only with it lowered:
the probe sets ROW_GRID_ROWS = 0 for its runs.

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, programmatic dependent launch, batch 1, a
128-token prompt then 30 steps of a chain S3 K1 D4): the verify graph (4 rows through every projection) replayed
200 times alone, for each (BLOCK_N, num_warps, row_loop) of the 4-row bucket of one table of
`layers/norm_linear_kernel.py` at a time (q/k/v with the norm, gate/up with the norm, the plain projections), the
other tables at their best so far (coordinate descent, tables in that order). Prints ms per verify step for each.

usage: python benchmarks/verify_blocks_probe.py OUT_DIR
"""

from __future__ import annotations

import json

from probe_script import OUT, random_pair, replay_ms, stepped_engine  # noqa: E402


from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import norm_linear_kernel as nlk  # noqa: E402

m, d = random_pair()
nlk.ROW_GRID_ROWS = 0  # the blocks below serve 4-row steps only without the row grid
results: list[dict] = []


def verify_ms() -> float:
    e = stepped_engine(m, d, SpecConfig(3, 1, 4))
    graphs = dict(e.runner.graphs.captured("spec", 1, e.runner.host_len[0] + 64, True))
    t = replay_ms([graphs["verify"]])
    del e
    return t


base = verify_ms()
print(f"defaults: verify {base:.4f} ms", flush=True)
results.append({"table": "defaults", "cfg": None, "verify_ms": round(base, 4)})
for name in ("_NORM_CFG", "_GATED_CFG", "_PLAIN_CFG"):
    table = getattr(nlk, name)
    best = (base, table[4])
    for cfg in [(bn, w, loop) for bn in (2, 4) for w in (1, 2, 4) for loop in (False, True)]:
        table[4] = cfg
        try:
            t = verify_ms()
        except Exception as e:  # noqa: BLE001  (a block Triton cannot build: skipped)
            print(f"  {name} {cfg}: {type(e).__name__}", flush=True)
            continue
        results.append({"table": name, "cfg": list(cfg), "verify_ms": round(t, 4)})
        print(f"  {name} {cfg}: verify {t:.4f} ms", flush=True)
        best = min(best, (t, cfg))
    table[4] = best[1]
    base = best[0]
    print(f"{name}: best {best[1]} {best[0]:.4f} ms", flush=True)
    (OUT / "verify_blocks.json").write_text(json.dumps(results, indent=1))
print("\nfinal 4-row blocks:", {n: getattr(nlk, n)[4] for n in ("_NORM_CFG", "_GATED_CFG", "_PLAIN_CFG")},
      f"verify {base:.4f} ms")
