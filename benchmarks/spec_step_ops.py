"""Count the operator launches of one speculative step outside the two models' forwards (CPU, no GPU needed).

On a GPU every such operator is a kernel (a CUDA-graph node) of about a microsecond, so their number is the cost of
the step's bookkeeping: drafting loop, tree construction, verification, acceptance and commit. Runs one step of the
static path (the code the CUDA graphs capture; after a first step, as a replay would) on a tiny model and counts, per phase, the ATen operators that launch
work (views, allocations and metadata ops excluded) and are not inside the target's or the drafter's forward.

With --cuda-kernels the greedy choices, a tree's top-K selections, its ancestor tables and its greedy acceptance take
the Triton kernels the CUDA path uses (run by Triton's interpreter), each launch counted as one operator and their
inner work not at all: the count a CUDA graph of the step holds.

usage: python benchmarks/spec_step_ops.py [--cuda-kernels]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny import tiny_drafter, tiny_llama  # noqa: E402

from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.cuda_graphs import GraphCache  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402

NO_KERNEL = {
    "aten::as_strided", "aten::view", "aten::_unsafe_view", "aten::resolve_conj", "aten::resolve_neg", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::result_type", "aten::expand", "aten::expand_as", "aten::t",
    "aten::transpose", "aten::reshape", "aten::_reshape_alias", "aten::unsqueeze", "aten::squeeze", "aten::slice",
    "aten::select", "aten::detach", "aten::alias", "aten::permute", "aten::lift_fresh", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::narrow", "aten::to", "aten::_to_copy",
    "aten::contiguous", "aten::view_as", "aten::broadcast_tensors", "aten::flatten", "aten::unflatten",
    "aten::diagonal", "aten::unfold", "aten::resize_", "aten::scalar_tensor", "aten::real", "aten::item",
    "aten::_local_scalar_dense",
}


def _in_model(ev) -> bool:
    x = ev.cpu_parent
    while x is not None:
        if x.name == "MODEL" or x.name.startswith("TRITON"):
            return True
        x = x.cpu_parent
    return False


def route_through_kernels() -> None:
    """The CUDA path's kernels in place of the PyTorch operators they replace, each call marked TRITON:<launches>."""
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    import eaglespec.engine.runner as runner
    import eaglespec.engine.spec_step as spec_step  # the speculative phases
    import eaglespec.layers.sampling as sampling
    import eaglespec.spec.draft as draft
    import eaglespec.spec.tree as tree
    import eaglespec.spec.verify as verify
    from eaglespec.layers import argmax_kernel, topk_kernel, tree_kernels

    def marked(fn, launches: int, fits, fallback):
        """fn where the CUDA policy would take it (fits(*args)), else the PyTorch path, counted as usual."""
        def call(*a, **k):
            if not fits(*a):
                return fallback(*a, **k)
            with record_function(f"TRITON:{launches}"):
                return fn(*a, **k)

        return call

    for mod in (runner, verify, draft, sampling):
        mod.greedy_ids = marked(argmax_kernel.argmax_rows, 2, lambda x: argmax_kernel.fits(x.shape[-1]),
                                sampling.greedy_ids)
    fits_k = lambda x, k: topk_kernel.fits(x.shape[-1], k)  # noqa: E731
    draft.topk_logp = marked(topk_kernel.logsoftmax_topk, 1, fits_k, draft.topk_logp)
    draft.frontier_ids = marked(lambda x, k: topk_kernel.topk_values(x, k)[0], 1, fits_k, draft.frontier_ids)
    tree.best_candidates = marked(lambda x, k: topk_kernel.topk_values(x, k)[0], 1, fits_k, tree.best_candidates)
    tree.ancestor_tables = marked(tree_kernels.ancestor_tables, 1,
                                  lambda p, d, s: tree_kernels.fits(p.shape[1], s), tree.ancestor_tables)
    accept = marked(lambda t, pred: verify.VerifyResult(*tree_kernels.accept_greedy(
        pred, t.tokens, t.parents, t.depth, t.ancestors, t.paths)), 1,
        lambda t, pred: tree_kernels.fits(t.size, t.paths.shape[-1] - 1), verify.verify_greedy_rule)
    spec_step.verify_greedy = lambda t, logits: accept(t, verify.greedy_ids(logits))


def count(spec: SpecConfig) -> dict[str, int]:
    torch.manual_seed(0)
    target = tiny_llama(seed=0)
    drafter = tiny_drafter(target, seed=1)
    for m in (target, drafter):
        fwd = m.forward

        def wrapped(*a, _f=fwd, **k):
            with record_function("MODEL"):
                return _f(*a, **k)

        m.forward = wrapped
    eng = Engine(target, None, EngineConfig(max_batch_size=1), drafter=drafter, spec=spec)
    eng.runner.graphs = g = GraphCache(eng.runner, capture=False)
    eng.reserve(1, 300)
    eng.add_request([1, 2, 3, 4], SamplingParams(max_new_tokens=200, ignore_eos=True))
    eng.step()  # prefill
    eng.step()  # one speculative step: per-shape constants are built (as at graph capture), not counted below
    key = g.key("spec", 1, eng.runner.host_len[0], True)
    out = {}
    with torch.inference_mode():
        for name, fn in g._phases(*key):
            with profile(activities=[ProfilerActivity.CPU]) as p:
                fn()
            ops = [ev for ev in p.events() if ev.name.startswith("aten::") and ev.name not in NO_KERNEL
                   and not _in_model(ev)]
            # leaf operators only: a composite op's work is counted through its children
            out[name] = sum(1 for ev in ops if not any(
                c.name.startswith("aten::") and c.name not in NO_KERNEL for c in ev.cpu_children))
            out[name] += sum(int(ev.name.split(":")[1]) for ev in p.events() if ev.name.startswith("TRITON:")
                             and not _in_model(ev))
    return out


if __name__ == "__main__":
    if "--cuda-kernels" in sys.argv:
        route_through_kernels()
    print("| spec | draft | verify | commit | total |\n| --- | ---: | ---: | ---: | ---: |")
    for spec in (SpecConfig(3, 1, 4), SpecConfig(7, 1, 8), SpecConfig(5, 4, 16), SpecConfig(6, 8, 48)):
        c = count(spec)
        print(f"| S{spec.steps} K{spec.topk} D{spec.draft_tokens} | {c['draft']} | {c['verify']} | {c['commit']} "
              f"| {sum(c.values())} |")
