"""The short-query attention kernel on decode steps of many rows (regeneration's 64-1,024-row steps), against SDPA:
the error of each against a float32 reference, and their times. SmolLM2's attention shape (9 query heads, 3 KV
heads, head size 64), bf16 caches of LEN positions of which each row sees a random prefix of 16..LEN.

usage: python benchmarks/decode_rows_check.py [LEN]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from eaglespec.layers import short_attention_kernel as sak

LEN = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
H, HKV, D = 9, 3, 64
g = torch.Generator(device="cuda").manual_seed(0)
print(f"| rows | max err kernel | max err SDPA | kernel us | SDPA us |\n|---:|---:|---:|---:|---:|")
for B in (64, 256, 1024):
    q = torch.randn(B, 1, H, D, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, LEN, HKV, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, LEN, HKV, D, device="cuda", generator=g).bfloat16()
    lens = torch.randint(16, LEN + 1, (B,), device="cuda", generator=g)
    mask = torch.arange(LEN, device="cuda")[None, None, :] < lens[:, None, None]  # [B, 1, LEN]
    rows = torch.arange(B, device="cuda")
    kr, vr = (x.repeat_interleave(H // HKV, dim=2).transpose(1, 2) for x in (k, v))  # [B, H, LEN, D]
    qt = q.transpose(1, 2)

    def sdpa(dt=torch.bfloat16):
        return F.scaled_dot_product_attention(qt.to(dt), kr.to(dt), vr.to(dt), attn_mask=mask[:, None]).transpose(1, 2)

    ref = sdpa(torch.float32)
    out_k = sak.short_attention(q, k, v, rows, mask)
    out_s = sdpa()
    times = []
    for fn in (lambda: sak.short_attention(q, k, v, rows, mask), sdpa):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 20 * 1e3)
    print(f"| {B} | {(out_k.float() - ref).abs().max().item():.4f} | {(out_s.float() - ref).abs().max().item():.4f} "
          f"| {times[0]:.0f} | {times[1]:.0f} |", flush=True)
