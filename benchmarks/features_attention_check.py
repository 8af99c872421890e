"""The target's forward for training features (`train/features.py`: a [B, T] batch, causal mask, no cache) on the GPU,
three ways: as it runs now (`ForwardContext.causal`: SDPA's is_causal, the flash kernel), through the mask with the KV
heads repeated (the memory-efficient kernel), and through the mask with SDPA's own GQA (the math backend: before
session 40). Time per forward by batch shape, and the largest logit difference from the first.
Random weights of SmolLM2-135M's shape, bf16, aux layers captured as in training.

usage: python benchmarks/features_attention_check.py
"""

from __future__ import annotations

import torch

from eaglespec.bench.random_model import random_model
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.layers import attention
from eaglespec.layers.context import ForwardContext

dev = torch.device("cuda")
model = random_model("smollm2-135m", dev, torch.bfloat16, 0).model
prepare_for_inference(model, dev, None, None)
model.set_eagle3_layers_to_capture([1, 14, 26])
repeat, fast = attention._repeat_kv_heads, attention._is_causal_fast
MODES = {"causal": (repeat, fast), "mask, repeated KV": (repeat, lambda q: False),
         "mask, SDPA GQA": (lambda q: False, lambda q: False)}
print("| B x T | " + " | ".join(f"{m} ms" for m in MODES) + " | max logit diff |\n|---|" + "---:|" * (len(MODES) + 1))
for B, T in ((8, 1024), (16, 512), (32, 256), (128, 64)):
    tokens = torch.randint(3, model.config.vocab_size, (B, T), device=dev)
    res = []
    for mode, (rep, caus) in MODES.items():
        attention._repeat_kv_heads, attention._is_causal_fast = rep, caus
        with torch.no_grad():
            for _ in range(3):
                out = model(tokens, ForwardContext.plain(B, T, dev))
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(10):
                out = model(tokens, ForwardContext.plain(B, T, dev))
            e.record()
            torch.cuda.synchronize()
        res.append((s.elapsed_time(e) / 10, out.logits.float()))
    attention._repeat_kv_heads, attention._is_causal_fast = repeat, fast
    diff = max((r[1] - res[0][1]).abs().max().item() for r in res[1:])
    print(f"| {B} x {T} | " + " | ".join(f"{r[0]:.2f}" for r in res) + f" | {diff:.3f} |", flush=True)

# where the forward's time goes now (8 x 1024): the top kernels
tokens = torch.randint(3, model.config.vocab_size, (8, 1024), device=dev)
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        model(tokens, ForwardContext.plain(8, 1024, dev))
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
