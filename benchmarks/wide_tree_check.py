"""Session 62's two changes for large one-row trees (S6 K8 D48: a 48-token verify of 144 query rows for SmolLM2, a
selection among 328 candidates) on the GPU, before their whole-step timing: right, and faster per call.

1. `tree_build_kernels.select_tree` past 128 candidates (a sort of unique keys, parents through a scratch row)
   against `build_tree`'s PyTorch path: random candidate trees (tests/tiny.py's `graded_candidates`: scores on a
   grid of 0.5, many ties), N = 150 / 200 / 328: the same tokens, parents and depths. Then us per call (a CUDA
   graph of 50 calls) of both at B = 1 and 8.
2. `short_attention` of a one-row step of T tokens (SmolLM2's heads: 9 query, 3 KV, 64 wide; bf16) in query tiles
   of the split kernels against the prompt kernel (ONE_ROW_MAX_QUERY_ROWS lowered to 64), both against SDPA in
   float32 (largest absolute error), then us per call, at T = 24 / 48 / 64 and 180 / 600 / 1,500 cached positions.
Prints one JSON line per row (also OUT/wide_tree_check.json); exits 1 on a mismatch of (1).

usage: python benchmarks/wide_tree_check.py OUT_DIR   (PYTHONPATH=src)
"""

from __future__ import annotations

import sys
from pathlib import Path

from probe_script import Emitter, per_call_us  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny import graded_candidates  # noqa: E402

import torch  # noqa: E402

from eaglespec.layers import short_attention_kernel as sak  # noqa: E402
from eaglespec.layers.attention import sdpa  # noqa: E402
from eaglespec.spec.tree import build_tree  # noqa: E402

emit = Emitter("wide_tree_check.json")
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
bad = 0


for K, S, D in ((6, 5, 40), (8, 4, 30), (8, 6, 48)):
    for B in (1, 8):
        c = graded_candidates(B, K, S, g)
        ref = build_tree(*c, D, K, S, kernels=False)
        got = build_tree(*c, D, K, S, kernels=True)
        same = all(torch.equal(getattr(got, f), getattr(ref, f)) for f in ("tokens", "parents", "depth", "paths"))
        bad += not same
        emit({"check": "select_tree", "N": c[1].shape[1], "D": D, "B": B, "same_tree": same,
              "kernel_us": round(per_call_us(lambda: build_tree(*c, D, K, S, kernels=True)), 2),
              "pytorch_us": round(per_call_us(lambda: build_tree(*c, D, K, S, kernels=False)), 2)})

H, Hkv, Dh = 9, 3, 64
for T in (24, 48, 64):
    for L in (180, 600, 1500):
        Bc, Smax = 2, L + 64
        q = torch.randn(1, T, H, Dh, generator=g, device=dev).to(torch.bfloat16)
        kc = torch.randn(Bc, Smax, Hkv, Dh, generator=g, device=dev).to(torch.bfloat16)
        vc = torch.randn(Bc, Smax, Hkv, Dh, generator=g, device=dev).to(torch.bfloat16)
        rows = torch.tensor([1], device=dev)
        K = L + T
        mask = torch.zeros(1, T, K, dtype=torch.bool, device=dev)
        mask[:, :, :L] = True
        mask[0, :, L:] = (torch.rand(T, T, generator=g, device=dev) < 0.3).tril() | torch.eye(T, dtype=torch.bool,
                                                                                              device=dev)
        want = sdpa(q.float(), kc[rows, :K].float(), vc[rows, :K].float(), mask, None)
        row = {"check": "attention", "T": T, "cached": L}
        for name, limit in (("tiles", sak.ONE_ROW_MAX_QUERY_ROWS), ("prompt", sak.MAX_QUERY_ROWS)):
            old, sak.ONE_ROW_MAX_QUERY_ROWS = sak.ONE_ROW_MAX_QUERY_ROWS, limit
            try:
                out = sak.short_attention(q, kc, vc, rows, mask)
                row[f"{name}_err"] = round(float((out.float() - want).abs().max()), 5)
                row[f"{name}_us"] = round(per_call_us(lambda: sak.short_attention(q, kc, vc, rows, mask)), 2)
            finally:
                sak.ONE_ROW_MAX_QUERY_ROWS = old
        emit(row)
sys.exit(1 if bad else 0)
