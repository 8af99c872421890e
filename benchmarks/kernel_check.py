"""The fused RoPE + KV-store Triton kernel against the PyTorch path on the GPU (random tensors, SmolLM2's and
Llama-8B's head shapes, float32 and bfloat16, with and without a folded norm's scale). Exits 1 on a mismatch, so a
device script can stop before it spends time on an engine that would compute garbage.

usage: python benchmarks/kernel_check.py
"""

from __future__ import annotations

import sys

import torch

from eaglespec.layers.rope_kv_kernel import rope_store, rope_store_reference

bad = 0
g = torch.Generator(device="cuda").manual_seed(0)
cases = [(H, Hkv, D, dtype, tol, B, T, norm)
         for H, Hkv, D in ((9, 3, 64), (32, 8, 128))
         for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2 ** -5))
         for B, T in ((1, 1), (4, 8), (32, 1), (32, 4)) for norm in (False, True)]
for H, Hkv, D, dtype, tol, B, T, norm in cases:
    S, Bc = 64, B + 3
    qkv = torch.randn(B, T, H + 2 * Hkv, D, generator=g, device="cuda").to(dtype)
    cos = torch.randn(B, T, D // 2, generator=g, device="cuda")
    sin = torch.randn(B, T, D // 2, generator=g, device="cuda")
    norm_of = (torch.randn(B, T, 576, generator=g, device="cuda").to(dtype), 1e-5) if norm else None
    caches = [torch.full((Bc, S, Hkv, D), 7.0, dtype=dtype, device="cuda") for _ in range(4)]
    rows = torch.randperm(Bc, device="cuda")[:B]
    widx = torch.stack([torch.randperm(S, device="cuda")[:T] for _ in range(B)])
    q1 = rope_store(qkv, cos, sin, caches[0], caches[1], rows, widx, H, Hkv, norm_of=norm_of)
    q2 = rope_store_reference(qkv, cos, sin, caches[2], caches[3], rows, widx, H, Hkv, norm_of=norm_of)
    err = max((q1.float() - q2.float()).abs().max().item(), (caches[0].float() - caches[2].float()).abs().max().item(),
              (caches[1].float() - caches[3].float()).abs().max().item())
    scale = max(q2.float().abs().max().item(), caches[2].float().abs().max().item(), 1.0)
    ok = err <= tol * scale and (norm or torch.equal(caches[1], caches[3]))  # v is copied unless scaled
    bad += not ok
    print(f"rope_store H={H} Hkv={Hkv} D={D} {dtype} B={B} T={T} norm={norm}: max err {err:.2e} {'ok' if ok else 'MISMATCH'}")
print("kernel check:", "all ok" if not bad else f"{bad} MISMATCHES")
sys.exit(1 if bad else 0)
