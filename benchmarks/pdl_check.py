"""Programmatic dependent launch (layers/pdl.py) on the GPU: does it change any token, and what does it buy?

For random-weight models (bf16, CUDA graphs, the default kernels), each measurement with PDL off, then on, in one
process (`pdl.ENABLED`; every engine is built after the switch, so its graphs capture that setting):
1. decode graph: a one-row engine mid-generation, its decode graph replayed 200 times: ms per step;
2. engine: `generate` of 256 tokens after a 128-token prompt, batch 1 (overlap, the default): best tok/s of 3, and
   the token ids; the decode step by the engine's timer (no overlap) and the verify step of an oracle chain of D = 4
   and D = 8 tokens (`verify_step_seconds`): the verify-over-decode ratios of issue 4;
3. speculation (SmolLM2 only): a random drafter, chain S3 K1 D4 and tree S4 K4 D16, batch 1 and 8 rows of 8
   prompts: tok/s and the token ids.
PDL changes no arithmetic, only when a kernel may start, so every token id must equal the PDL-off run's: a
difference means a kernel read something before its wait (a race), and the script says so.

usage: python benchmarks/pdl_check.py OUT_DIR [--cpu] [--only=smollm2-135m|llama-3.1-8b]
       (--cpu: the interpreter, a tiny model, PDL stays off: a check of the script itself)
"""

from __future__ import annotations

import gc
import sys
import time

from probe_script import CPU, DEV, DT, OUT, Emitter, replay_ms, stepped_engine  # noqa: E402  (--cpu: the interpreter)

import torch  # noqa: E402

from eaglespec.bench.drafters import decode_step_seconds, verify_step_seconds  # noqa: E402
from eaglespec.bench.random_model import random_drafter, random_model  # noqa: E402
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.engine.transforms import prepare_for_inference  # noqa: E402
from eaglespec.layers import pdl  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

emit = Emitter("pdl_check.json")
ONLY = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")), None)
SHAPES = ["tiny"] if CPU else [s for s in ("smollm2-135m", "llama-3.1-8b") if ONLY in (None, s)]
CFG = dict(device=DEV.type, dtype="float32" if CPU else "bfloat16")


def sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


def tiny_config() -> str:
    import json

    p = OUT / "tiny_config.json"
    p.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                             "rope_theta": 10000.0, "tie_word_embeddings": False}))
    return str(p)


def timed_generate(e: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list[list[int]]]:
    best, ids = 0.0, []
    for _ in range(3 if not CPU else 1):
        sync()
        t0 = time.perf_counter()
        outs = e.generate(prompts, params)
        sync()
        best = max(best, sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
        ids = [o.token_ids for o in outs]
    return round(best, 1), ids


def measure(shape: str, m: torch.nn.Module, d: torch.nn.Module | None, on: bool) -> dict:
    pdl.ENABLED = on
    row: dict = {"shape": shape, "pdl": on and not CPU}
    prompt = list(range(100, 228 if not CPU else 116))
    n_new = 256 if not CPU else 8
    params = SamplingParams(max_new_tokens=n_new, ignore_eos=True)
    # 1. the decode graph alone
    if not CPU:
        e = stepped_engine(m)
        graphs = e.runner.graphs.captured("decode", 1, e.runner.host_len[0] + 64, True)
        row["decode_graph_ms"] = round(replay_ms([g for _, g in graphs]), 4)
        del e
    # 2. the engine, batch 1
    e = Engine(m, None, EngineConfig(**CFG))
    e.reserve(1, 1024)
    e.warmup([1])
    e.generate([prompt], SamplingParams(max_new_tokens=8, ignore_eos=True))
    row["tok_per_s"], ids = timed_generate(e, [prompt], params)
    row["ids"] = ids
    del e
    dec, _ = decode_step_seconds(m, prompt, EngineConfig(**CFG), n_new)
    row["decode_ms"] = round(1e3 * dec, 4)
    for spec in (SpecConfig(3, 1, 4), SpecConfig(7, 1, 8)):
        ver = verify_step_seconds(m, prompt, prompt + ids[0], spec, EngineConfig(**CFG), n_new)
        row[f"verify_D{spec.draft_tokens}_ms"] = round(1e3 * ver, 4)
        row[f"verify_D{spec.draft_tokens}_over_decode"] = round(ver / dec, 3)
    # 3. speculation with a random drafter
    if d is not None:
        prompts8 = [list(range(100 + i, 228 + i if not CPU else 116 + i)) for i in range(8 if not CPU else 2)]
        for spec in (SpecConfig(3, 1, 4), SpecConfig(4, 4, 16)):
            for rows in (prompts8[:1], prompts8):
                e = Engine(m, None, EngineConfig(max_batch_size=len(rows), **CFG), drafter=d, spec=spec)
                e.reserve(len(rows), 1024)
                e.warmup(range(1, len(rows) + 1))
                e.generate(rows, SamplingParams(max_new_tokens=8, ignore_eos=True))
                tps, sids = timed_generate(e, rows, params)
                tag = f"S{spec.steps}K{spec.topk}D{spec.draft_tokens}_b{len(rows)}"
                row[f"{tag}_tok_per_s"] = round(tps, 1)
                row[f"{tag}_ids"] = sids
                del e
                gc.collect()
    gc.collect()
    if not CPU:
        torch.cuda.empty_cache()
    return row


for shape in SHAPES:
    m = random_model(shape if not CPU else tiny_config(), DEV, DT, 0).model
    prepare_for_inference(m, DEV, None if not CPU else True, None if not CPU else False)
    d = None
    if shape != "llama-3.1-8b":
        d = random_drafter(m.config, DEV, DT, 0)
        prepare_for_inference(d, DEV, None if not CPU else True, None if not CPU else False)
    off = measure(shape, m, d, False)
    on = measure(shape, m, d, True)
    pdl.ENABLED = None
    summary = {"shape": shape}
    for k in off:
        if k.endswith("ids"):
            summary[f"equal_{k}"] = off[k] == on[k]
        elif k not in ("shape", "pdl"):
            summary[k] = [off[k], on[k]]
    emit(summary)
    if not all(v for k, v in summary.items() if k.startswith("equal_")):
        print(f"PDL CHANGED TOKENS for {shape}: a kernel reads before its wait", flush=True)
    del m, d
    gc.collect()
    if not CPU:
        torch.cuda.empty_cache()

print("\n| shape | measurement | PDL off | PDL on |\n| --- | --- | ---: | ---: |")
for r in emit.rows:
    for k, v in r.items():
        if isinstance(v, list):
            print(f"| {r['shape']} | {k} | {v[0]} | {v[1]} |")
        elif k != "shape":
            print(f"| {r['shape']} | {k} | {v} | |")
