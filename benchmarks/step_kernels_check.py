"""The decode-step Triton kernels on the GPU: the fused add + RMSNorm + projection (layers/norm_linear_kernel.py) and
the short-query attention (layers/short_attention_kernel.py): correctness in bf16, time against the path each
replaces, and what they do to whole decode and verify steps.

1. kernel: for the projections of SmolLM2-135M (q/k/v and gate/up, with the residual add) and M = 1, 2, 4 rows:
   the largest difference from `add_norm_linear_reference` in bf16 rounding steps (of the larger of the value and
   the mean magnitude), and the time per call (a CUDA graph of 50 calls) of the kernel's default configuration, of
   the best of a sweep, and of the replaced path (compiled add + RMSNorm, cuBLAS GEMM, compiled SiLU gating).
   attention: SmolLM2's and Llama-8B's heads, T = 1, 4, 8, 16 query tokens, 256 and 1024 cached positions: the
   largest difference from SDPA and the time per call of both (SDPA with its mask-to-bias conversion).
2. engine: random-weight SmolLM2-135M and Llama-3.1-8B shapes, bf16, batch 1, a 128-token prompt and 256 new tokens
   (`ignore_eos`), CUDA graphs, overlap (the defaults): tok/s, decode ms per step, and the verify step of an oracle
   chain of D = 4 and D = 8 tokens, with neither kernel, the norm + projection kernel only, and both (the default).
3. batches: plain decoding of 1, 2, 4, 8 rows with and without the attention kernel.

usage: python benchmarks/step_kernels_check.py OUT_DIR [--cpu]
       [--only=kernel|attention|smollm2-135m|llama-3.1-8b|batches]
       (--cpu: Triton's interpreter, tiny shapes: a check of the script itself; --only: one section, so that each can
       run under its own time limit)
"""

from __future__ import annotations

import gc
import json
import sys
import time

from probe_script import CPU, DEV, DT, OUT, Emitter, per_call_us  # noqa: E402  (sets the interpreter for --cpu)

import torch  # noqa: E402

from eaglespec.bench.drafters import decode_step_seconds, verify_step_seconds  # noqa: E402
from eaglespec.bench.random_model import random_model  # noqa: E402
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import (  # noqa: E402
    prepare_for_inference, use_norm_linear_kernel, use_short_attention_kernel)
from eaglespec.layers import norm_linear_kernel as nlk  # noqa: E402
from eaglespec.layers.mlp import silu_mul  # noqa: E402
from eaglespec.layers.norm import add_rms_norm  # noqa: E402
from eaglespec.models.base import PreNormDecoderLayer  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

emit = Emitter("step_kernels.json")


def candidates(M: int, K: int):
    """Block configurations to sweep for one-shot widths (the tensor-core variant tried on 2026-11-30 was slower)."""
    kp = 1 << (K - 1).bit_length()
    bm = 1 if M <= 1 else 2 if M <= 2 else 4
    for bn in (2, 4, 8):
        for warps in (1, 2, 4):
            if bm * bn * kp <= 32768:
                yield bm, bn, kp, warps


T0 = time.perf_counter()
SEARCH_S = 240  # the sweep stops after this many seconds (each configuration is a Triton compilation)


def kernel_section() -> None:
    add_norm = add_rms_norm if CPU else torch.compile(add_rms_norm, dynamic=True, fullgraph=True)
    act = silu_mul if CPU else torch.compile(silu_mul, dynamic=True, fullgraph=True)
    shapes = [("smollm2 qkv", 576, 960, False), ("smollm2 gate_up", 576, 1536, True)]
    if CPU:
        shapes = [("tiny qkv", 64, 96, False), ("tiny gate_up", 64, 128, True)]
    g = torch.Generator(device=DEV).manual_seed(0)
    for name, K, N, gated in shapes:
        w = (torch.randn(2 * N if gated else N, K, generator=g, device=DEV) / K ** 0.5).to(DT)
        nw = (1 + 0.1 * torch.randn(K, generator=g, device=DEV)).to(DT)
        for M in (1, 2, 4):
            h = torch.randn(M, K, generator=g, device=DEV).to(DT)
            d = torch.randn(M, K, generator=g, device=DEV).to(DT)
            h1, y1 = nlk.add_norm_linear(h, d, nw, 1e-5, w, gated)
            h2, y2 = nlk.add_norm_linear_reference(h, d, nw, 1e-5, w, gated)
            ulp = y2.float().abs().clamp_min(y2.float().abs().mean().item()) * 2 ** -7  # ~one bf16 step
            steps = ((y1.float() - y2.float()).abs() / ulp).max().item()

            def replaced():
                hh, x = add_norm(h, d, nw, 1e-5)
                y = torch.nn.functional.linear(x, w)
                return hh, act(y) if gated else y

            base = nlk._blocks(M, N, K, gated)
            t_ref = per_call_us(replaced)
            t_def = per_call_us(lambda: nlk.add_norm_linear(h, d, nw, 1e-5, w, gated))
            best = (t_def, base)
            if not CPU and time.perf_counter() - T0 < SEARCH_S:
                for cfg in candidates(M, K):
                    try:
                        t = per_call_us(lambda: nlk.add_norm_linear(h, d, nw, 1e-5, w, gated, cfg))
                    except Exception as e:  # noqa: BLE001  (a config Triton cannot build: skipped)
                        print(f"  skip {cfg}: {type(e).__name__}", flush=True)
                        continue
                    if t < best[0]:
                        best = (t, cfg)
            emit({"kernel": name, "M": M, "K": K, "N": N, "max_diff_bf16_steps": round(steps, 2),
                  "h_equal": bool(torch.equal(h1, h2)), "replaced_us": round(t_ref, 2),
                  "fused_default_us": round(t_def, 2), "default_cfg": list(base),
                  "best_us": round(best[0], 2), "best_cfg": list(best[1])})


def attention_section() -> None:
    from eaglespec.layers.attention import attend_cached
    from eaglespec.layers.context import ForwardContext
    from eaglespec.layers.short_attention_kernel import short_attention

    g = torch.Generator(device=DEV).manual_seed(1)
    heads = [("smollm2", 9, 3, 64), ("8b", 32, 8, 128)] if not CPU else [("tiny", 4, 2, 16)]
    for name, H, Hkv, D in heads:
        for K in (256, 1024) if not CPU else (128,):
            for T in (1, 4, 8, 16):
                if T * (H // Hkv) > 64:
                    continue
                q = torch.randn(1, T, H, D, generator=g, device=DEV).to(DT)
                kc = torch.randn(2, K + 64, Hkv, D, generator=g, device=DEV).to(DT)
                vc = torch.randn(2, K + 64, Hkv, D, generator=g, device=DEV).to(DT)
                rows = torch.tensor([1], device=DEV)
                mask = torch.zeros(1, T, K, dtype=torch.bool, device=DEV)
                mask[..., : K - 40] = True
                mask[0, :, K - 40 : K - 40 + T] = torch.ones(T, T, dtype=torch.bool, device=DEV).tril()
                ctx = ForwardContext(positions=torch.zeros(1, T, dtype=torch.long, device=DEV), attn_mask=mask,
                                     rows=rows)
                ref = attend_cached(q, ctx, (kc, vc))
                out = short_attention(q, kc, vc, rows, mask)
                err = (out.float() - ref.float()).abs().max().item()

                def sdpa_path():  # a fresh context: the bias is built once per forward, as in a step
                    c = ForwardContext(positions=ctx.positions, attn_mask=mask, rows=rows)
                    return attend_cached(q, c, (kc, vc))

                emit({"attention": name, "T": T, "K": K, "max_abs_diff": round(err, 5),
                      "sdpa_us": round(per_call_us(sdpa_path), 2),
                      "kernel_us": round(per_call_us(lambda: short_attention(q, kc, vc, rows, mask)), 2)})


def set_variant(model, variant: str) -> None:
    """"none": neither kernel; "norm_linear": the fused norm + projection only; "both": the default; "no_gemv": the
    default but wide layers' one-row projections through cuBLAS instead of the GEMV kernel (session 11)."""
    from eaglespec.engine.transforms import GEMV_MAX_ROWS
    from eaglespec.layers.few_rows_linear import FewRowsLinear
    from eaglespec.layers.gemv_kernel import gemv_rows

    use_norm_linear_kernel(model)
    use_short_attention_kernel(model)
    for m in model.modules():
        if isinstance(m, FewRowsLinear) and m.kernel is gemv_rows:
            m.max_rows = 0 if variant == "no_gemv" else GEMV_MAX_ROWS
        if isinstance(m, PreNormDecoderLayer) and variant == "none":
            m.norm_linear = None
        if hasattr(m, "attn_kernel") and variant != "both":
            m.attn_kernel = None


def sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


def engine_section(shape: str) -> None:
    lm = random_model(shape, DEV, DT, 0)
    m = lm.model
    prepare_for_inference(m, DEV, None if not CPU else True, None if not CPU else False)
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    prompt = list(range(100, 228 if not CPU else 116))
    n_new = 256 if not CPU else 8
    params = SamplingParams(max_new_tokens=n_new, ignore_eos=True)
    from eaglespec.layers.gemv_kernel import gemv_rows

    wide = any(getattr(x, "kernel", None) is gemv_rows for x in m.modules())
    for variant in ("none", "norm_linear", "both") + (("no_gemv",) if wide else ()):
        set_variant(m, variant)
        if variant == "norm_linear" and not any(getattr(x, "norm_linear", None) is not None for x in m.modules()):
            continue  # wider than the kernel's ONE_SHOT_K: not wired
        e = Engine(m, None, EngineConfig(device=DEV.type, dtype="float32" if CPU else "bfloat16"))
        e.reserve(1, 1024)
        e.warmup([1])
        e.generate([prompt], SamplingParams(max_new_tokens=8, ignore_eos=True))
        best = 0.0
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            o = e.generate([prompt], params)[0]
            sync()
            best = max(best, len(o.token_ids) / (time.perf_counter() - t0))
        del e
        # the decode phase is timed on the non-overlapped path (an overlapped step is launched and read apart)
        dec, ids = decode_step_seconds(m, prompt, EngineConfig(device=DEV.type, dtype="float32" if CPU else "bfloat16"),
                                       n_new)
        row = {"engine": shape, "variant": variant, "tok_per_s": round(best, 1), "decode_ms": round(1000 * dec, 4),
               "GBps_at_decode": round(nbytes / dec / 1e9, 1)}
        for spec in (SpecConfig(3, 1, 4), SpecConfig(7, 1, 8)):
            ver = verify_step_seconds(m, prompt, prompt + ids, spec,
                                      EngineConfig(device=DEV.type, dtype="float32" if CPU else "bfloat16"), n_new)
            row[f"verify_D{spec.draft_tokens}_ms"] = round(1000 * ver, 4)
            row[f"verify_D{spec.draft_tokens}_over_decode"] = round(ver / dec, 3)
        emit(row)
        gc.collect()
        if not CPU:
            torch.cuda.empty_cache()
    del m, lm
    gc.collect()


def batches_section() -> None:
    """Plain decoding of B = 1, 2, 4, 8, 16, 32 rows (random SmolLM2 shape, 128-token prompts, 128 new tokens, the
    default overlapped graph path) with and without the attention kernel: where does it beat SDPA's? The kernel is
    wired for batches of <= short_attention_kernel.MAX_BATCH rows (8 until session 11, 32 since: this section's
    measurements); the "both" rows raise that limit to B if it is lower. Then the speculative step (chain S3 K1 D4, a
    random drafter: its acceptance is meaningless, its step costs are not) at 8, 16 and 32 rows, ms per step and the
    draft / verify / commit split, with the attention kernel up to 8 and up to 32 rows."""
    import eaglespec.layers.short_attention_kernel as sak
    from eaglespec.bench.random_model import random_drafter

    lm = random_model("smollm2-135m" if not CPU else str(OUT / "tiny_config.json"), DEV, DT, 0)
    m = lm.model
    prepare_for_inference(m, DEV, None if not CPU else True, None if not CPU else False)
    n_new = 128 if not CPU else 4
    default_max = sak.MAX_BATCH
    for B in (1, 2, 4, 8, 16, 32) if not CPU else (1, 2):
        prompts = [list(range(100 + i, 228 + i)) for i in range(B)]
        params = SamplingParams(max_new_tokens=n_new, ignore_eos=True)
        for variant in ("norm_linear", "both"):
            set_variant(m, variant)
            sak.MAX_BATCH = max(default_max, B)
            e = Engine(m, None, EngineConfig(device=DEV.type, dtype="float32" if CPU else "bfloat16",
                                             max_batch_size=B))
            e.reserve(B, 1024)
            e.warmup(range(1, B + 1))
            e.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))
            best = 0.0
            for _ in range(3):
                sync()
                t0 = time.perf_counter()
                outs = e.generate(prompts, params)
                sync()
                best = max(best, sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
            emit({"decode_batch": B, "variant": variant, "attention_kernel_max_batch": sak.MAX_BATCH,
                  "tok_per_s": round(best, 1)})
            del e
            gc.collect()
    set_variant(m, "both")
    d = random_drafter(m.config, DEV, DT, 0)
    prepare_for_inference(d, DEV, None if not CPU else True, None if not CPU else False)
    for B in (8, 16, 32) if not CPU else (2,):
        prompts = [list(range(100 + i, 228 + i)) for i in range(B)]
        for max_batch in (8, 32):
            sak.MAX_BATCH = max_batch
            e = Engine(m, None, EngineConfig(device=DEV.type, dtype="float32" if CPU else "bfloat16",
                                             max_batch_size=B, overlap=False), drafter=d, spec=SpecConfig(3, 1, 4))
            e.reserve(B, 1024)
            e.warmup(range(1, B + 1))
            e.generate(prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))
            e.stats.__init__()
            e.runner.timer.enabled = True
            e.runner.timer.reset()
            e.generate(prompts, SamplingParams(max_new_tokens=n_new, ignore_eos=True))
            steps = max(e.stats.verify_steps // B, 1)  # the stats count one verify step per row
            split = {k: round(1e3 * v / steps, 4) for k, v in e.runner.timer.totals().items() if k != "decode"}
            emit({"spec_batch": B, "spec": "S3 K1 D4", "attention_kernel_max_batch": max_batch,
                  "ms_per_step": round(sum(split.get(k, 0.0) for k in ("draft", "verify", "commit")), 4), **split})
            del e
            gc.collect()
    sak.MAX_BATCH = default_max


SECTIONS = [(kernel_section, None), (attention_section, None), (engine_section, "smollm2-135m"),
            (engine_section, "llama-3.1-8b"), (batches_section, None)]
if CPU:  # a tiny Llama shape instead of the real ones
    from eaglespec.bench.random_model import SMOLLM2_135M

    tiny = dict(SMOLLM2_135M, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=256)
    (OUT / "tiny_config.json").write_text(json.dumps(tiny))
    SECTIONS = [(kernel_section, None), (attention_section, None), (engine_section, str(OUT / "tiny_config.json")),
                (batches_section, None)]
ONLY = [a[len("--only="):] for a in sys.argv if a.startswith("--only=")]
if ONLY:  # --only=kernel / attention / smollm2-135m / llama-3.1-8b / batches
    SECTIONS = [(f, a) for f, a in SECTIONS if (a or f.__name__.replace("_section", "")) == ONLY[0]]
for fn, arg in SECTIONS:
    t = time.perf_counter()
    try:
        fn() if arg is None else fn(arg)
    except Exception as e:  # noqa: BLE001  (one section's failure must not lose the others' rows)
        import traceback

        traceback.print_exc()
        emit({"section": f"{fn.__name__} {arg}", "error": repr(e)[:300]})
    print(f"== {fn.__name__} {arg or ''} took {time.perf_counter() - t:.1f}s", flush=True)
print("\n| row | values |\n|---|---|")
for r in emit.rows:
    print("| " + " | ".join(f"{k}={v}" for k, v in r.items()) + " |")
