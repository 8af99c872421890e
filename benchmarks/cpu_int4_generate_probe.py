"""The embedded SmolLM2 on the CPU with its projections through PyTorch's groupwise 4-bit kernel: tok/s and answers,
against today's float32 path and bf16. A probe for planning (session 62); no engine path uses it.

Each projection (q/k/v, o_proj, gate/up, down_proj; fused as the engine fuses them) of a bf16 engine is replaced by a
module that multiplies through `aten._weight_int4pack_mm_for_cpu` (bf16 activations). Its 4-bit codes and group
scales come from the float32 engine's weights, which hold Q4_1's values exactly: each group of 32 holds a code 0 (its
minimum, m) and a code 15 (its maximum), so m is the group's minimum, d the float16 nearest (max - min) / 15, and the
codes round((w - m) / d) reproduce every float32 weight (checked); the kernel takes the scale d and the zero m + 8d
as bf16 (its only type with bf16 activations), so its weights differ from the GGUF's by that rounding (~2^-9 of a
group's scale). The lm_head (the tied Q8_0 embedding), norms and attention stay bf16 dense.

usage: PYTHONPATH=src python benchmarks/cpu_int4_generate_probe.py [N_PROMPTS=6] [NEW_TOKENS=64]   (engines of one row)
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

from eaglespec.api import load, load_drafter
from eaglespec.assets import default_drafter_path
from eaglespec.bench.datasets import mt_bench
from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.sampling_params import SamplingParams

N_PROMPTS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
NEW = int(sys.argv[2]) if len(sys.argv) > 2 else 64
GROUP = 32


class Int4Linear(nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        N, K = w.shape
        g = w.float().view(N, K // GROUP, GROUP)
        m = g.amin(-1)
        d = ((g.amax(-1) - m) / 15).half().float()
        q = torch.where(d[..., None] > 0, ((g - m[..., None]) / d[..., None].clamp(min=1e-30)).round(), 0).clamp(0, 15)
        assert torch.equal(d[..., None] * q + m[..., None], g), "not Q4_1 groups"
        self.n = N
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.view(N, K).to(torch.int32), 1)
        self.sz = torch.stack([d.t(), (m + 8 * d).t()], dim=-1).contiguous().to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]), self.packed, GROUP, self.sz)
        return y.view(*x.shape[:-1], self.n)


NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
prompts = [item.first for item in mt_bench()[:N_PROMPTS]]
params = SamplingParams(max_new_tokens=NEW)


def timed(engine: Engine, name: str) -> list[list[int]]:
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=8))  # warm-up
    t = time.perf_counter()
    out = [o.token_ids for o in engine.generate(prompts, params)]
    s = time.perf_counter() - t
    n = sum(len(o) for o in out)
    h = engine.stats.hist
    tau = sum(t * c for t, c in enumerate(h)) / sum(h) if engine.runner.speculative and sum(h) else None
    print(f"{name}: {n} tokens in {s:.2f} s, {n / s:.1f} tok/s" + (f", tau {tau:.2f}" if tau else ""), flush=True)
    return out


ONE = EngineConfig(max_batch_size=1)  # one row, as `eaglespec generate` runs
plain32 = timed(load(draft=None, config=ONE), "float32 plain (today's default path)")
e32 = load(draft=None, config=ONE)
fp32 = {n: m.weight.detach() for n, m in e32.runner.target.named_modules() if n.rsplit(".", 1)[-1] in NAMES}
del e32
e16 = load(draft=None, config=EngineConfig(max_batch_size=1, dtype="bfloat16"))
plain16 = timed(e16, "bf16 plain")
target = e16.runner.target
for name, w in fp32.items():
    parent, leaf = name.rsplit(".", 1)
    setattr(target.get_submodule(parent), leaf, Int4Linear(w))
plain4 = timed(e16, "int4 plain")
drafter = load_drafter(default_drafter_path(), "cpu", torch.bfloat16)
prepare_for_inference(drafter, torch.device("cpu"), None, None)
for spec in (SpecConfig(1, 1, 2), SpecConfig(2, 1, 3), SpecConfig(3, 2, 6)):
    eng = Engine(target, e16.tokenizer, EngineConfig(max_batch_size=1, dtype="bfloat16"), drafter=drafter, spec=spec)
    out = timed(eng, f"int4 S{spec.steps} K{spec.topk} D{spec.draft_tokens}")
    print(f"  answers equal int4 plain decoding's: {sum(a == b for a, b in zip(out, plain4))}/{len(out)}")
print(f"int4 plain answers equal float32's: {sum(a == b for a, b in zip(plain4, plain32))}/{len(plain4)}, "
      f"bf16's: {sum(a == b for a, b in zip(plain4, plain16))}/{len(plain4)}")
