"""Kimi-K2.5 language-model slice on the H200: decode and verify step costs against the bytes that must move.

The slice has Kimi-K2.5's full width (REFERENCE.md §6: hidden 7168, MLA with q_lora 1536 / kv_lora 512, 64 heads,
384 routed experts top-8 + 1 shared, moe_intermediate 2048, vocab 163840) and three layers: the dense first layer and
two MoE layers; random bf16 weights built on the device. Measured, with a 512-token prefix in the latent KV cache:
- decode (T=1) at batch 1 and 32, verify of a D=4 and D=8 chain at batch 1;
- per step, the floor: bytes of the weights a step must read (attention, dense MLP, router, shared expert, lm_head,
  embedding rows, and the routed experts actually chosen, counted from the router's choices in that step) plus the
  latent cache, over the measured copy bandwidth;
- the same after the routed experts are quantized to NVFP4 and dequantized back to bf16 (as loading a ModelOpt
  checkpoint does): same bytes, so the same time, and the weight error of the round trip.

usage: python3 benchmarks/kimi_slice.py OUT_DIR [--tiny]     (--tiny: a small CPU smoke run of the same code)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from eaglespec.bench.random_model import KIMI_K25_SLICE
from eaglespec.config import ModelConfig
from eaglespec.engine.kv_cache import KVCache
from eaglespec.layers.context import ForwardContext, causal_tail, prefix_tail_mask
from eaglespec.layers.moe import MoE
from eaglespec.loading.checkpoint import build_on_meta
from eaglespec.loading.dequant import dequant_nvfp4, pack_nvfp4
from eaglespec.models.deepseek_v3 import DeepseekV3ForCausalLM

OUT = Path(sys.argv[1])
TINY = "--tiny" in sys.argv
DEV = torch.device("cpu" if TINY else "cuda")
TEXT = dict(KIMI_K25_SLICE)  # the `bench --random-weights kimi-k2.5-slice` preset
if TINY:
    TEXT.update(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
                qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=16, moe_intermediate_size=32,
                intermediate_size=96, vocab_size=512)
PREFIX = 64 if TINY else 512


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth() -> float:
    if DEV.type != "cuda":
        return float("nan")
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync()
    t = time.perf_counter()
    for _ in range(20):
        b.copy_(a)
    sync()
    return 2 * a.numel() * 20 / (time.perf_counter() - t)


def build() -> DeepseekV3ForCausalLM:
    # built in bf16 on meta, then materialized: 74 GB, not 148 GB of float32
    m = build_on_meta(DeepseekV3ForCausalLM, ModelConfig.from_hf(TEXT), torch.bfloat16).to_empty(device=DEV)
    g = torch.Generator(device=DEV).manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.normal_(0, 0.01, generator=g)
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0, p.shape[-1] ** -0.5, generator=g)
    m.reset_buffers()
    return m.eval().requires_grad_(False)


class ExpertCounter:
    """Counts the distinct routed experts each MoE layer reads in a forward (hooks on the routers)."""

    def __init__(self, model) -> None:
        self.seen: list[set[int]] = []
        for mod in model.modules():
            if isinstance(mod, MoE):
                mod.gate.register_forward_hook(self._hook)

    def _hook(self, _mod, _inp, out) -> None:
        self.seen.append(set(out[1].flatten().tolist()))

    def take(self) -> list[int]:
        n = [len(s) for s in self.seen]
        self.seen = []
        return n


def floor_bytes(model, experts_per_layer: list[int], batch: int, kv_len: int) -> int:
    per_expert = sum(p.numel() * p.element_size() for p in next(m for m in model.modules()
                                                                 if isinstance(m, MoE)).experts[0].parameters())
    routed = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    embed = model.model.embed_tokens.weight
    other = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                if ".experts." not in n and "embed_tokens" not in n)
    latent = model.config.num_hidden_layers * kv_len * batch * model.kv_cache_shapes()[0][0] * 2
    del routed
    return other + batch * embed.shape[1] * embed.element_size() + sum(experts_per_layer) * per_expert + latent


def step(model, kv, B: int, T: int, L: int) -> None:
    Lt = torch.full((B,), L, dtype=torch.int64, device=DEV)
    pos = Lt[:, None] + torch.arange(T, device=DEV)[None]
    ctx = ForwardContext(positions=pos, write_index=pos, kv=kv.layers(),
                         attn_mask=prefix_tail_mask(Lt, causal_tail(B, T, DEV), L + T))
    ids = torch.randint(0, model.config.vocab_size, (B, T), device=DEV)
    model(ids, ctx)


def measure(model, counter, bw, B: int, T: int, label: str, reps: int) -> dict:
    kv = KVCache(model.config.num_hidden_layers, model.kv_cache_shapes(), B, PREFIX + T + 1, torch.bfloat16, DEV)
    with torch.inference_mode():
        step(model, kv, B, PREFIX, 0)  # the prefix fills the latent cache
        counter.take()
        for _ in range(2):
            step(model, kv, B, T, PREFIX)
        counter.take()
        times, experts = [], []
        for _ in range(reps):
            sync()
            t = time.perf_counter()
            step(model, kv, B, T, PREFIX)
            sync()
            times.append(time.perf_counter() - t)
            experts.append(counter.take())
    times.sort()
    med = times[len(times) // 2]
    mean_experts = [sum(e[i] for e in experts) / len(experts) for i in range(len(experts[0]))]
    fb = floor_bytes(model, mean_experts, B, PREFIX + T)
    row = {"run": label, "batch": B, "tokens": T, "ms": round(1000 * med, 3), "floor_GB": round(fb / 1e9, 2),
           "floor_ms": round(1000 * fb / bw, 3) if bw == bw else None, "experts_per_moe_layer": mean_experts}
    if row["floor_ms"]:
        row["fraction_of_floor"] = round(row["floor_ms"] / row["ms"], 3)
    print(json.dumps(row), flush=True)
    return row


def nvfp4_round_trip(model) -> float:
    """Quantize every routed expert to NVFP4 and back (in place); returns the relative weight error."""
    num = den = 0.0
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".experts." in n and p.dim() == 2:
                q = pack_nvfp4(p.float())
                w = dequant_nvfp4(q["weight"], q["weight_scale"], q["weight_scale_2"], dtype=p.dtype)
                num += float((w.float() - p.float()).pow(2).sum())
                den += float(p.float().pow(2).sum())
                p.copy_(w)
    return (num / den) ** 0.5


OUT.mkdir(parents=True, exist_ok=True)
rows: list[dict] = []
bw = copy_bandwidth()
rows.append({"run": "copy bandwidth", "GBps": round(bw / 1e9, 1) if bw == bw else None})
t0 = time.perf_counter()
model = build()
sync()
params = sum(p.numel() for p in model.parameters())
rows.append({"run": "build", "params_B": round(params / 1e9, 2), "seconds": round(time.perf_counter() - t0, 1)})
counter = ExpertCounter(model)
reps = 3 if TINY else 10
for tag in ("bf16", "nvfp4-dequantized"):
    if tag != "bf16":
        err = nvfp4_round_trip(model)
        rows.append({"run": "nvfp4 round trip of the routed experts", "relative_weight_error": round(err, 4)})
    for B, T in ((1, 1), (32, 1), (1, 4), (1, 8)):
        kind = "decode" if T == 1 else f"verify D={T}"
        rows.append(measure(model, counter, bw, B, T, f"{tag} {kind} b{B}", reps))
(OUT / "kimi_slice.json").write_text(json.dumps(rows, indent=1))
print("\n| run | ms/step | floor ms | of floor | experts read per MoE layer |\n|---|---:|---:|---:|---|")
for r in rows:
    if "ms" in r:
        print(f"| {r['run']} | {r['ms']} | {r['floor_ms']} | {r.get('fraction_of_floor', '')} | "
              f"{[round(x) for x in r['experts_per_moe_layer']]} |")
    else:
        print(f"| {r['run']} | | | | {r} |")
