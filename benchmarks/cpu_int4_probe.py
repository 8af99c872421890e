"""What would a CPU path on the GGUF's own 4-bit weights give? (A probe for planning; no engine path uses it.)

The embedded SmolLM2 ships as Q4_1 (32 weights share a float16 scale d and minimum m: w = d q + m, q in 0..15); the
engine dequantizes it to float32, so a one-token CPU forward reads ~540 MB. PyTorch's CPU kernel for groupwise 4-bit
weights (`aten._weight_int4pack_mm_for_cpu`: w = (q - 8) scale + zero per group, bf16 activations; d and m + 8d are
Q4_1's group exactly) reads 4.5 bits a weight. Here, for SmolLM2's 30 layers of projections (q/k/v 960 x 576, o_proj
576 x 576, gate/up 3,072 x 576, down 1,536 -> 576) with distinct random weights per layer (cold: ~400 MB in float32,
past the caches), the time of one forward's projections at 1, 3 and 6 rows:
- fp32: as the engine runs them today (`cpu_linear`: weight-major at 1-2 rows, the oneDNN packed copy from 3);
- bf16: dense bf16 weights through the packed copy (session 61's `--dtype bfloat16`);
- int4: the groupwise 4-bit kernel, bf16 activations;
and whether each product of a row is the same bits whatever the number of rows beside it (row-count invariance: what
makes a speculative verify of D tokens give plain decoding's tokens when the arithmetic is bf16), also for SDPA.

usage: python benchmarks/cpu_int4_probe.py      (PYTHONPATH=src; ~1 minute on 2 cores)
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from eaglespec.layers.cpu_linear import pack_weight, packed_linear, weight_major_linear

torch.manual_seed(0)
GROUP, LAYERS = 32, 30
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def q4(N: int, K: int):
    """A random Q4_1-like weight: its float32 values, its int4 pack and bf16 scales-and-zeros."""
    q = torch.randint(0, 16, (N, K), dtype=torch.int32)
    d = torch.rand(N, K // GROUP) * 0.01
    m = -torch.rand(N, K // GROUP) * 0.05
    w = (q.view(N, K // GROUP, GROUP).float() * d[..., None] + m[..., None]).view(N, K)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack([d.t(), (m + 8 * d).t()], dim=-1).contiguous().to(torch.bfloat16)
    return w, packed, sz


layers = []
for _ in range(LAYERS):
    per = []
    for N, K in SHAPES:
        w, packed, sz = q4(N, K)
        wb = w.to(torch.bfloat16)
        per.append(dict(N=N, K=K, w=w, w_packed=pack_weight(w), wb_packed=pack_weight(wb), i4=packed, sz=sz))
    layers.append(per)


def forward(kind: str, rows: int) -> None:
    for per in layers:
        for p in per:
            if kind == "fp32":
                x = torch.randn(rows, p["K"])
                weight_major_linear(x, p["w"]) if rows < 3 else packed_linear(x, p["w_packed"], None, p["N"])
            elif kind == "bf16":
                packed_linear(torch.randn(rows, p["K"]).to(torch.bfloat16), p["wb_packed"], None, p["N"])
            else:
                x = torch.randn(rows, p["K"]).to(torch.bfloat16)
                torch.ops.aten._weight_int4pack_mm_for_cpu(x, p["i4"], GROUP, p["sz"])


print("projections of one SmolLM2 forward, ms (best of 5, cold weights):")
for rows in (1, 3, 6):
    line = []
    for kind in ("fp32", "bf16", "int4"):
        forward(kind, rows)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            forward(kind, rows)
            best = min(best, time.perf_counter() - t)
        line.append(f"{kind} {best * 1e3:.2f}")
    print(f"  {rows} rows: " + ", ".join(line))

print("row-count invariance (every row of an 8-row product equal to the same row run in products of 1, 2, 3 or 6 rows,"
      " over 20 random inputs; one mismatch proves a product is not invariant, none does not prove it is):")


def invariant(f, xs) -> bool:
    return all(torch.equal(f(x[i:i + r]), f(x)[i:i + r]) for x in xs for r in (1, 2, 3, 6) for i in range(0, 8 - r + 1))


for N, K in SHAPES + [(49152, 576)]:
    w, packed, sz = q4(N, K)
    wb, wr = w.to(torch.bfloat16), (torch.randn(N, K) * 0.02).to(torch.bfloat16)
    pb, pr = pack_weight(wb), pack_weight(wr)
    xs = [torch.randn(8, K).to(torch.bfloat16) for _ in range(20 if N < 10000 else 4)]
    res = {"int4": invariant(lambda a: torch.ops.aten._weight_int4pack_mm_for_cpu(a, packed, GROUP, sz), xs),
           "bf16 packed (Q4 values)": invariant(lambda a: packed_linear(a, pb, None, N), xs),
           "bf16 packed (normal values)": invariant(lambda a: packed_linear(a, pr, None, N), xs),
           "bf16 F.linear": invariant(lambda a: F.linear(a, wr), xs)}
    print(f"  {N} x {K}: " + ", ".join(f"{k} {v}" for k, v in res.items()))
H, Hkv, D, S = 9, 3, 64, 200
for dt in (torch.bfloat16, torch.float32):
    same = True
    for _ in range(20):
        k = torch.randn(1, Hkv, S, D).to(dt).repeat_interleave(H // Hkv, 1)
        v = torch.randn(1, Hkv, S, D).to(dt).repeat_interleave(H // Hkv, 1)
        q = torch.randn(1, H, 6, D).to(dt)
        mask = torch.ones(6, S, dtype=torch.bool).tril(S - 6)
        y6 = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        same &= all(torch.equal(F.scaled_dot_product_attention(q[:, :, t:t + 1], k, v, attn_mask=mask[t:t + 1]),
                                y6[:, :, t:t + 1]) for t in range(6))
    print(f"  SDPA {dt}: 6 queries against 1 at a time {same}")
