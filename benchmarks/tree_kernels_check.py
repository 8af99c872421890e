"""Do the tree-construction and compaction kernels (layers/tree_build_kernels.py, layers/kv_compact_kernel.py) give
the same tokens on the GPU as the PyTorch code they replace?

Random SmolLM2-135M weights (bf16, CUDA graphs), 8 prompts of 128 tokens, 96 new tokens each, through engines of 1
and 8 rows speculating with trees (S4 K4 D16, S3 K2 D6), drafted by a random drafter and by the oracle (which
proposes plain decoding's own continuation, so that deep paths are accepted and the tree's layout and the compaction
matter; it keeps its references by engine row, so a one-row engine takes the prompts one at a time); once with the
kernels (the default on CUDA) and once with them off (`draft_tree` / `build_tree` with kernels=False, the compaction
kernel refused). The drafts, trees and acceptance are the same arithmetic, so the tokens and the acceptance
histograms must be identical. Against plain decoding (an 8-row engine) answers may differ where bf16 near-ties of
random weights flip between kernels; from there on the oracle's references no longer fit and it accepts little.

usage: python benchmarks/tree_kernels_check.py OUT_DIR [--specs=S,K,D;...] [--rows=1,8]
       (defaults: --specs=4,4,16;3,2,6 --rows=1,8)
"""

from __future__ import annotations

import functools

from probe_script import Emitter, option, random_pair  # noqa: E402


import eaglespec.engine.spec_step as runner_mod  # noqa: E402  (the speculative phases)
from eaglespec.bench.drafters import oracle, references  # noqa: E402
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.layers import kv_compact_kernel  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402
from eaglespec.spec.draft import draft_tree  # noqa: E402
from eaglespec.spec.tree import build_tree  # noqa: E402

m, d = random_pair()
prompts = [list(range(100 + 7 * i, 228 + 7 * i)) for i in range(8)]
params = SamplingParams(max_new_tokens=96, ignore_eos=True)
emit = Emitter("tree_kernels_check.json")
fits = kv_compact_kernel.fits


plain = [o.token_ids for o in Engine(m, None, EngineConfig(max_batch_size=8)).generate(prompts, params)]
orc = oracle(m.config, 8, 128 + 7 * 8 + 96 + 64)
refs = references(prompts, plain, [False] * 8, [0])
orc.set_references(refs)


def run(drafter, spec: SpecConfig, rows: int, kernels: bool):
    runner_mod.draft_tree = functools.partial(draft_tree, kernels=kernels)
    runner_mod.build_tree = functools.partial(build_tree, kernels=kernels)
    kv_compact_kernel.fits = fits if kernels else (lambda *a: False)
    e = Engine(m, None, EngineConfig(max_batch_size=rows), drafter=drafter, spec=spec)
    if drafter is orc and rows == 1:  # the oracle keeps its references by engine row: one prompt at a time in row 0
        out = []
        for ref, prompt in zip(refs, prompts):
            orc.set_references([ref])
            out += [o.token_ids for o in e.generate([prompt], params)]
        orc.set_references(refs)
    else:
        out = [o.token_ids for o in e.generate(prompts, params)]
    hist = list(e.stats.hist)
    del e
    return out, hist


for name, drafter in (("random", d), ("oracle", orc)):
    for spec in (SpecConfig(*map(int, s.split(","))) for s in option("specs", "4,4,16;3,2,6").split(";")):
        for rows in map(int, option("rows", "1,8").split(",")):
            on, h_on = run(drafter, spec, rows, True)
            off, h_off = run(drafter, spec, rows, False)
            emit({"drafter": name, "spec": f"S{spec.steps} K{spec.topk} D{spec.draft_tokens}", "rows": rows,
                  "identical_on_off": f"{sum(a == b for a, b in zip(on, off))}/{len(prompts)}",
                  "identical_to_plain": f"{sum(a == b for a, b in zip(on, plain))}/{len(prompts)}",
                  "tau_hist_on": h_on, "same_hist": h_on == h_off})
