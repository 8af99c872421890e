"""The exponential race inside the sampling kernels (`layers.sampling.sample_probs` on CUDA) against the draw it
replaces (`sample(target_probs(...))`: the probability kernels, Exp(1) draws, a clamp, a division and the argmax
kernel): agreement for the same draws, a frequency check, and time per call in a CUDA graph.

Per (V, rows, case), bf16 logits: whether the kernel's ids equal argmax(p / max(e, 1e-30)) over the same draws (20
draws, through a draft -> target table when V is a draft vocabulary's 12,288), and us per call of both paths, each
with its own draws, as the engine's graphs run them (`probe_script.per_call_us`). Then one row of 64 tokens at
temperature 1 sampled 100,000 times through the race: the largest gap between a token's frequency and its
probability (a sampler that is off shows gaps far above the ~0.003 of sampling noise).

usage: python benchmarks/race_check.py OUT_DIR [--cpu]      (PYTHONPATH=src; --cpu: the interpreter, small shapes)
"""

from __future__ import annotations

from probe_script import CPU, DEV, Emitter, per_call_us  # noqa: E402

import torch  # noqa: E402

from eaglespec.layers import sampling, sampling_kernel  # noqa: E402

emit = Emitter("race_check.json")
g = torch.Generator(device=DEV).manual_seed(0)
CASES = {"T": (1.0, 0, 1.0), "T+p": (1.0, 0, 0.9), "T+k+p": (0.8, 50, 0.9), "greedy": (0.0, 0, 1.0)}
for V in ((5000,) if CPU else (49152, 12288, 128256)):
    for N in ((1, 3) if CPU else (1, 8, 32)):
        x = (torch.randn(N, V, device=DEV, generator=g) * 3).to(torch.float32 if CPU else torch.bfloat16)
        table = (torch.randperm(V, device=DEV, generator=g) + 7) if V == 12288 else None
        for case, (t, k, p) in CASES.items():
            T = torch.full((N,), t, device=DEV)
            K = torch.full((N,), k, device=DEV, dtype=torch.int64)
            P = torch.full((N,), p, device=DEV)
            same = True
            for _ in range(3 if CPU else 20):
                noise = sampling._exponential((N, V), x.device, g)
                ids, probs = sampling_kernel.sample_probs(x, T, K, P, noise, table)
                want = (probs / noise.clamp_min(1e-30)).argmax(-1)
                same &= bool(torch.equal(ids, want if table is None else table[want]))

            def old():
                probs = sampling.target_probs(x, T, K, P)
                ids = sampling.sample(probs)  # the default generator: graphs track its state
                return ids if table is None else table[ids]

            def new():
                return sampling.sample_probs(x, T, K, P, None, table, kernels=True)[0]

            emit({"V": V, "rows": N, "case": case, "ids_equal": same, "old_us": round(per_call_us(old), 1),
                  "new_us": round(per_call_us(new), 1)})

# frequencies: one 64-token row at temperature 1, drawn 100,000 times (as 100,000 rows sharing the logits)
n = 2000 if CPU else 100_000
logits = torch.randn(1, 64, device=DEV, generator=g).expand(n, 64).contiguous()
T, K, P = torch.ones(n, device=DEV), torch.zeros(n, dtype=torch.int64, device=DEV), torch.ones(n, device=DEV)
ids, probs = sampling.sample_probs(logits, T, K, P, g, kernels=True)
freq = torch.bincount(ids, minlength=64).float() / n
emit({"frequency_check_rows": n, "max_gap": round(float((freq - probs[0]).abs().max()), 5),
      "tokens_seen": int((freq > 0).sum()), "tokens_with_p_over_1e-3": int((probs[0] > 1e-3).sum())})
print("\n| V | rows | case | ids equal | old us | new us |")
print("| ---: | ---: | --- | --- | ---: | ---: |")
for r in emit.rows[:-1]:
    print(f"| {r['V']} | {r['rows']} | {r['case']} | {r['ids_equal']} | {r['old_us']} | {r['new_us']} |")
print(emit.rows[-1])
