"""Why does a tree's drafting cost ~4x a chain's on the H200? (tune, 2026-11-30 session 9: S4 K4 D16 drafts in
0.59 ms per step against 0.14 ms for S3 K1 D4, and its commit costs 0.18 against 0.13 ms, at batch 1.)

1. phases: random-weight SmolLM2-135M shape and random drafter (bf16, CUDA graphs, batch 1, a 128-token prompt
   then 30 steps), per spec shape: 50 whole steps replayed, each phase graph (draft, verify, commit) bracketed by
   events (its GPU time) and host clocks (how long its launch blocks the host); trees with and without the
   log-softmax + top-k kernel (layers/topk_kernel.py).
2. profile: the kernels of the tree's draft graph (torch.profiler over 20 replays, by device time).
3. ops: time per call (a CUDA graph of 50 calls) of the selection operators a tree's drafting uses and of their
   candidate replacements: top-K of K rows of draft-vocabulary log-probabilities (PyTorch's topk; a two-stage
   top-K over blocks of W entries; K argmax passes; the fused kernel from the logits) and the stable sort of build_tree's candidates.

usage: python benchmarks/tree_draft_probe.py OUT_DIR [--cpu] [--quick] [--profile] [--max-rows=N]
  --cpu: tiny shapes, eager: a check of the script; --quick: section 1 only, with the top-k kernel, plus a chain of 8
  (S7 K1 D8); --max-rows=N: the few-row projection kernels wired for steps of up to N <= MAX_ROWS rows (target
  and drafter); --profile: the kernels of the draft and verify graphs of S3 K1 D4 and S4 K4 D16 (what grows with
  the verify's rows)
"""

from __future__ import annotations

import sys
import time

from probe_script import (CPU, DEV, DT, OUT, Emitter, TimedRounds, per_call_us,  # noqa: E402  (--cpu: the interpreter)
                          stepped_engine)

import torch  # noqa: E402

from eaglespec.bench.random_model import random_drafter, random_model  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402
from eaglespec.engine.transforms import (  # noqa: E402
    prepare_for_inference, use_linear_rows_kernel, use_norm_linear_kernel)

QUICK = "--quick" in sys.argv
PROFILE = "--profile" in sys.argv
MAX_ROWS = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--max-rows=")), None)
emit = Emitter("tree_draft_probe.json")


def sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


# --- 1 and 2: the phases of whole speculative steps ----------------------------------------------------------------
m = random_model("smollm2-135m", DEV, DT, 0).model
prepare_for_inference(m, DEV, None, None)
d = random_drafter(m.config, DEV, DT, 0)
prepare_for_inference(d, DEV, None, None)
if MAX_ROWS is not None and not CPU:
    for x in (m, d):
        use_linear_rows_kernel(use_norm_linear_kernel(x, max_rows=MAX_ROWS), max_rows=MAX_ROWS)
import eaglespec.spec.draft as draft_mod  # noqa: E402

fused_topk = draft_mod.topk_logp
runs = [(SpecConfig(3, 1, 4), True), (SpecConfig(4, 1, 5), True)]
runs += [(s, f) for s in (SpecConfig(4, 4, 16), SpecConfig(2, 4, 8)) for f in (False, True)]
if QUICK:
    runs = [(s, f) for s, f in runs if f] + [(SpecConfig(7, 1, 8), True)]
for spec, fused in runs:
    # fused False: PyTorch's log-softmax + topk (the path before layers/topk_kernel.py)
    draft_mod.topk_logp = fused_topk if fused else draft_mod.topk_logp_reference
    name = f"S{spec.steps} K{spec.topk} D{spec.draft_tokens}" + ("" if fused or spec.topk == 1 else " torch topk")
    e = stepped_engine(m, d, spec)
    if CPU:
        emit({"spec": name, "steps": 30})
        continue
    run = e.runner
    graphs = run.graphs.captured("spec", 1, run.host_len[0] + 64, True)
    sync()
    # 50 whole steps (a commit moves the state on, so phases are replayed in order), each replay bracketed by events
    # (GPU time) and host clocks (how long the launch call blocks the host)
    n = 50
    rounds = TimedRounds(graphs, n)
    sync()
    t0 = time.perf_counter()
    rounds.run()
    enqueue = time.perf_counter() - t0
    sync()
    row = {"spec": name, "step_ms": round(1e3 * (time.perf_counter() - t0) / n, 4),
           "enqueue_ms": round(1e3 * enqueue / n, 4)}
    for j, (gname, _) in enumerate(graphs):
        row[f"{gname}_ms"] = round(rounds.event_ms(j), 4)
        row[f"{gname}_host_ms"] = round(1e3 * rounds.host[j] / n, 4)
    emit(row)
    profile_it = (spec.topk > 1 and spec.steps == 4 and fused and not QUICK) or (
        PROFILE and fused and spec.steps in (3, 4) and spec.draft_tokens in (4, 16))
    if profile_it:
        from torch.profiler import ProfilerActivity, profile

        for gname, g in graphs:
            # replayed alone: draft and (greedy) verify leave the state as they found it; commit advances it
            if gname not in (("draft", "verify") if PROFILE else ("draft",)):
                continue
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    g.replay()
                sync()
            try:
                table = prof.key_averages().table(sort_by="device_time_total", row_limit=40)
            except Exception:  # older profilers name it cuda_time_total
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
            (OUT / f"profile_{name.replace(' ', '')}_{gname}.txt").write_text(table)
            print(f"== {gname} graph of {name}, 20 replays\n{table}", flush=True)
    del e

if QUICK:
    sys.exit(0)
# --- 3: selection operators -----------------------------------------------------------------------------------------
Vd = 512 if CPU else 12288


def topk_plain(x: torch.Tensor, k: int):
    return x.topk(k, dim=-1)


def topk_blocks(x: torch.Tensor, k: int, w: int):
    """Two stages: the top k of each block of w entries, then the top k of those."""
    r, v = x.shape
    v1, i1 = x.view(r, v // w, w).topk(k, dim=-1)  # [r, v/w, k]
    v2, i2 = v1.reshape(r, -1).topk(k, dim=-1)  # [r, k]
    return v2, torch.gather(i1.reshape(r, -1), 1, i2) + (i2 // k) * w


def topk_argmax(x: torch.Tensor, k: int):
    x = x.clone()
    vals, ids = [], []
    for _ in range(k):
        v, i = x.max(dim=-1, keepdim=True)
        vals.append(v)
        ids.append(i)
        x.scatter_(1, i, float("-inf"))
    return torch.cat(vals, 1), torch.cat(ids, 1)


g = torch.Generator(device=DEV).manual_seed(0)
for K in (4, 8):
    logits = torch.randn(K, Vd, generator=g, device=DEV).to(DT)
    logp = torch.log_softmax(logits.float(), dim=-1)
    ref = topk_plain(logp, K)
    row = {"op": f"top-{K} of {K} x {Vd}", "log_softmax_us": round(per_call_us(
        lambda: torch.log_softmax(logits.float(), dim=-1)), 2),
        "topk_us": round(per_call_us(lambda: topk_plain(logp, K)), 2)}
    for w in (64, 128, 256, 512):
        if Vd % w == 0 and w >= K:
            v2, i2 = topk_blocks(logp, K, w)
            assert torch.equal(v2, ref.values) and torch.equal(torch.gather(logp, 1, i2), ref.values)
            row[f"blocks{w}_us"] = round(per_call_us(lambda: topk_blocks(logp, K, w)), 2)
    if not CPU:
        from eaglespec.layers.topk_kernel import logsoftmax_topk

        fi, fv = logsoftmax_topk(logits, K)
        row["fused_max_diff"] = (fv - ref.values).abs().max().item()
        row["fused_same_ids"] = bool(torch.equal(fi, ref.indices))
        row["fused_us"] = round(per_call_us(lambda: logsoftmax_topk(logits, K)), 2)
    va, ia = topk_argmax(logp, K)
    assert torch.equal(va, ref.values)
    row["argmax_us"] = round(per_call_us(lambda: topk_argmax(logp, K)), 2)
    emit(row)
for N in (52, 200):
    sc = torch.randn(1, N, generator=g, device=DEV)
    emit({"op": f"stable sort of 1 x {N}", "sort_us": round(per_call_us(
        lambda: torch.sort(sc, dim=1, descending=True, stable=True)), 2),
        "topk_us": round(per_call_us(lambda: sc.topk(15, dim=1)), 2)})
print("done", flush=True)
