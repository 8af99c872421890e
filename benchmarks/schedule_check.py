"""Does a speculation schedule (`SpecSchedule`: each step the shape of the rows it runs) switch shapes on the GPU,
keep the tokens, and give a lone request in a several-row engine the one-row shape's speed?

Random SmolLM2-135M weights and a random drafter (bf16, CUDA graphs, overlap), 256 new tokens after 128-token
prompts: a lone request through (a) a one-row engine with the chain S3 K1 D4, (b) an 8-row engine with the tree
S4 K4 D16 alone (the policy before schedules), (c) an 8-row engine with the schedule ((1, chain), (8, tree)); then 8
requests through (c). Tokens of (c) against (a) for the lone request (the same one-row verify graphs), the step kinds
each engine ran, and tok/s after a warm-up over the same lengths (a random drafter accepts almost nothing, so the
cheaper chain step shows as speed). (Session 13's run warmed up over 16 tokens only, so its timed runs captured
graphs and compiled kernels: its tok/s are not comparable and were not used.)

usage: python benchmarks/schedule_check.py OUT_DIR
"""

from __future__ import annotations

import time

from probe_script import Emitter, random_pair  # noqa: E402

import torch  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402

from eaglespec.spec_schedule import SpecSchedule
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

m, d = random_pair()
emit = Emitter("schedule_check.json")
chain, tree = SpecConfig(3, 1, 4), SpecConfig(4, 4, 16)
params = SamplingParams(max_new_tokens=256, ignore_eos=True)
prompts = [list(range(100 + 7 * i, 228 + 7 * i)) for i in range(8)]
outs = {}
for name, rows, spec, n in (("chain_1row", 1, chain, 1), ("tree_8rows", 8, tree, 1),
                            ("schedule_8rows", 8, SpecSchedule(((1, chain), (8, tree))), 1),
                            ("schedule_8rows_8req", 8, SpecSchedule(((1, chain), (8, tree))), 8)):
    e = Engine(m, None, EngineConfig(max_batch_size=rows), drafter=d, spec=spec)
    e.reserve(rows, 1024)
    e.generate(prompts[:n], params)  # warm-up over the same lengths: every graph captured, every kernel compiled
    kinds = []
    step_kind = e._step_kind
    e._step_kind = lambda r, _f=step_kind: kinds.append(_f(r)) or _f(r)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = [o.token_ids for o in e.generate(prompts[:n], params)]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    outs[name] = out
    row = {"run": name, "tok_s": round(sum(map(len, out)) / dt, 1),
           "kinds": {k: kinds.count(k) for k in sorted(set(kinds))}}
    if name == "schedule_8rows":
        row["tokens_equal_chain_1row"] = f"{sum(a == b for a, b in zip(out[0], outs['chain_1row'][0]))}/256"
    emit(row)
    del e
