"""MLA's latent-cache attention kernel (layers/mla_attention_kernel.py) against the eager absorbed attention it
replaced, alone: time per call in a CUDA graph and error against a float32 reference, by query tokens T and cached
positions K, at DeepSeek-V3 / Kimi-K2.5's shape (64 heads, latent rank 512, rope 64; bf16), one row.

    python benchmarks/mla_kernel_check.py OUT [--cpu] [--float32]
    python benchmarks/with_setting.py eaglespec.layers.mla_attention_kernel.BLOCK_Q=32 \
        eaglespec.layers.mla_attention_kernel.WARPS=8 -- \
        benchmarks/mla_kernel_check.py OUT                      (the kernel's settings, A/B in one call)

The eager side is `MLAttention._absorbed`'s attention: the cache prefix read out (`read_cache` + cast) and SDPA over
one shared head of R + P dims (the module's W_UK / W_UV products, the same on both paths, are left out). `--cpu`:
Triton's interpreter and tiny shapes, a check of the script. Session 56 found the kernel slower than needed for an
8-token verify (512 query rows in 32 tiles, each reading every block): this is the probe to tune it with.
"""

from __future__ import annotations

from probe_script import CPU, DEV, DT, Emitter, per_call_us  # noqa: E402  (sets the interpreter for --cpu)

import torch  # noqa: E402

from eaglespec.layers import mla_attention_kernel as mk  # noqa: E402
from eaglespec.layers.attention import sdpa  # noqa: E402

H, R, P = (4, 32, 16) if CPU else (64, 512, 64)
TOKENS = (1, 4) if CPU else (1, 4, 8, 16, 48)
LENGTHS = (40, 150) if CPU else (256, 1024, 4096)
SCALE = 0.1


def inputs(T: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, K + 16, R + P, generator=g).to(DEV, DT)
    q_lat = torch.randn(1, T, H, R, generator=g).to(DEV, DT)
    q_pe = torch.randn(1, T, H, P, generator=g).to(DEV, DT)
    rows = torch.tensor([1], device=DEV)
    pos = torch.arange(K, device=DEV)
    mask = (pos[None, None, :] <= (K - T + torch.arange(T, device=DEV))[None, :, None]).contiguous()  # causal tail
    return q_lat, q_pe, cache, rows, mask


def eager(q_lat, q_pe, cache, rows, mask):
    lat = cache[rows, : mask.shape[-1]].to(q_lat.dtype)  # read_cache's copy
    return sdpa(torch.cat([q_lat, q_pe], -1), lat[:, :, None], lat[:, :, None, :R], mask, SCALE)


def reference(q_lat, q_pe, cache, rows, mask):
    lat = cache[rows, : mask.shape[-1]].float()
    s = torch.einsum("bthd,bkd->bthk", torch.cat([q_lat, q_pe], -1).float(), lat) * SCALE
    return torch.einsum("bthk,bkr->bthr", torch.softmax(s.masked_fill(~mask[:, :, None], float("-inf")), -1),
                        lat[..., :R])


def main() -> None:
    emit = Emitter("mla_kernel.json")
    torch.backends.cuda.matmul.allow_tf32 = False
    for T in TOKENS:
        for K in LENGTHS:
            args = inputs(T, K)
            ref = reference(*args)
            out = mk.mla_attention(*args, SCALE)
            err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            bq = mk.query_tile(T, H, K)[0]
            bkv = mk.block_kv(R, P, DT.itemsize, None if CPU else mk.shared_limit(DEV), bq)
            emit(dict(T=T, K=K, plan=mk.plan(1, T, H, K, bkv, bq), block_q=bq,
                      kernel_us=round(per_call_us(lambda: mk.mla_attention(*args, SCALE)), 2),
                      eager_us=round(per_call_us(lambda: eager(*args)), 2), rel_err=f"{err:.2e}"))
    print("\n| T | K | (tiles, blocks, blocks a split, splits) | kernel us | eager us | error / max |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for r in emit.rows:
        print(f"| {r['T']} | {r['K']} | {r['plan']} | {r['kernel_us']} | {r['eager_us']} | {r['rel_err']} |")


if __name__ == "__main__":
    main()
