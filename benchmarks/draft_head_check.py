"""Does the drafter's final norm + draft head as one few-row kernel (`LlamaForCausalLMEagle3.norm_head`, wired by
`engine.transforms.use_norm_linear_kernel`) make speculative steps faster than the norm kernel + cuBLAS?

Random SmolLM2-135M weights and a random drafter with a 12,288-token draft vocabulary (the shipped drafter's head,
12,288 x 576), bf16, CUDA graphs, PDL; engines stepped 30 steps after 128-token prompts. Two wirings in one process,
each twice: `cublas` (norm_head unset) and `fused`. For each: ms per replay of the draft graph and of the whole step
(draft, verify, commit) of a chain of 3 at 1, 8 and 32 rows (heads of 1, 8 / 32 and 32 / 128 rows: the draft steps'
and the catch-up's) and of a tree S4 K4 D16 at 1 row; and the tokens of a one-row chain engine's `generate` (256
after 128) against `cublas` (sums in another order can flip bf16 near-ties of random weights).

usage: python benchmarks/draft_head_check.py OUT_DIR
"""

from __future__ import annotations

from probe_script import Emitter, agreement, draft_step_ms, generated_tokens, random_pair  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402

m, d = random_pair(draft_vocab=12288)
fused_head = d.norm_head
assert fused_head is not None, "the transform left the draft head unwired"
emit = Emitter("draft_head_check.json")
tokens = {}
for name in ("cublas", "fused") * 2:
    d.norm_head = fused_head if name == "fused" else None
    row = {"wiring": name, **draft_step_ms(m, d)}
    out = generated_tokens(m, d, SpecConfig(3, 1, 4))
    row["tokens_equal_cublas"] = agreement(out, tokens.setdefault("cublas", out))
    emit(row)
    torch.cuda.empty_cache()
