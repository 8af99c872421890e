"""Qwen2 / Qwen3 targets (session 52, tested on the CPU only) through the full inference path of a device: a random
model of each written by transformers to a folder, loaded by `eaglespec.load` (every transform and kernel the device
takes: on CUDA graphs, fused projections, Triton kernels; since session 54 QKNormAttention's head norms in the
RoPE + KV-store kernel),
greedy against transformers' own `generate` of the same weights, in float32 (exact but for reassociation) and bf16.

    python benchmarks/qwen_device_check.py [--device cuda] [--new 48]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import transformers

from eaglespec import api
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams

SHAPE = dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-6, initializer_range=0.1,
             rope_theta=1e6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--new", type=int, default=48)
    args = ap.parse_args()
    prompts = [[(7 * i + j) % 4000 + 10 for i in range(n)] for j, n in enumerate((9, 40, 130))]
    print("| model | dtype | tokens agreeing with transformers (of each answer) |")
    print("| --- | --- | --- |")
    for family, extra in (("Qwen2", {}), ("Qwen3", {"head_dim": 64})):
        cfg = getattr(transformers, f"{family}Config")(**SHAPE, **extra)
        cfg.architectures = [f"{family}ForCausalLM"]
        torch.manual_seed(0)
        ref = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
        with tempfile.TemporaryDirectory() as folder:
            ref.save_pretrained(folder)
            for dtype in ("float32", "bfloat16"):
                hf = ref.to(device=args.device, dtype=getattr(torch, dtype))
                eng = api.load(folder, draft=None, config=EngineConfig(device=args.device, dtype=dtype,
                                                                        max_batch_size=4))
                outs = eng.generate(prompts, SamplingParams(max_new_tokens=args.new, ignore_eos=True), chat=False)
                agree = []
                for p, o in zip(prompts, outs):
                    with torch.no_grad():
                        want = hf.generate(torch.tensor([p], device=args.device), max_new_tokens=args.new,
                                           do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                    agree.append(next((i for i, (a, b) in enumerate(zip(o.token_ids, want)) if a != b), args.new))
                print(f"| {family} | {dtype} | {', '.join(f'{a}/{args.new}' for a in agree)} |")
                del eng


if __name__ == "__main__":
    main()
