"""First GPU check (H200): correctness and speed of the eager path, the CUDA-graph path, speculation (oracle and random
drafters), the verify-vs-decode step cost, transformers' generate as the peer, and a Llama-3.1-8B-shaped decode.

usage: python benchmarks/gpu_smoke.py MODEL.gguf OUT_DIR SECTION   (SECTION: fp32, bf16, bf16fast, peer, 8b; each in its own
process so that a device-side error in one cannot poison the others)
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

from eaglespec import api
from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.models.eagle3 import LlamaForCausalLMEagle3
from eaglespec.sampling_params import SamplingParams
from eaglespec.spec.oracle import OracleDrafter

MODEL, OUT = sys.argv[1], Path(sys.argv[2])
OUT.mkdir(parents=True, exist_ok=True)
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [json.loads(l)["turns"][0] for l in (ROOT / "src/eaglespec/assets/mt_bench_question.jsonl").read_text().splitlines()[:8]]
N = 128
rows: list[dict] = []


def sync():
    torch.cuda.synchronize()


def timed(engine: Engine, prompts, label, oracle_refs=None, **extra):
    engine.reserve(1, 2048)
    t_cap = time.perf_counter()
    n_graphs = engine.warmup([1])
    t_cap = time.perf_counter() - t_cap
    if oracle_refs is not None:
        engine.drafter.set_references([oracle_refs[0]])
    engine.generate([prompts[0]], SamplingParams(max_new_tokens=16))
    engine.stats.__init__()
    engine.runner.timer.enabled = True
    engine.runner.timer.reset()
    outs = []
    sync()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        if oracle_refs is not None:
            engine.drafter.set_references([oracle_refs[i]])
        outs.append(engine.generate([p], SamplingParams(max_new_tokens=N))[0])
    sync()
    dt = time.perf_counter() - t0
    tok = sum(len(o.token_ids) for o in outs)
    phases = engine.runner.timer.totals()
    row = {"run": label, "tokens": tok, "seconds": round(dt, 3), "tok_per_s": round(tok / dt, 1),
           "graphs": n_graphs, "capture_s": round(t_cap, 2), "phases": {k: round(v, 3) for k, v in phases.items()},
           **extra}
    if engine.speculative:
        row.update(engine.stats.to_dict())
        steps = engine.stats.verify_steps
        row["verify_ms_per_step"] = round(1000 * phases.get("verify", 0) / max(steps, 1), 3)
        row["draft_ms_per_step"] = round(1000 * phases.get("draft", 0) / max(steps, 1), 3)
    else:
        row["decode_ms_per_step"] = round(1000 * phases.get("decode", 0) / max(tok - len(prompts), 1), 3)
    rows.append(row)
    print(json.dumps(row), flush=True)
    return outs


def section(fn):
    try:
        fn()
    except Exception:
        traceback.print_exc()
        rows.append({"run": fn.__name__, "error": traceback.format_exc(limit=3)[-800:]})


def random_drafter(cfg: ModelConfig, device, dtype):
    dc = ModelConfig.from_hf(dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=1,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope.theta,
        draft_vocab_size=8192, target_hidden_size=cfg.hidden_size))
    torch.manual_seed(0)
    d = LlamaForCausalLMEagle3(dc).to(device=device, dtype=dtype).eval()
    d.d2t.copy_(torch.arange(8192, device=device) * 0)
    return prepare_for_inference(d, device, None, False)


state: dict = {}


DTYPE = "bfloat16"


def nospec():
    e = api.load(MODEL, draft=None, config=EngineConfig(dtype=DTYPE, compile=False))
    state["ref"] = timed(e, PROMPTS, f"no-spec cuda-graphs {DTYPE} (fused)")
    state["engine"] = e


def eager():
    e = api.load(MODEL, draft=None,
                 config=EngineConfig(cuda_graphs=False, fuse_projections=False, compile=False, dtype=DTYPE))
    outs = timed(e, PROMPTS[:2], f"no-spec eager {DTYPE}")
    same = sum(a.token_ids == b.token_ids for a, b in zip(outs, state["ref"]))
    rows[-1]["identical_to_nospec"] = f"{same}/2"


def compiled():
    e = api.load(MODEL, draft=None, config=EngineConfig(compile=True, dtype=DTYPE))
    outs = timed(e, PROMPTS, f"no-spec cuda-graphs {DTYPE} fused+compiled")
    same = sum(a.token_ids == b.token_ids for a, b in zip(outs, state["ref"]))
    rows[-1]["identical_to_nospec"] = f"{same}/{len(PROMPTS)}"
    state["compiled"] = e


def spec_runs(specs, drafter_kind, base="engine"):
    target = state[base].target
    refs = [state["engine"].encode_prompt(p) + o.token_ids for p, o in zip(PROMPTS, state["ref"])]
    for spec in specs:
        if drafter_kind == "oracle":
            d = OracleDrafter(target.config, [refs[0]], capacity=2100)
        else:
            d = random_drafter(target.config, target.lm_head.weight.device, target.lm_head.weight.dtype)
        e = Engine(target, state["engine"].tokenizer, EngineConfig(), drafter=d, spec=spec)
        outs = timed(e, PROMPTS, f"{drafter_kind} S{spec.steps}K{spec.topk}D{spec.draft_tokens} {DTYPE} {base}",
                     oracle_refs=refs if drafter_kind == "oracle" else None)
        same = sum(a.token_ids == b.token_ids for a, b in zip(outs, state["ref"]))
        rows[-1]["identical_to_nospec"] = f"{same}/{len(PROMPTS)}"


def oracle():
    spec_runs((SpecConfig(3, 1, 4), SpecConfig(7, 1, 8), SpecConfig(5, 4, 16)), "oracle")


def random_draft():
    spec_runs((SpecConfig(3, 1, 4), SpecConfig(5, 4, 16)), "random")


def oracle_compiled():
    spec_runs((SpecConfig(3, 1, 4), SpecConfig(7, 1, 8), SpecConfig(5, 4, 16)), "oracle", base="compiled")


def profile():
    """Kernel-level split of eager decode steps of the compiled model (GPU time per kernel, no launch gaps)."""
    from torch.profiler import ProfilerActivity, profile as prof

    e = state["compiled"]
    graphs, e.runner.graphs = e.runner.graphs, None
    e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4))
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=21))
    table = p.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    (OUT / "profile_decode.txt").write_text(table)
    n = sum(k.count for k in p.key_averages())
    rows.append({"run": "profile compiled eager decode", "kernels_per_forward": round(n / 21, 1)})
    e.runner.graphs = graphs


def hf_peer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(Path(MODEL).parent), Path(MODEL).name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16).cuda().eval()
    total, t0 = 0, None
    for i, p in enumerate(PROMPTS[:4]):
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt")
        ids = (ids["input_ids"] if hasattr(ids, "keys") else ids).cuda()
        if i == 1:
            sync()
            t0 = time.perf_counter()
        out = m.generate(ids, max_new_tokens=N, do_sample=False)
        if i >= 1:
            total += out.shape[1] - ids.shape[1]
    sync()
    dt = time.perf_counter() - t0
    rows.append({"run": "transformers generate bf16 (peer)", "tokens": total, "seconds": round(dt, 3),
                 "tok_per_s": round(total / dt, 1)})
    print(rows[-1], flush=True)


def profile_spec():
    """Kernel-level split of eager speculative steps (oracle chain D=4, compiled model): what verify adds to decode."""
    from torch.profiler import ProfilerActivity, profile as prof, record_function

    target = state["compiled"].target
    refs = [state["engine"].encode_prompt(p) + o.token_ids for p, o in zip(PROMPTS, state["ref"])]
    e = Engine(target, state["engine"].tokenizer, EngineConfig(cuda_graphs=False),
               drafter=OracleDrafter(target.config, [refs[0]], capacity=2100), spec=SpecConfig(3, 1, 4))
    e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8))
    phases = {}
    orig = e.runner.timer.phase
    e.runner.timer.phase = lambda name: record_function(f"phase::{name}")
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        e.generate([PROMPTS[0]], SamplingParams(max_new_tokens=41))
    e.runner.timer.phase = orig
    for ev in p.key_averages():
        if ev.key.startswith("phase::"):
            phases[ev.key] = {"calls": ev.count, "cuda_ms_total": round(ev.device_time_total / 1000, 3)}
    (OUT / "profile_spec.txt").write_text(p.key_averages().table(sort_by="cuda_time_total", row_limit=40))
    rows.append({"run": "profile eager spec steps (oracle S3K1D4, compiled)", "phases": phases})


def llama8b(compile: bool = False):
    from eaglespec.bench.drafters import verify_step_seconds
    from eaglespec.bench.random_model import random_model

    m = random_model("llama-3.1-8b", torch.device("cuda"), torch.bfloat16, 0).model
    prepare_for_inference(m, torch.device("cuda"), None, compile)
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    e = Engine(m, None, EngineConfig())
    e.reserve(1, 1024)
    e.warmup([1])
    prompt = list(range(1000, 1128))
    params = SamplingParams(max_new_tokens=256, ignore_eos=True)
    e.generate([prompt], SamplingParams(max_new_tokens=8, ignore_eos=True))
    e.runner.timer.enabled = True
    e.runner.timer.reset()
    sync()
    t0 = time.perf_counter()
    o = e.generate([prompt], params)[0]
    sync()
    dt = time.perf_counter() - t0
    dec = e.runner.timer.totals()["decode"] / (len(o.token_ids) - 1)
    bw = nbytes / dec / 1e9
    rows.append({"run": f"llama-3.1-8B shape random bf16 decode b1{' compiled' if compile else ''}",
                 "tokens": len(o.token_ids), "tok_per_s": round(len(o.token_ids) / dt, 1),
                 "decode_ms_per_step": round(1000 * dec, 3), "weights_GB": round(nbytes / 1e9, 2),
                 "achieved_GBps": round(bw, 1), "floor_tok_per_s_at_4.28TBps": round(4.28e12 / nbytes, 1)})
    print(rows[-1], flush=True)
    # the verify step of a D=4 and a D=8 chain against that decode step (an oracle drafter proposes the decode's
    # own tokens; bf16 near-ties may end its run of acceptances early, which does not change a verify step's cost)
    for spec in (SpecConfig(3, 1, 4), SpecConfig(7, 1, 8)):
        ver = verify_step_seconds(m, prompt, prompt + o.token_ids, spec, EngineConfig(), 256)
        rows.append({"run": f"llama-3.1-8B shape verify D={spec.draft_tokens} b1{' compiled' if compile else ''}",
                     "verify_ms_per_step": round(1000 * ver, 3), "verify_over_decode": round(ver / dec, 3)})
        print(rows[-1], flush=True)


def llama8b_compiled():
    llama8b(compile=True)


def kernel_check():
    """The fused RoPE + KV-store Triton kernel against the PyTorch path on the GPU, float32: same greedy answers."""
    outs = {}
    for use_kernel in (False, True):
        e = api.load(MODEL, draft=None, config=EngineConfig(dtype="float32", compile=False))
        if not use_kernel:
            for mod in e.target.modules():
                if hasattr(mod, "rope_store"):
                    mod.rope_store = None
        outs[use_kernel] = [o.token_ids for o in e.generate(PROMPTS[:4], SamplingParams(max_new_tokens=64))]
    same = sum(a == b for a, b in zip(outs[False], outs[True]))
    rows.append({"run": "rope+kv-store kernel vs PyTorch path (fp32 greedy)", "identical": f"{same}/4"})
    print(rows[-1], flush=True)


SECTIONS = {
    "fp32": ("float32", [kernel_check, nospec, oracle, random_draft]),
    "bf16": ("bfloat16", [nospec, eager, compiled, profile, profile_spec, oracle, oracle_compiled, random_draft]),
    "peer": ("bfloat16", [hf_peer]),
    "8b": ("bfloat16", [llama8b, llama8b_compiled]),
    "bf16fast": ("bfloat16", [nospec, compiled, profile, oracle_compiled, profile_spec]),
}
DTYPE, fns = SECTIONS[sys.argv[3]]
for fn in fns:
    t = time.perf_counter()
    section(fn)
    print(f"== {fn.__name__} took {time.perf_counter() - t:.1f}s", flush=True)
OUT.mkdir(parents=True, exist_ok=True)
(OUT / f"smoke_{sys.argv[3]}.json").write_text(json.dumps(rows, indent=1))
print("\n| run | tok/s | tau | ms/step | notes |\n|---|---|---|---|---|")
for r in rows:
    print(f"| {r['run']} | {r.get('tok_per_s', '')} | {r.get('accept_length_mean', '')} | "
          f"{r.get('decode_ms_per_step', r.get('verify_ms_per_step', ''))} | "
          f"{r.get('identical_to_nospec', r.get('identical', r.get('achieved_GBps', '')))} {str(r.get('error', ''))[-200:]} |")
