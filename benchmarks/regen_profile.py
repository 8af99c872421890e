"""Where regeneration's time goes (the first stage of `eaglespec train`) on the real target: one shard's worth of
ShareGPT first turns through `Engine.generate`, as `train/regenerate.py` runs it (greedy, `--regen-batch` rows,
admission in groups of rows / 8, `--regen-stop-loop`, `--max-len`).

For each VARIANT a fresh engine generates the prompts twice: the first call pays the CUDA-graph captures of every
(batch bucket, length bucket) the run meets, the second replays them, so their difference is what `regenerate`'s
one-engine-per-shard costs. Every step is logged (wall time since the last, running rows, kind), and a torch
profiler window of steady-state decode steps gives the kernel split. Variants:
  base      the engine as it is;
  old       as before session 40: decode steps of more than MAX_BATCH rows take SDPA (over every row's whole length
            bucket) instead of the short-query kernel, and eager attention with GQA asks SDPA for it (which put
            admissions' prefills on the math backend) instead of repeating the KV heads, and causal forwards read
            their mask instead of running SDPA's is_causal (`ForwardContext.causal`);
  nocausal  the engine as it is but for `ForwardContext.causal` (7862b4a's regeneration: an A/B of that change
            alone, in one process, since machines differ in host speed).

usage: python benchmarks/regen_profile.py GGUF SHAREGPT_JSON OUT [N] [ROWS]   (env VARIANTS=old,base; STOP_LOOP=32;
       MAX_LEN=1024; MAX_NEW=512)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from eaglespec.config import EngineConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.layers import attention
from eaglespec.layers import short_attention_kernel as sak
from eaglespec.layers.attention import AttentionKernel
from eaglespec.loading.checkpoint import load_model
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.conversations import read_conversations

GGUF, DATA, OUT = sys.argv[1], sys.argv[2], Path(sys.argv[3])
N = int(sys.argv[4]) if len(sys.argv) > 4 else 2048
ROWS = int(sys.argv[5]) if len(sys.argv) > 5 else 1024
VARIANTS = os.environ.get("VARIANTS", "old,base").split(",")
STOP_LOOP = int(os.environ.get("STOP_LOOP", "32"))
MAX_LEN = int(os.environ.get("MAX_LEN", "1024"))
MAX_NEW = int(os.environ.get("MAX_NEW", "512"))
OUT.mkdir(parents=True, exist_ok=True)
dev = torch.device(os.environ.get("DEVICE", "cuda"))  # DEVICE=cpu: a smoke run of the script itself
loaded = load_model(GGUF, device=dev, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
model, tok = loaded.model, loaded.tokenizer
prepare_for_inference(model, dev, None, None)
base_fits = sak.fits
repeat_kv, causal_fast = attention._repeat_kv_heads, attention._is_causal_fast


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def old_fits(B, T, H, Hkv, D, dtype=None):  # before session 40: one query token only up to MAX_BATCH rows too
    return B <= sak.MAX_BATCH and base_fits(B, T, H, Hkv, D, dtype)


def use_fits(f) -> None:
    sak.fits = f  # short_attention's own assert reads the module's name
    for m in model.modules():
        if getattr(m, "attn_kernel", None) is not None:
            m.attn_kernel = AttentionKernel(sak.short_attention, f)


convs = read_conversations([DATA], max_conversations=N * 2).conversations
probe = Engine(model, tok, EngineConfig(max_batch_size=1, cuda_graphs=False))
prompts = []
for c in convs:
    ai = next(i for i, m in enumerate(c) if m["role"] == "assistant")
    ids = probe.encode_prompt(c[:ai])
    if len(ids) + 16 <= MAX_LEN:
        prompts.append(ids)
    if len(prompts) == N:
        break
del probe
params = [SamplingParams(max_new_tokens=min(MAX_NEW, MAX_LEN - len(p)), detokenize=False, stop_loop=STOP_LOOP)
          for p in prompts]
print(f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens (mean {statistics.mean(map(len, prompts)):.0f})",
      flush=True)

results, outputs = [], {}
for variant in VARIANTS:
    use_fits(old_fits if variant == "old" else base_fits)
    attention._repeat_kv_heads = (lambda q: False) if variant == "old" else repeat_kv
    attention._is_causal_fast = (lambda q: False) if variant in ("old", "nocausal") else causal_fast
    sync()
    t0 = time.perf_counter()
    eng = Engine(model, tok, EngineConfig(max_batch_size=ROWS, max_seq_len=MAX_LEN + 1,
                                          min_prefill_rows=max(1, ROWS // 8)))
    t_build = time.perf_counter() - t0
    log: list[tuple[float, int, int]] = []
    real_step = eng.step

    def step(_real=real_step, _eng=eng, _log=log):
        n = len(_eng.scheduler.running)
        waiting = len(_eng.scheduler.waiting)
        t = time.perf_counter()
        r = _real()
        _log.append((time.perf_counter() - t, n, waiting))
        return r

    eng.step = step
    row = {"variant": variant, "build_s": round(t_build, 2)}
    for rnd in (1, 2):
        log.clear()
        prof = None
        sync()
        t = time.perf_counter()
        if rnd == 2:  # kernel split over steady-state decode steps: a window once the rows have filled
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if dev.type == "cuda" else torch.profiler.ProfilerActivity.CPU], schedule=
                                          torch.profiler.schedule(wait=int(os.environ.get("PROFILE_AT", "400")), warmup=5, active=40, repeat=1))
            prof.start()
            real2 = eng.step

            def pstep(_r=real2, _p=prof):
                out = _r()
                _p.step()
                return out

            eng.step = pstep
        outs = eng.generate(prompts, params, chat=False)
        sync()
        dt = time.perf_counter() - t
        if prof is not None:
            prof.stop()
            eng.step = step
            try:  # no window when the run had fewer steps than PROFILE_AT + 45
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
                (OUT / f"kernels_{variant}.txt").write_text(table)
            except AssertionError:
                pass
        new = sum(len(o.token_ids) for o in outs)
        full = [s for s in log if s[1] >= ROWS * 0.9]
        row[f"gen{rnd}_s"] = round(dt, 2)
        row[f"gen{rnd}_tok_s"] = round(new / dt)
        if rnd == 2:
            row.update(new_tokens=new, steps=len(log), mean_rows=round(statistics.mean(s[1] for s in log), 1),
                       steps_full=len(full),
                       ms_full=round(1e3 * statistics.median(s[0] for s in full), 2) if full else None,
                       s_in_full=round(sum(s[0] for s in full), 2),
                       s_below_half=round(sum(s[0] for s in log if s[1] < ROWS / 2), 2),
                       steps_below_half=sum(1 for s in log if s[1] < ROWS / 2),
                       s_waiting=round(sum(s[0] for s in log if s[2] > 0), 2))
            (OUT / f"steps_{variant}.json").write_text(json.dumps(log))
            outputs[variant] = [o.token_ids for o in outs]
    print(json.dumps(row), flush=True)
    results.append(row)
    del eng
    if dev.type == "cuda":
        torch.cuda.empty_cache()

if len(outputs) > 1:
    a, b = list(outputs.values())[:2]
    same = sum(x == y for x, y in zip(a, b))
    print(f"identical answers {VARIANTS[0]} vs {VARIANTS[1]}: {same}/{len(a)}")
(OUT / "regen_profile.json").write_text(json.dumps(results, indent=1))
keys = ["variant", "build_s", "gen1_s", "gen2_s", "gen2_tok_s", "steps", "mean_rows", "steps_full", "ms_full",
        "s_in_full", "steps_below_half", "s_below_half", "s_waiting"]
print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
for r in results:
    print("| " + " | ".join(str(r.get(k)) for k in keys) + " |")
