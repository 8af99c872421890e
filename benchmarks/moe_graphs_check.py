"""MoE targets on CUDA graphs (session 54): the grouped expert kernels (layers/moe_kernel.py) checked and timed.

    python benchmarks/moe_graphs_check.py [--part all|check|layer|model] [--new 64] [--shape qwen3-30b-a3b]

check: tiny random Qwen3-MoE, DeepSeek-V3 and DeepSeek-V2 targets in float32 on the device: the eager engine with
  the per-expert loop (no graphs) against the prepared one (grouped kernels, CUDA graphs; MLA's attention and RoPE
  kernels): plain greedy and speculation with a random drafter (chain 3,1,4 and tree 3,2,6) must give the same
  tokens, also with hidden size 1,536 (its one-row projections and router logits through the GEMV kernel); and
  `grouped_experts` against the eager loop at Qwen3-30B-A3B's layer shape in bf16 (max error relative to the
  output's largest value).
layer: the block layout by pairs (one program against the sort), then one MoE layer's routed experts, bf16, random
  routing: the eager loop against `grouped_experts` replayed from a CUDA graph, for N tokens (k = 8 pairs each),
  and the bytes of the distinct experts chosen over that time (Qwen3's one-token layer fits the 50 MB L2: read warm);
  tile configurations swept; at Qwen3-30B-A3B's shape (128 experts, H 2048, I 768) and DeepSeek-V3's (256
  experts, H 7168, I 2048).
model: Qwen3-30B-A3B's shape (or `--shape`, e.g. kimi-k2.5-slice on an H200) with random bf16 weights
  (`bench.random_model`; Qwen3-30B-A3B: 61 GB): one decode step at batch 1 by the engine's phase timer with the eager
  per-expert loop (no graphs) and with the grouped kernels on CUDA graphs, and verify steps of an oracle chain
  (D = 4, 8) against that decode step (issue 4's verify-vs-decode ratio).
Prints a table per part.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from eaglespec.bench.drafters import decode_step_seconds, verify_step_seconds
from eaglespec.config import EngineConfig, ModelConfig, MoEConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine import transforms
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.layers.gemv_kernel import gemv_rows
from eaglespec.layers.moe import MoE
from eaglespec.layers.moe_kernel import grouped_experts
from eaglespec.models import get_model_class
from eaglespec.models.eagle3 import LlamaForCausalLMEagle3
from eaglespec.sampling_params import SamplingParams

DEV = torch.device("cuda")


def tiny_target(arch: str, wide: bool = False) -> torch.nn.Module:
    """A tiny random float32 target; `wide`: hidden size and attention width 1,536, so that its one-row q/k/v,
    o_proj, MLA projections and router logits take the GEMV kernel (transforms.GEMV_MIN_K)."""
    d = _tiny_config(arch)
    if wide:
        d.update(hidden_size=1536, num_attention_heads=12, num_key_value_heads=4 if arch == "qwen3_moe" else 12)
        d["head_dim" if arch == "qwen3_moe" else "v_head_dim"] = 128
    cfg = ModelConfig.from_hf(d)
    model = get_model_class(cfg.architecture)(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif t.dim() == 1:
                t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g))
            else:
                t.copy_(2.0 * torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))
    return model.to(DEV)


def _tiny_config(arch: str) -> dict:
    if arch == "qwen3_moe":
        d = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=512, hidden_size=128,
                 intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                 max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=1e6, tie_word_embeddings=False)
    else:
        d = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=512, hidden_size=128,
                 intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=4, n_shared_experts=1, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32,
                 v_head_dim=32, routed_scaling_factor=2.5, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1,
                 q_lora_rank=48, max_position_embeddings=1024, rope_theta=10000.0, norm_topk_prob=True,
                 topk_method="noaux_tc", scoring_func="sigmoid")
        if arch == "deepseek_v2":  # V3's layers, V2's router: group-limited softmax (PyTorch's on the graph path)
            d.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", scoring_func="softmax",
                     topk_method="group_limited_greedy", norm_topk_prob=False)
    return d


def tiny_drafter(target: torch.nn.Module) -> torch.nn.Module:
    c = target.config
    cfg = ModelConfig.from_hf(dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama",
                                   vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=256,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=1024, target_hidden_size=c.hidden_size,
                                   draft_vocab_size=256, tie_word_embeddings=False))
    d = LlamaForCausalLMEagle3(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() == 2:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return d.to(DEV)


def part_check() -> None:
    prompts = [[(7 * i + j) % 500 + 3 for i in range(n)] for j, n in enumerate((5, 17, 60))]
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    print("| target | run | answers equal to the eager loop's (3) | verify steps |")
    print("| --- | --- | --- | ---: |")
    for arch, wide in (("qwen3_moe", False), ("deepseek_v3", False), ("deepseek_v2", False), ("qwen3_moe", True),
                       ("deepseek_v3", True)):
        target = tiny_target(arch, wide)
        cfg = EngineConfig(max_batch_size=4)
        ref = [o.token_ids for o in Engine(target, None, EngineConfig(max_batch_size=4, cuda_graphs=False))
               .generate(prompts, params)]
        drafter = tiny_drafter(target)
        prepare_for_inference(target, DEV, None, None)
        prepare_for_inference(drafter, DEV, None, None)
        gemv = sum(getattr(m, "kernel", None) is gemv_rows for m in target.modules())
        gemv += sum(getattr(m, "logits_rows", None) is gemv_rows for m in target.modules())
        arch = f"{arch}{' (1,536 wide)' if wide else ''}, {gemv} GEMV layers"
        for label, spec in (("plain", None), ("chain 3,1,4", SpecConfig(3, 1, 4)), ("tree 3,2,6", SpecConfig(3, 2, 6))):
            eng = Engine(target, None, cfg, drafter=drafter if spec else None, spec=spec)
            assert eng.runner.graphs is not None, "the grouped MoE target did not take the graph path"
            got = [o.token_ids for o in eng.generate(prompts, params)]
            same = sum(a == b for a, b in zip(got, ref))
            print(f"| {arch} | {label} (graphs) | {same} | {eng.stats.verify_steps if spec else '-'} |")
    m = qwen_layer()
    print("\n| N tokens | grouped vs eager loop, bf16: max abs error / max abs output |")
    print("| ---: | ---: |")
    for N in (1, 8, 64, 512, 4096):
        x = torch.randn(N, m.w13.shape[2], device=DEV, dtype=torch.bfloat16)
        with torch.no_grad():
            w, ids = m.gate(x)
            ref = m._routed(x, w, ids).float()
            got = grouped_experts(x, w, ids, m.w13, m.w2).float()
        print(f"| {N} | {(got - ref).abs().max().item() / ref.abs().max().item():.2e} |")
    # captured in a CUDA graph (training's feature graphs capture long batches: the sort-based layout), replayed on
    # new inputs written into the captured ones
    for N in (2, 1024):
        x = torch.randn(N, m.w13.shape[2], device=DEV, dtype=torch.bfloat16)
        with torch.no_grad():
            w, ids = m.gate(x)
            graph, out = capture(lambda: grouped_experts(x, w, ids, m.w13, m.w2))
            x.copy_(torch.randn_like(x))
            w_new, ids_new = m.gate(x)
            w.copy_(w_new)
            ids.copy_(ids_new)
            graph.replay()
            torch.cuda.synchronize()
            same = torch.equal(out, grouped_experts(x, w, ids, m.w13, m.w2))
        print(f"| {N}, captured | a replay on new inputs equals an eager call: {same} |")


def moe_layer(E: int, k: int, H: int, I: int) -> MoE:
    cfg = MoEConfig(n_routed_experts=E, num_experts_per_tok=k, n_shared_experts=0, moe_intermediate_size=I,
                    scoring_func="softmax", topk_method="greedy")
    with torch.device("meta"):
        m = MoE(H, cfg)
    m = m.to_empty(device=DEV).to(torch.bfloat16).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, p.shape[-1] ** -0.5)
    from eaglespec.engine.transforms import use_grouped_experts

    return use_grouped_experts(m)


def qwen_layer() -> MoE:
    return moe_layer(128, 8, 2048, 768)


def time_fn(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


CFGS = [(64, 64, 4, 3), (32, 128, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (32, 64, 2, 3), (128, 128, 8, 3)]


def capture(fn):
    """(graph, output) of fn captured in a CUDA graph (fn run twice on a side stream first, as the engine does)."""
    fn()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_time(fn, reps: int = 100) -> float:
    """Seconds per replay of fn captured in a CUDA graph."""
    return time_fn(capture(fn)[0].replay, reps)


def part_layer() -> None:
    from eaglespec.layers import moe_kernel

    default = None  # the kernel's own choice by width
    print("| layer | N | experts read | eager loop ms | grouped (graph) ms | grouped GB/s | speed-up "
          "| best config, ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for label, shape in (("Qwen3-30B-A3B", (128, 8, 2048, 768)), ("DeepSeek-V3", (256, 8, 7168, 2048))):
        m = moe_layer(*shape)
        per_expert = 3 * shape[2] * shape[3] * 2
        for N in (1, 4, 8, 32, 256):
            x = torch.randn(N, shape[2], device=DEV, dtype=torch.bfloat16)
            with torch.no_grad():
                w, ids = m.gate(x)
            n_exp = len(set(ids.flatten().tolist()))
            eager = time_fn(lambda: m._routed(x, w, ids), 20)
            by_cfg = {}
            for cfg in CFGS:  # (BLOCK_N, BLOCK_K, num_warps, num_stages) of the two GEMMs
                moe_kernel.GEMM_CFG = cfg
                by_cfg[cfg] = graph_time(lambda: grouped_experts(x, w, ids, m.w13, m.w2))
            moe_kernel.GEMM_CFG = default
            g = graph_time(lambda: grouped_experts(x, w, ids, m.w13, m.w2))
            best = min(by_cfg, key=by_cfg.get)
            print(f"| {label} | {N} | {n_exp} | {eager * 1e3:.3f} | {g * 1e3:.3f} | "
                  f"{n_exp * per_expert / g / 1e9:.0f} | {eager / g:.1f}x | {best}: {by_cfg[best] * 1e3:.3f} |")


def part_layout() -> None:
    """The block layout alone: the one-program kernel against the sort-based layout, by pairs (128 experts, k 8)."""
    from eaglespec.layers import moe_kernel

    print("| pairs | one program ms | by sort ms |")
    print("| ---: | ---: | ---: |")
    limit = moe_kernel.ONE_PROGRAM_MAX_PAIRS
    for P in (8, 64, 512, 2048, 4096, 16384):
        ids = torch.stack([torch.randperm(128, device=DEV)[:8] for _ in range(P // 8)])
        moe_kernel.ONE_PROGRAM_MAX_PAIRS = 1 << 30
        one = time_fn(lambda: moe_kernel.expert_blocks(ids, 128, 16), 20)
        moe_kernel.ONE_PROGRAM_MAX_PAIRS = 0
        srt = time_fn(lambda: moe_kernel.expert_blocks(ids, 128, 16), 20)
        print(f"| {P} | {one * 1e3:.3f} | {srt * 1e3:.3f} |")
    moe_kernel.ONE_PROGRAM_MAX_PAIRS = limit


def part_model(new: int, shape: str, gemv_rows_max: int) -> None:
    from eaglespec.bench.random_model import random_model

    t0 = time.perf_counter()
    loaded = random_model(shape, DEV, torch.bfloat16, 0)
    target = loaded.model
    transforms.GEMV_MAX_ROWS = gemv_rows_max
    prepare_for_inference(target, DEV, None, None)
    print(f"built + prepared in {time.perf_counter() - t0:.0f} s; "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB peak")
    prompt = [(37 * i) % 150000 + 10 for i in range(128)]
    cfg = EngineConfig(max_batch_size=1)
    graphs_decode, ref = decode_step_seconds(target, prompt, cfg, new)
    moes = [m for m in target.modules() if isinstance(m, MoE)]
    stacks = [(m.w13, m.w2) for m in moes]
    for m in moes:  # the eager per-expert loop (the path before session 54), same weights
        m.w13 = m.w2 = None
        m.supports_cuda_graphs = False
    eager_decode, eager_ref = decode_step_seconds(target, prompt, cfg, new)
    for m, (a, b) in zip(moes, stacks):
        m.w13, m.w2 = a, b
        m.supports_cuda_graphs = True
    agree = sum(a == b for a, b in zip(ref, eager_ref))
    print(f"\n| {shape} (random bf16), batch 1, GEMV up to {gemv_rows_max} rows | ms per step | against the grouped "
          "decode step |")
    print("| --- | ---: | ---: |")
    print(f"| decode, eager per-expert loop (no graphs) | {eager_decode * 1e3:.2f} | "
          f"{eager_decode / graphs_decode:.2f}x |")
    print(f"| decode, grouped kernels, CUDA graphs | {graphs_decode * 1e3:.2f} | 1.00x |")
    full = prompt + ref
    for D in (4, 8):
        v = verify_step_seconds(target, prompt, full, SpecConfig(D - 1, 1, D), cfg, new)
        print(f"| verify of an oracle chain D={D}, graphs | {v * 1e3:.2f} | {v / graphs_decode:.2f}x |")
    print(f"(greedy tokens of the two decode paths agreeing position by position: {agree}/{len(ref)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all", choices=["all", "check", "layer", "model"])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--gemv-rows", type=int, default=transforms.GEMV_MAX_ROWS, help="transforms.GEMV_MAX_ROWS")
    ap.add_argument("--shape", default="qwen3-30b-a3b", help="model's random-weights preset (kimi-k2.5-slice: H200)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.part in ("all", "check"):
        part_check()
    if a.part in ("all", "layer"):
        part_layout()
        part_layer()
    if a.part in ("all", "model"):
        part_model(a.new, a.shape, a.gemv_rows)


if __name__ == "__main__":
    main()
