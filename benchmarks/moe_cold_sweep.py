"""Tiles for a MoE layer's decode-time kernels with the weights cold in L2, as a step of a whole model meets them
(session 55; session 54's sweep read one layer's experts warm from the 50 MB L2).

Session 55's profile of Qwen3-30B-A3B's batch-1 decode step on an H100 (`step_trace.py OUT qwen3-30b-a3b`): the
grouped GEMMs took 20.6 + 12.2 us a layer where their 75 MB read at ~3.3 TB/s is ~23 us; the gate/up GEMM's 8 experts
at BLOCK_N 64 are 96 programs of 512 KB each, fewer than the 132 SMs. Here, per layer shape and token count:

1. gemm: `moe_kernel._grouped_gemm` for the gate/up GEMM (SiLU epilogue) and the down GEMM (pair weights) apart,
   each over (BLOCK_N, BLOCK_K, num_warps, num_stages) configurations; every call of a graph of 48 takes its own
   random routing (16 layouts in turn), so the experts read are cold; us per call and GB/s over the distinct
   experts' bytes of that GEMM. `default` is `_gemm_cfg`'s choice.
2. gemv: `gemv_kernel.gemv_rows` against F.linear (cuBLAS) for one row of the dense projections of the MoE targets'
   layers (Qwen3-30B-A3B's q/k/v, router gate and o_proj; Kimi-K2.5's / DeepSeek-V3's MLA projections, shared
   expert and float32 gate) and Llama-3.1-8B's, weights cold (copies in turn), over (BLOCK_N, BLOCK_K, num_warps,
   num_stages) and `cfg_for`'s choice ("own").
3. gemv_rows: those shapes at 1, 2 and 4 rows, cuBLAS against `cfg_for`'s choice.
4. sum: the k pair rows' float32 sum rounded to bf16: PyTorch's sum + cast (two kernels) against `sum_pairs`.

usage: python benchmarks/moe_cold_sweep.py OUT_DIR [--cpu] [--only=gemm|gemv|gemv_rows|sum] [--shapes=a,b]
       [--tokens=1,4] [--gemv=SUBSTRING] [--cfgs=32x256x4x3,...] [--gemv-cfgs=4x1024x2x4,...]   (the layer shapes
       of SHAPES, the token counts, the GEMV_SHAPES whose label holds SUBSTRING, the grouped GEMMs' and the GEMV
       kernel's configurations; default all)
"""

from __future__ import annotations

import sys
import time

from probe_script import CPU, DEV, DT, Emitter, option, per_call_us  # noqa: E402  (sets the interpreter for --cpu)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from eaglespec.layers import gemv_kernel as gvk  # noqa: E402
from eaglespec.layers import moe_kernel as mk  # noqa: E402

emit = Emitter("moe_cold_sweep.json")
ONLY = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")), None)
T0 = time.perf_counter()


def wanted(section: str) -> bool:
    return ONLY is None or ONLY == section


def cold_copies(shape: tuple[int, ...], total: int = 256 << 20) -> list[torch.Tensor]:
    """Copies of a random weight, enough that cycling through them keeps each cold in L2."""
    n = 1
    for s in shape:
        n *= s
    count = 1 if CPU else max(1, -(-total // (n * 2)))
    return [torch.randn(shape, device=DEV, dtype=DT) * shape[-1] ** -0.5 for _ in range(count)]


SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "deepseek-v3": (256, 8, 7168, 2048),  # E, k, H, I
          "gpt-oss-20b": (32, 4, 2880, 2880)}
TOKENS = (1, 4, 8, 32, 64)
if option("shapes", ""):
    SHAPES = {k: SHAPES[k] for k in option("shapes", "").split(",")}
if option("tokens", ""):
    TOKENS = tuple(int(t) for t in option("tokens", "").split(","))
GEMM_CFGS = [(bn, bk, w, s) for bn in (16, 32, 64, 128) for bk in (64, 128, 256)
             for w, s in ((4, 2), (4, 3), (4, 4), (8, 3))]
if option("cfgs", ""):
    GEMM_CFGS = [tuple(int(v) for v in c.split("x")) for c in option("cfgs", "").split(",")]
if CPU:
    SHAPES, TOKENS, GEMM_CFGS = {"tiny": (8, 2, 64, 32)}, (1, 3), [(16, 32, 4, 2), (32, 64, 4, 3)]


def sweep_gemm() -> None:
    g = torch.Generator().manual_seed(0)
    for label, (E, k, H, I) in SHAPES.items():
        w13 = torch.randn(E, 2 * I, H, device=DEV, dtype=DT) * H ** -0.5
        w2 = torch.randn(E, H, I, device=DEV, dtype=DT) * I ** -0.5
        for N in TOKENS:
            P = N * k
            bm = mk.block_m_for(P, E)
            layouts = []
            for _ in range(16):
                ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)]).to(DEV)
                pairs, be = mk.expert_blocks(ids, E, bm)
                layouts.append((pairs, be, ids.unique().numel()))
            experts = sum(n for _, _, n in layouts) / len(layouts)
            x = torch.randn(N, H, device=DEV, dtype=DT)
            act = torch.randn(P, I, device=DEV, dtype=DT)
            scale = torch.rand(P, device=DEV)
            out13 = torch.empty(P, I, device=DEV, dtype=DT)
            out2 = torch.empty(P, H, device=DEV, dtype=torch.float32)
            for which, nbytes in (("gate_up", 2 * I * H * 2), ("down", H * I * 2)):
                def call(cfg):  # noqa: ANN001, ANN202
                    turn = [0]

                    def one() -> None:
                        pairs, be, _ = layouts[turn[0] % len(layouts)]
                        turn[0] += 1
                        if which == "gate_up":
                            mk._grouped_gemm(x, w13, pairs, be, bm, P, k, out13, True, None, cfg=cfg)
                        else:
                            mk._grouped_gemm(act, w2, pairs, be, bm, P, 1, out2, False, scale, cfg=cfg)
                    return one

                default = mk._gemm_cfg(H, which == "gate_up", bm, P)
                base = per_call_us(call(default), 48)
                ref = (out13 if which == "gate_up" else out2).float().clone()
                best = (base, default)
                for cfg in GEMM_CFGS:
                    try:
                        us = per_call_us(call(cfg), 48)
                    except Exception as e:  # noqa: BLE001  (a tile over the shared memory: skipped)
                        emit({"gemm": which, "shape": label, "N": N, "cfg": cfg, "error": type(e).__name__})
                        continue
                    err = ((out13 if which == "gate_up" else out2).float() - ref).abs().max().item()
                    best = min(best, (us, cfg))
                    emit({"gemm": which, "shape": label, "N": N, "cfg": cfg, "us": round(us, 2),
                          "GBps": round(experts * nbytes / (us * 1e-6) / 1e9), "max_diff": err})
                emit({"gemm": which, "shape": label, "N": N, "experts": experts, "default": default,
                      "default_us": round(base, 2), "best": best[1], "best_us": round(best[0], 2),
                      "best_GBps": round(experts * nbytes / (best[0] * 1e-6) / 1e9),
                      "t": round(time.perf_counter() - T0)})


GEMV_SHAPES = {"qwen3 qkv": (5120, 2048), "qwen3 gate": (128, 2048), "qwen3 o_proj": (2048, 4096),
               "mla q_a": (1536, 7168), "mla kv_a": (576, 7168), "mla q_b": (12288, 1536),
               "deepseek shared down": (7168, 2048), "kimi gate fp32": (384, 7168),
               "llama-8b qkv": (6144, 4096), "llama-8b o_proj": (4096, 4096), "llama-8b down": (4096, 14336),
               "gpt-oss qkv": (5120, 2880), "gpt-oss o_proj": (2880, 4096), "gpt-oss gate": (32, 2880),
               "qwen2.5-7b qkv": (4608, 3584), "qwen2.5-7b o_proj": (3584, 3584), "qwen2.5-7b down": (3584, 18944),
               "llama-70b qkv": (10240, 8192), "llama-70b o_proj": (8192, 8192), "mixtral-8x7b qkv": (6144, 4096),
               "glm-4.5-air o_proj": (4096, 12288)}
GEMV_SHAPES = {k: v for k, v in GEMV_SHAPES.items() if option("gemv", "") in k}
GEMV_CFGS = [(bn, bk, w, s) for bn in (1, 2, 4, 8, 16) for bk in (512, 1024)
             for w, s in ((2, 4), (4, 3), (4, 4), (8, 3))]
if option("gemv-cfgs", ""):
    GEMV_CFGS = [tuple(int(v) for v in c.split("x")) for c in option("gemv-cfgs", "").split(",")]
if CPU:
    GEMV_SHAPES, GEMV_CFGS = {"tiny": (48, 64), "tiny fp32": (16, 64)}, [(4, 32, 2, 2)]


def sweep_gemv() -> None:
    for label, (N, K) in GEMV_SHAPES.items():
        dt = torch.float32 if "fp32" in label else DT  # a noaux_tc router's gate: float32 weights and input
        copies = [c.to(dt) for c in cold_copies((N, K))]
        x = torch.randn(1, K, device=DEV, dtype=dt)
        turn = [0]

        def lin() -> torch.Tensor:
            turn[0] += 1
            return F.linear(x, copies[turn[0] % len(copies)])

        cublas = per_call_us(lin, 50)
        best = (float("inf"), None)
        for cfg in GEMV_CFGS + [None]:  # None: gemv_kernel's own choice for the shape
            def one(cfg=cfg) -> torch.Tensor:  # noqa: ANN001
                turn[0] += 1
                return gvk.gemv_rows(x, copies[turn[0] % len(copies)], cfg)

            try:
                us = per_call_us(one, 50)
            except Exception as e:  # noqa: BLE001
                emit({"gemv": label, "cfg": cfg, "error": type(e).__name__})
                continue
            emit({"gemv": label, "cfg": cfg or "own", "us": round(us, 2)})
            if cfg is not None:
                best = min(best, (us, cfg))
            else:
                own = us
        nbytes = N * K * x.element_size()
        emit({"gemv": label, "N": N, "K": K, "cublas_us": round(cublas, 2),
              "cublas_GBps": round(nbytes / (cublas * 1e-6) / 1e9), "own_cfg": gvk.cfg_for(N, K, x.element_size()),
              "own_us": round(own, 2), "best": best[1], "best_us": round(best[0], 2),
              "best_GBps": round(nbytes / (best[0] * 1e-6) / 1e9), "t": round(time.perf_counter() - T0)})


def sweep_gemv_rows() -> None:
    """The same shapes at 1, 2 and 4 rows (a verify of a few tokens at one row): cuBLAS against `cfg_for`'s choice."""
    for label, (N, K) in GEMV_SHAPES.items():
        dt = torch.float32 if "fp32" in label else DT
        copies = [c.to(dt) for c in cold_copies((N, K))]
        for M in (1, 2, 4):
            x = torch.randn(M, K, device=DEV, dtype=dt)
            turn = [0]

            def lin() -> torch.Tensor:
                turn[0] += 1
                return F.linear(x, copies[turn[0] % len(copies)])

            def own() -> torch.Tensor:
                turn[0] += 1
                return gvk.gemv_rows(x, copies[turn[0] % len(copies)])

            emit({"gemv_rows": label, "M": M, "cublas_us": round(per_call_us(lin, 50), 2),
                  "own_us": round(per_call_us(own, 50), 2)})


def sweep_sum() -> None:
    for label, (E, k, H, I) in SHAPES.items():
        for N in TOKENS:
            y = torch.randn(N * k, H, device=DEV)
            torch_us = per_call_us(lambda: y.view(N, k, H).sum(1).to(DT), 50)
            ours = per_call_us(lambda: mk.sum_pairs(y, N, k, DT), 50)
            same = torch.equal(y.view(N, k, H).sum(1).to(DT), mk.sum_pairs(y, N, k, DT))
            emit({"sum": label, "N": N, "torch_us": round(torch_us, 2), "sum_pairs_us": round(ours, 2),
                  "equal": same})


if wanted("sum"):
    sweep_sum()
if wanted("gemv"):
    sweep_gemv()
if wanted("gemv_rows"):
    sweep_gemv_rows()
if wanted("gemm"):
    sweep_gemm()
print("\n| kernel | shape | N | default us | best | best us | GB/s |")
print("| --- | --- | ---: | ---: | --- | ---: | ---: |")
for r in emit.rows:
    if "best" in r and "gemm" in r:
        print(f"| {r['gemm']} | {r['shape']} | {r['N']} | {r['default_us']} | {r['best']} | {r['best_us']} | "
              f"{r['best_GBps']} |")
    elif "best" in r:
        print(f"| gemv {r['gemv']} | {r['N']}x{r['K']} | 1 | cuBLAS {r['cublas_us']}, own {r['own_cfg']} "
              f"{r['own_us']} | {r['best']} | {r['best_us']} | {r['best_GBps']} |")
    elif "gemv_rows" in r:
        print(f"| gemv {r['gemv_rows']} | {r['M']} rows | | cuBLAS {r['cublas_us']} | own | {r['own_us']} | |")
    elif "sum" in r:
        print(f"| sum | {r['sum']} | {r['N']} | torch {r['torch_us']} | sum_pairs | {r['sum_pairs_us']} | "
              f"{r['equal']} |")
