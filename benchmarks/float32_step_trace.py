"""Where a float32 one-row tree step's time goes on the GPU, kernel by kernel (after `float32_tree_probe.sh` found
the tensor-core projection kernel and the prompt attention kernel slow in float32; session 37).

Random SmolLM2-135M weights and a random drafter in float32, an engine of one row after a 128-token prompt and 30
steps of the tree S6 K8 D48 (and a plain engine's decode graph for scale): each graph of the step (draft, verify, the
rest) replayed alone under torch.profiler, its time charged kernel by kernel as in step_trace.py ("advance": from
the previous kernel's end to this one's end, so the shares add up to the graph's span). Run it under
`with_setting.py` to compare settings (e.g. eaglespec.layers.norm_linear_kernel.FLOAT32_DOT=True).

usage: python benchmarks/float32_step_trace.py OUT_DIR --float32 [--spec=6,8,48] [--cpu: a check of the script]
"""

from __future__ import annotations

import json

from probe_script import (DEV, DT, OUT, current_graphs, kernel_advance, option,  # noqa: E402
                          print_advance, random_pair, replay_ms, stepped_engine)

import torch  # noqa: E402

from eaglespec.config import SpecConfig  # noqa: E402

S, K, D = (int(x) for x in option("spec", "6,8,48").split(","))
GPU = torch.cuda.is_available() and DEV.type == "cuda"
m, d = random_pair("smollm2-135m")
results: dict = {"dtype": str(DT), "spec": f"S{S}K{K}D{D}"}
e = stepped_engine(m)
names = ["decode"]
if GPU:  # the CPU (--cpu) runs the engines only: it has no graphs
    (_, g), = current_graphs(e, "decode", 1)
    results["decode"], results["decode_ms"] = kernel_advance(g), round(replay_ms([g]), 4)
del e
e = stepped_engine(m, d, SpecConfig(S, K, D))
if GPU:
    graphs = current_graphs(e, "spec", 1)
    results["step_ms"] = round(replay_ms([g for _, g in graphs]), 4)
    for name, g in graphs:
        results[name], results[f"{name}_ms"] = kernel_advance(g), round(replay_ms([g]), 4)
        names.append(name)
(OUT / f"float32_step_trace_S{S}K{K}D{D}.json").write_text(json.dumps(results, indent=1))
print(f"{DT} S{S} K{K} D{D}: whole step {results.get('step_ms')} ms; "
      + ", ".join(f"{n} {results.get(f'{n}_ms')} ms" for n in names))
for n in names:
    if n in results:
        print_advance(n, results[n], 10)
