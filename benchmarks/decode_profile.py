"""Where does a batch-1 decode step of a random-weight model spend its time on the GPU? (issue 4: Llama-3.1-8B
shape at 88-89% of the copy-bandwidth floor, goal 90%.)

For a random-weight model (`random_model` preset, bf16, CUDA graphs, the default kernels, batch 1, 128-token prompt):
1. the decode graph replayed alone, 200 steps: ms per step and GB/s over the weights a step reads (every parameter
   but the input embedding, which a step reads one row of);
2. a torch.profiler trace of 20 replays: each kernel's time per step, grouped by kernel name, and the sum of the
   kernels against the step (the rest is idle time between kernels inside the graph);
3. each distinct projection shape alone (`F.linear` of one row, in a CUDA graph of 50 calls): us per call and GB/s;
4. the device's copy bandwidth (a 2 GiB device-to-device copy, best of 10).

usage: python benchmarks/decode_profile.py OUT_DIR [SHAPE=llama-3.1-8b]
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F

from probe_script import OUT, replay_ms, stepped_engine

from eaglespec.bench.graph_timing import per_call_us
from eaglespec.bench.random_model import random_model
from eaglespec.engine.transforms import prepare_for_inference
SHAPE = sys.argv[2] if len(sys.argv) > 2 else "llama-3.1-8b"
dev = torch.device("cuda")
result: dict = {"shape": SHAPE}


def save() -> None:
    (OUT / f"decode_profile_{SHAPE}.json").write_text(json.dumps(result, indent=1))


# 4. copy bandwidth first (nothing else allocated yet)
src = torch.empty(1 << 30, dtype=torch.bfloat16, device=dev)
dst = torch.empty_like(src)
best = float("inf")
for _ in range(10):
    torch.cuda.synchronize()
    t = time.perf_counter()
    dst.copy_(src)
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t)
result["copy_GBps"] = round(2 * src.numel() * 2 / best / 1e9, 1)  # read + write
del src, dst
print("copy GB/s (read + write):", result["copy_GBps"], flush=True)

lm = random_model(SHAPE, dev, torch.bfloat16, 0)
m = lm.model
prepare_for_inference(m, dev, None, None)
emb, head = m.get_embed_and_head()
read_bytes = sum(p.numel() * p.element_size() for p in m.parameters() if p is not emb)
if head is emb:  # tied: the head reads the table
    read_bytes += emb.numel() * emb.element_size()
result["weight_GB_read_per_step"] = round(read_bytes / 1e9, 3)

e = stepped_engine(m)
run = e.runner
graphs = run.graphs.captured("decode", 1, run.host_len[0] + 64, True)
step_ms = replay_ms([g for _, g in graphs], 200, warmup=0)
result["graph_ms_per_step"] = round(step_ms, 4)
result["graph_GBps"] = round(read_bytes / (step_ms * 1e-3) / 1e9, 1)
print(f"decode graph: {step_ms:.4f} ms per step, {result['graph_GBps']} GB/s over "
      f"{result['weight_GB_read_per_step']} GB", flush=True)
save()

# 2. the kernels inside the graph
from torch.profiler import ProfilerActivity, profile  # noqa: E402

reps = 20
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(reps):
        for _, g in graphs:
            g.replay()
    torch.cuda.synchronize()
prof.export_chrome_trace(str(OUT / f"trace_{SHAPE}.json"))
per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
        dur = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        rec = per_name[ev.name]
        rec[0] += dur
        rec[1] += 1
rows = sorted(((v[0] / reps, v[1] / reps, k) for k, v in per_name.items()), reverse=True)
kernel_us = sum(r[0] for r in rows)
result["kernels_us_per_step"] = round(kernel_us, 1)
result["kernels_per_step"] = round(sum(r[1] for r in rows), 1)
result["idle_us_per_step"] = round(step_ms * 1e3 - kernel_us, 1)
result["by_kernel"] = [{"us_per_step": round(us, 1), "calls_per_step": c, "us_per_call": round(us / max(c, 1), 2),
                        "name": name[:160]} for us, c, name in rows[:40]]
print(f"kernels: {kernel_us:.1f} us per step in {result['kernels_per_step']} kernels; "
      f"idle {result['idle_us_per_step']} us", flush=True)
for r in result["by_kernel"][:25]:
    print(f"  {r['us_per_step']:9.1f} us  {r['calls_per_step']:6.1f} x {r['us_per_call']:7.2f}  {r['name'][:110]}")
save()

# 3. each projection shape alone; copies of the weight in turn, > 256 MB in all, so that L2 (50 MB) holds none
shapes = sorted({tuple(mod.weight.shape) for mod in m.modules() if isinstance(mod, torch.nn.Linear)})
result["linear"] = []
for N, K in shapes:
    copies = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(max(1, -(-(256 << 20) // (N * K * 2))))]
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    turn = [0]

    def one() -> torch.Tensor:
        turn[0] += 1
        return F.linear(x, copies[turn[0] % len(copies)])

    us = per_call_us(one, 50, dev)
    row = {"N": N, "K": K, "copies": len(copies), "us": round(us, 2), "GBps": round(N * K * 2 / (us * 1e-6) / 1e9, 1)}
    result["linear"].append(row)
    print("linear", json.dumps(row), flush=True)
save()
print("\n| | value |\n| --- | ---: |")
for k in ("copy_GBps", "weight_GB_read_per_step", "graph_ms_per_step", "graph_GBps", "kernels_us_per_step",
          "kernels_per_step", "idle_us_per_step"):
    print(f"| {k} | {result[k]} |")
