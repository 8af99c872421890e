"""Does merging the attention's splits in their last program (`short_attention_kernel.FUSED_COMBINE`: no combine
kernel) make steps faster, and is it right on the GPU?

1. Correctness: `short_attention` with the in-kernel merge against the combine kernel and against SDPA, bf16 and
   float32, 1-32 rows, 1-16 query tokens, 1-16 splits, scattered masks; then one call captured in a CUDA graph and
   replayed 200 times with new inputs each time (the arrival counters must come back to zero after every launch):
   the largest difference to SDPA over all replays.
2. Whole graphs: random SmolLM2-135M weights and a random drafter with a 12,288-token head, bf16, PDL, engines
   stepped 30 steps after 128-token prompts; ms per replay of the plain decode graph at 1, 8 and 32 rows and of the
   speculative step (draft + verify + commit) of a chain S3 K1 D4 at 1, 8 and 32 rows and a tree S4 K4 D16 at 1
   row; wirings `two_kernel` and `fused`, alternated, each twice; the tokens of a one-row chain engine's `generate`
   against `two_kernel`'s.
Under an older tree (no FUSED_COMBINE) part 2 measures that tree as `as_is`.

usage: python benchmarks/attention_merge_check.py OUT_DIR
"""

from __future__ import annotations

from probe_script import (DEV, Emitter, agreement, decode_graph_ms, generated_tokens, random_pair,  # noqa: E402
                          spec_graph_ms)

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.layers import short_attention_kernel as sak  # noqa: E402
from eaglespec.layers.attention import sdpa  # noqa: E402

emit = Emitter("attention_merge_check.json")
has_flag = hasattr(sak, "FUSED_COMBINE")


def case(B, T, H, Hkv, D, K, dtype, g):
    Bc, S = B + 3, K + 16
    q = torch.randn(B, T, H, D, generator=g).to(dtype).to(DEV)
    kc = torch.randn(Bc, S, Hkv, D, generator=g).to(dtype).to(DEV)
    vc = torch.randn(Bc, S, Hkv, D, generator=g).to(dtype).to(DEV)
    rows = torch.randperm(Bc, generator=g)[:B].to(DEV)
    lens = torch.randint(1, K - T + 1, (B,), generator=g)
    mask = torch.zeros(B, T, K, dtype=torch.bool)
    for b in range(B):
        mask[b, :, : lens[b]] = True
        mask[b, :, lens[b]: lens[b] + T] = (torch.rand(T, T, generator=g) < 0.5).tril() | torch.eye(T, dtype=torch.bool)
    return q, kc, vc, rows, mask.to(DEV)


def reference(q, kc, vc, rows, mask):
    K = mask.shape[-1]
    return sdpa(q.float(), kc[rows, :K].float(), vc[rows, :K].float(), mask, None).to(q.dtype)


if has_flag:
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        worst = {"fused_vs_sdpa": 0.0, "two_kernel_vs_sdpa": 0.0, "fused_vs_two_kernel": 0.0}
        n = 0
        for B, T, K in ((1, 1, 40), (1, 1, 300), (1, 4, 700), (8, 1, 1000), (8, 4, 300), (32, 1, 513), (32, 4, 260),
                        (4, 16, 1024), (2, 7, 64)):
            q, kc, vc, rows, mask = case(B, T, 9, 3, 64, K, dtype, g)
            sak.FUSED_COMBINE = True
            a = sak.short_attention(q, kc, vc, rows, mask)
            sak.FUSED_COMBINE = False
            b = sak.short_attention(q, kc, vc, rows, mask)
            ref = reference(q, kc, vc, rows, mask)
            worst["fused_vs_sdpa"] = max(worst["fused_vs_sdpa"], (a.float() - ref.float()).abs().max().item())
            worst["two_kernel_vs_sdpa"] = max(worst["two_kernel_vs_sdpa"], (b.float() - ref.float()).abs().max().item())
            worst["fused_vs_two_kernel"] = max(worst["fused_vs_two_kernel"], (a.float() - b.float()).abs().max().item())
            n += 1
        emit({"check": f"calls {dtype}", "cases": n, **{k: round(v, 6) for k, v in worst.items()}})
    # a captured call replayed with fresh inputs: the counters must reset after every launch
    sak.FUSED_COMBINE = True
    q, kc, vc, rows, mask = case(8, 4, 9, 3, 64, 700, torch.bfloat16, g)
    sak.short_attention(q, kc, vc, rows, mask)  # eager first: the counters are allocated outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sak.short_attention(q, kc, vc, rows, mask)
    worst_replay = 0.0
    for i in range(200):
        q.copy_(torch.randn(q.shape, generator=g).to(q.dtype))
        kc.copy_(torch.randn(kc.shape, generator=g).to(kc.dtype))
        graph.replay()
        if i % 20 == 0 or i == 199:
            worst_replay = max(worst_replay, (out.float() - reference(q, kc, vc, rows, mask).float()).abs().max().item())
    torch.cuda.synchronize()
    emit({"check": "graph replays", "replays": 200, "fused_vs_sdpa_max": round(worst_replay, 6),
          "tickets_nonzero": int((sak._tickets(q.device) != 0).sum().item())})

m, d = random_pair(draft_vocab=12288)
wirings = ("two_kernel", "fused") * 2 if has_flag else ("as_is",) * 2
tokens = {}
for name in wirings:
    if has_flag:
        sak.FUSED_COMBINE = name == "fused"
    row = {"wiring": name}
    for rows in (1, 8, 32):
        row[f"decode{rows}_ms"] = decode_graph_ms(m, rows)
    for spec, rows in ((SpecConfig(3, 1, 4), 1), (SpecConfig(3, 1, 4), 8), (SpecConfig(3, 1, 4), 32),
                       (SpecConfig(4, 4, 16), 1)):
        v, s = spec_graph_ms(m, d, spec, rows)
        row[f"rows{rows}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}_verify_ms"] = v
        row[f"rows{rows}_S{spec.steps}K{spec.topk}D{spec.draft_tokens}_step_ms"] = s
    out = generated_tokens(m, d, SpecConfig(3, 1, 4))
    row["tokens_equal_first"] = agreement(out, tokens.setdefault("first", out))
    emit(row)
    torch.cuda.empty_cache()
