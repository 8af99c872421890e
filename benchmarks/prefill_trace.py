"""What does an admission's prefill graph cost, kernel by kernel?

On MT-bench with continuous batching every admission prefills 1-3 prompts of ~40-400 tokens through a prefill graph
(the target's forward and the drafter's catch-up over the prompt), 1.3-2.1 ms each by events around the launch
(`continuous_gap.py`, session 16): about 14% of a 32-row speculative run. Random SmolLM2-135M weights and a random
drafter with a 12,288-token head (bf16, CUDA graphs, PDL): for prompts of 64 and 128 tokens (1 row) and 2 x 64, the
prefill graph of a plain and of a speculative engine replayed alone (ms), and where the speculative one's time goes
(`probe_script.kernel_advance`: each kernel charged from the previous kernel's end to its own). First, on a tree with
the prompt attention kernel (short_attention_kernel.py), its outputs against SDPA's (float32, bf16).

usage: python benchmarks/prefill_trace.py OUT_DIR
"""

from __future__ import annotations

from probe_script import Emitter, kernel_advance, print_advance, random_pair, replay_ms  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402

emit = Emitter("prefill_trace.json")
try:  # the prompt kernel (session 16) against SDPA on the GPU: causal prompts and prompts after a cached prefix
    from eaglespec.layers.attention import sdpa
    from eaglespec.layers.short_attention_kernel import short_attention

    for dt in (torch.float32, torch.bfloat16):
        for T, prefix in ((64, 0), (128, 0), (300, 0), (512, 0), (100, 200)):
            g = torch.Generator(device="cuda").manual_seed(T)
            K = T + prefix
            q = torch.randn(2, T, 9, 64, device="cuda", dtype=dt, generator=g)
            kc = torch.randn(4, K + 8, 3, 64, device="cuda", dtype=dt, generator=g)
            vc = torch.randn(4, K + 8, 3, 64, device="cuda", dtype=dt, generator=g)
            rows = torch.tensor([2, 0], device="cuda")
            mask = torch.ones(T, K, dtype=torch.bool, device="cuda").tril(prefix).expand(2, T, K).contiguous()
            got = short_attention(q, kc, vc, rows, mask)
            want = sdpa(q, kc[rows, :K], vc[rows, :K], mask, None)
            emit({"check": str(dt), "T": T, "prefix": prefix,
                  "max_abs": (got.float() - want.float()).abs().max().item()})
except ImportError:  # an older tree: no prompt kernel
    pass
m, d = random_pair(draft_vocab=12288)
for name, drafter in (("plain", None), ("chain S3K1D4", d)):
    e = Engine(m, None, EngineConfig(max_batch_size=8, overlap=False), drafter=drafter,
               spec=SpecConfig(3, 1, 4) if drafter is not None else None)
    e.reserve(8, 1024)
    g = e.runner.graphs
    for rows, T in ((1, 64), (1, 128), (2, 64), (1, 256)):
        prompts = [list(range(100 + i, 100 + i + T)) for i in range(rows)]
        g.prefill(list(range(rows)), prompts, True)  # captures (rows, bucket T) on first use
        key = ("prefill", rows, T, True, False)
        graph = g.graphs[key][0][1]
        row = {"engine": name, "rows": rows, "tokens": T, "replay_ms": round(replay_ms([graph], n=100), 4)}
        if drafter is not None and (rows, T) == (1, 64):
            adv = kernel_advance(graph)
            print_advance(f"{name} prefill 1 x 64", adv, top=25)
            row["kernels"] = adv["kernels"]
            row["span_us"] = adv["span_us"]
            row["by_kernel"] = adv["by_kernel"][:25]
        emit(row)
    del e
    torch.cuda.empty_cache()
