"""Would splitting the K reduction of o_proj and down_proj across programs, with the next kernel summing the partial
products as it loads its residual delta, make steps of 5-64 rows cheaper on tensor cores?

Session 28 found the tensor-core projection's time follows K (about 1.2 ns per input at 8 rows: o_proj 1.93 us for
K = 576, down_proj 3.08 us for K = 1,536, each on 18 programs), a serial chain per program; a batched dot over chunks
inside one program lost to its layout changes. Here each of S programs per output tile multiplies one K-slice and
stores its float32 partial product [S, M, N]; the consumer (the next add + RMSNorm + projection kernel, which adds
the delta to the residual stream anyway) sums the S partials as it loads the delta, rounds the sum to the model's
dtype (where the module path rounds the projection) and goes on as before. No reduction kernel, no atomics, and the
same float32 sums in a fixed order (deterministic).

The probe emulates 30 SmolLM2-135M layers of the fused path minus RoPE and attention: (add, norm, q/k/v), o_proj (of
a fixed input standing in for the attention's output), (add, norm, gate/up, SiLU), down_proj; distinct random bf16
weights per layer (212 MB, past L2, as in a step), PDL on, one CUDA graph per (variant, rows), ms per replay.
`base` is the engine's own kernels (layers/norm_linear_kernel.py); `So/Sd` the probe's kernels with o_proj split in
So and down_proj in Sd slices (`1/1`: the same products with float32 partial stores, the control).

usage: python benchmarks/split_k_probe.py OUT_DIR [--rows=5,8,16,32,64] [--variants=1/1,1/2,...] [--cpu]
"""

from __future__ import annotations

import torch

from probe_script import CPU, DEV, DT, Emitter, option, replay_ms  # noqa: E402  (sets the interpreter first)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from eaglespec.bench.graph_timing import capture  # noqa: E402
from eaglespec.layers.norm_linear_kernel import _k_chunks, add_norm_linear, linear_rows  # noqa: E402
from eaglespec.layers.pdl import launch_options  # noqa: E402

H, I, QKV, LAYERS = (576, 1536, 960, 30) if not CPU else (64, 128, 96, 2)
EPS = 1e-5
BM, BN, WARPS = 16, 32, 4


@triton.jit
def _dot(x, w, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
    return tl.dot(x, w)


@triton.jit
def split_linear_kernel(x, w, part, M, N, K: tl.constexpr, KS: tl.constexpr, SK1: tl.constexpr, SK2: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False):
    """part[s] = x[:, s*KS:(s+1)*KS] @ w[:, s*KS:(s+1)*KS].T in float32; program (n, m, s); KS = SK1 + SK2."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < N
    k0 = pid_s * KS
    rk1 = k0 + tl.arange(0, SK1)
    w1 = tl.load(w + rn[None, :] * K + rk1[:, None], mask=nm[None, :], other=0.0)
    if SK2 > 0:
        rk2 = k0 + SK1 + tl.arange(0, SK2)
        w2 = tl.load(w + rn[None, :] * K + rk2[:, None], mask=nm[None, :], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rl = tl.minimum(rm, M - 1)
    acc = _dot(tl.load(x + rl[:, None] * K + rk1[None, :]), w1, IEEE)
    if SK2 > 0:
        acc += _dot(tl.load(x + rl[:, None] * K + rk2[None, :]), w2, IEEE)
    tl.store(part + pid_s * M * N + rm[:, None] * N + rn[None, :], acc, mask=(rm < M)[:, None] & nm[None, :])


@triton.jit
def consumer_kernel(h, d, nw, w, h_out, y, M, N, eps, K: tl.constexpr, D_SPLIT: tl.constexpr, GATED: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BK1: tl.constexpr, BK2: tl.constexpr,
                    IEEE: tl.constexpr, PDL: tl.constexpr = False):
    """norm_linear_dot_kernel with HAS_D and NORM, its delta given as D_SPLIT float32 partials [D_SPLIT, M, K]."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    dt = h_out.dtype.element_ty
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = rn < N
    rk1 = tl.arange(0, BK1)
    km1 = rk1 < K
    wm1 = km1[:, None] & nm[None, :]
    w1 = tl.load(w + rn[None, :] * K + rk1[:, None], mask=wm1, other=0.0)
    if GATED:
        u1 = tl.load(w + (rn + N)[None, :] * K + rk1[:, None], mask=wm1, other=0.0)
    g1 = tl.load(nw + rk1, mask=km1, other=0.0).to(tl.float32)
    if BK2 > 0:
        rk2 = BK1 + tl.arange(0, BK2)
        km2 = rk2 < K
        wm2 = km2[:, None] & nm[None, :]
        w2 = tl.load(w + rn[None, :] * K + rk2[:, None], mask=wm2, other=0.0)
        if GATED:
            u2 = tl.load(w + (rn + N)[None, :] * K + rk2[:, None], mask=wm2, other=0.0)
        g2 = tl.load(nw + rk2, mask=km2, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_wait()
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mm = rm < M
    rl = tl.minimum(rm, M - 1)
    dsum1 = tl.load(d + rl[:, None] * K + rk1[None, :], mask=km1[None, :], other=0.0)
    for s in tl.static_range(1, D_SPLIT):
        dsum1 += tl.load(d + s * M * K + rl[:, None] * K + rk1[None, :], mask=km1[None, :], other=0.0)
    x1 = (tl.load(h + rl[:, None] * K + rk1[None, :], mask=km1[None, :], other=0.0).to(tl.float32)
          + dsum1.to(dt).to(tl.float32)).to(dt)
    if pid_n == 0:
        tl.store(h_out + rm[:, None] * K + rk1[None, :], x1, mask=mm[:, None] & km1[None, :])
    if BK2 > 0:
        dsum2 = tl.load(d + rl[:, None] * K + rk2[None, :], mask=km2[None, :], other=0.0)
        for s in tl.static_range(1, D_SPLIT):
            dsum2 += tl.load(d + s * M * K + rl[:, None] * K + rk2[None, :], mask=km2[None, :], other=0.0)
        x2 = (tl.load(h + rl[:, None] * K + rk2[None, :], mask=km2[None, :], other=0.0).to(tl.float32)
              + dsum2.to(dt).to(tl.float32)).to(dt)
        if pid_n == 0:
            tl.store(h_out + rm[:, None] * K + rk2[None, :], x2, mask=mm[:, None] & km2[None, :])
    x1f = x1.to(tl.float32)
    ss = tl.sum(x1f * x1f, axis=1)
    if BK2 > 0:
        x2f = x2.to(tl.float32)
        ss += tl.sum(x2f * x2f, axis=1)
    r = 1.0 / tl.sqrt(ss / K + eps)
    x1 = ((x1f * r[:, None]).to(dt).to(tl.float32) * g1[None, :]).to(dt)
    if BK2 > 0:
        x2 = ((x2f * r[:, None]).to(dt).to(tl.float32) * g2[None, :]).to(dt)
    acc = _dot(x1, w1, IEEE)
    if BK2 > 0:
        acc += _dot(x2, w2, IEEE)
    out = acc.to(dt)
    if GATED:
        up = _dot(x1, u1, IEEE)
        if BK2 > 0:
            up += _dot(x2, u2, IEEE)
        gv = out.to(tl.float32)
        out = ((gv / (1.0 + tl.exp(-gv))).to(dt).to(tl.float32) * up.to(dt).to(tl.float32)).to(dt)
    tl.store(y + rm[:, None] * N + rn[None, :], out, mask=mm[:, None] & nm[None, :])


def _slice_chunks(ks: int) -> tuple[int, int]:
    a = 1 << (ks.bit_length() - 1)
    b = ks - a
    assert b == 0 or (b & (b - 1) == 0 and b >= 16), f"slice {ks} is not a power of two plus one >= 16"
    return max(a, 16), b


def split_linear(x: torch.Tensor, w: torch.Tensor, part: torch.Tensor, s: int) -> torch.Tensor:
    M, K = x.shape
    N = w.shape[0]
    ks = K // s
    sk1, sk2 = _slice_chunks(ks)
    grid = ((N + BN - 1) // BN, (M + BM - 1) // BM, s)
    split_linear_kernel[grid](x, w, part, M, N, K=K, KS=ks, SK1=sk1, SK2=sk2, BLOCK_M=BM, BLOCK_N=BN, IEEE=CPU,
                              num_warps=WARPS, **launch_options(x))
    return part


def consumer(h, part, s, nw, w, h_out, y, gated):
    M, K = h.shape
    N = y.shape[1]
    bk1, bk2 = _k_chunks(K)
    bk1, bk2 = max(bk1, 16), (max(bk2, 16) if bk2 else 0)
    bn = BN if not (gated and K > 1024) else 16
    grid = ((N + bn - 1) // bn, (M + BM - 1) // BM)
    consumer_kernel[grid](h, part, nw, w, h_out, y, M, N, EPS, K=K, D_SPLIT=s, GATED=gated, BLOCK_M=BM, BLOCK_N=bn,
                          BK1=bk1, BK2=bk2, IEEE=CPU, num_warps=WARPS, **launch_options(h))


def weights():
    g = torch.Generator(device="cpu").manual_seed(0)
    def r(*shape):
        return (torch.randn(*shape, generator=g) * 0.04).to(DT).to(DEV)
    return [dict(qkv=r(QKV, H), o=r(H, H), gu=r(2 * I, H), d=r(H, I), n1=1 + r(H) , n2=1 + r(H)) for _ in range(LAYERS)]


class Chain:
    """The 30-layer chain for M rows in one variant (None: the engine's kernels; (So, Sd): the probe's)."""

    def __init__(self, W, M: int, variant):
        self.W, self.M, self.v = W, M, variant
        g = torch.Generator(device="cpu").manual_seed(1)
        self.h0 = torch.randn(M, H, generator=g).to(DT).to(DEV)
        self.attn = (torch.randn(M, H, generator=g) * 0.5).to(DT).to(DEV)  # stands in for the attention's output
        if variant is not None:
            so, sd = variant
            self.hs = [torch.empty(M, H, dtype=DT, device=DEV) for _ in range(2)]
            self.qkv = torch.empty(M, QKV, dtype=DT, device=DEV)
            self.act = torch.empty(M, I, dtype=DT, device=DEV)
            self.po = torch.empty(so, M, H, dtype=torch.float32, device=DEV)
            self.pd = torch.empty(sd, M, H, dtype=torch.float32, device=DEV)
            self.zero = torch.zeros(1, M, H, dtype=torch.float32, device=DEV)

    def run(self) -> torch.Tensor:
        if self.v is None:
            h, delta = self.h0, None
            for w in self.W:
                h, _ = add_norm_linear(h, delta, w["n1"], EPS, w["qkv"], False)
                h, act = add_norm_linear(h, linear_rows(self.attn, w["o"]), w["n2"], EPS, w["gu"], True)
                delta = linear_rows(act, w["d"])
            return h + delta
        so, sd = self.v
        h, part, s = self.h0, self.zero, 1
        for i, w in enumerate(self.W):
            consumer(h, part, s, w["n1"], w["qkv"], self.hs[0], self.qkv, False)
            split_linear(self.attn, w["o"], self.po, so)
            consumer(self.hs[0], self.po, so, w["n2"], w["gu"], self.hs[1], self.act, True)
            part, s = split_linear(self.act, w["d"], self.pd, sd), sd
            h = self.hs[1]
        return h + part.sum(0).to(DT)


def graph_of(fn):
    return None if CPU else capture(fn)


def main() -> None:
    rows = [int(r) for r in option("rows", "5,8,16,32,64").split(",")]
    variants = [None] + [tuple(int(x) for x in v.split("/")) for v in
                         option("variants", "1/1,1/2,1/3,2/3,3/3,1/4,2/4,2/6").split(",")]
    emit = Emitter("split_k_probe.json")
    W = weights()
    for M in rows:
        chains = {v: Chain(W, M, v) for v in variants}
        ref = chains[None].run().float()
        graphs = {v: graph_of(c.run) for v, c in chains.items()}
        for rnd in range(2):
            for v, c in chains.items():
                out = c.run().float()
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                ms = replay_ms([graphs[v]], n=200) if not CPU else float("nan")
                emit({"rows": M, "variant": "base" if v is None else f"{v[0]}/{v[1]}", "round": rnd,
                      "ms": round(ms, 4), "rel_err": round(err, 5)})
    base = {}
    print(f"\n{'rows':>4} {'variant':>7} {'ms (round 0 / 1)':>18} {'vs base':>8} {'rel err':>8}")
    for r in emit.rows:
        key = (r["rows"], r["variant"])
        base.setdefault(key, []).append(r)
    for (M, v), rs in base.items():
        b = sum(x["ms"] for x in base[(M, "base")]) / 2
        m = sum(x["ms"] for x in rs) / 2
        print(f"{M:>4} {v:>7} {rs[0]['ms']:>8.4f} / {rs[-1]['ms']:.4f} {m / b - 1:>+8.1%} {rs[0]['rel_err']:>8.5f}")


main()
