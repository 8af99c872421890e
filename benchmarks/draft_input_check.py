"""Do the drafter's input kernel (`layers/draft_input_kernel.py`: embedding, two norms, concatenation, cos/sin in one
launch) and the argmax's own draft id -> target id lookup make speculative steps faster?

Random SmolLM2-135M weights and a random drafter with a 12,288-token draft vocabulary (the shipped drafter's), bf16,
CUDA graphs, PDL; engines stepped 30 steps after 128-token prompts. Four wirings in one process, the first two
twice (before, new, no_input, no_table, before, new): `new` (both), `no_input` (`draft_input` unset: the PyTorch path), `no_table` (the argmax then a lookup kernel, as
before), `before` (neither). For each: ms per replay of the draft graph and of the whole step (draft, verify,
commit) of a chain of 3 at 1, 8 and 32 rows and of a tree S4 K4 D16 at 1 row, and the tokens of a one-row chain
engine's `generate` (256 after 128) against `before`'s. First, the kernel's outputs against the PyTorch path on the
GPU (float32 and bf16, positions up to 8,191: cos / sin of large angles). With `--trace` also where the 8-row
chain's draft graph goes, kernel by kernel, for `new` and `before`.

Run under an older tree (PYTHONPATH at its src) the script measures that tree as `as_is` only (it has no kernel);
`--as-is` measures any tree as it is wired (`new`, twice), for A/B runs of two trees.

usage: python benchmarks/draft_input_check.py OUT_DIR [--trace] [--as-is]
"""

from __future__ import annotations

import hashlib
import sys

from probe_script import (DEV, Emitter, agreement, draft_step_ms, generated_tokens, kernel_advance,  # noqa: E402
                          print_advance, random_pair)

import torch  # noqa: E402

import eaglespec.spec.draft as draft_mod  # noqa: E402
from eaglespec.config import SpecConfig  # noqa: E402

try:
    from eaglespec.layers import draft_input_kernel as dik
except ImportError:  # an older tree
    dik = None

emit = Emitter("draft_input_check.json")

if dik is not None:  # accuracy on the GPU (the CPU tests run Triton's interpreter, i.e. numpy's cos / sin)
    from eaglespec.config import RopeConfig
    from eaglespec.layers.rotary import inv_freq_and_scale

    for dt in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        B, T, H, V = 4, 8, 576, 49152
        embed = (torch.randn(V, H, generator=g) * 0.5).to(dt).to(DEV)
        ids = torch.randint(0, V, (B, T), generator=g).to(DEV)
        h = (torch.randn(B, T, H, generator=g) * 3).to(dt).to(DEV)
        w = (1 + 0.1 * torch.randn(2, H, generator=g)).to(dt).to(DEV)
        pos = torch.randint(0, 8192, (B, T), generator=g).to(DEV)
        inv, factor = inv_freq_and_scale(64, RopeConfig(theta=100000.0))
        args = (ids, embed, h, w[0], 1e-5, w[1], 1e-5, pos, inv.to(DEV), factor)
        got, want = dik.draft_input(*args), dik.draft_input_reference(*args)
        emit({"check": str(dt), "x_max_abs": (got[0].float() - want[0].float()).abs().max().item(),
              "x_ulp_flips": (got[0] != want[0]).float().mean().item(),
              "cos_max_abs": (got[1] - want[1]).abs().max().item(),
              "sin_max_abs": (got[2] - want[2]).abs().max().item()})

m, d = random_pair(draft_vocab=12288)
kernel = getattr(d, "draft_input", None)
plain_greedy = draft_mod.greedy_ids


def greedy_then_lookup(logits, table=None):  # the argmax, then the lookup as a kernel of its own (as before)
    ids = plain_greedy(logits)
    return ids if table is None else table[ids]


if dik is None:  # an older tree
    wirings = ("as_is",) * 2
elif "--as-is" in sys.argv:  # the tree as it is wired, twice (an A/B against another tree's run)
    wirings = ("new",) * 2
else:
    wirings = ("before", "new", "no_input", "no_table", "before", "new")
tokens = {}
for name in wirings:
    d.draft_input = kernel if name in ("new", "no_table", "as_is") else None
    draft_mod.greedy_ids = greedy_then_lookup if name in ("before", "no_table") else plain_greedy

    def trace(spec, rows, graphs, name=name):  # the draft graph alone replays without moving the state
        if "--trace" not in sys.argv or rows != 8 or spec.topk != 1 or name not in ("new", "before", "as_is") \
                or name in tokens:
            return {}
        r = kernel_advance(dict(graphs)["draft"])
        print_advance(f"{name}: 8-row chain draft", r, top=18)
        return {"trace_draft_kernels": r["kernels"]}

    row = {"wiring": name, **draft_step_ms(m, d, look=trace)}
    out = generated_tokens(m, d, SpecConfig(3, 1, 4))
    row["tokens_equal_first"] = agreement(out, tokens.setdefault("first", out))
    row["tokens_digest"] = hashlib.sha1(str(out).encode()).hexdigest()[:12]  # to compare runs of two trees
    tokens.setdefault(name, out)
    emit(row)
    torch.cuda.empty_cache()
