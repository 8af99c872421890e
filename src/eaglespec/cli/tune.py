"""`eaglespec tune`: sweep steps / topk / draft tokens per batch size, pick the fastest, say when speculation loses.

    eaglespec tune --draft path/to/eagle3 --batch-sizes 1,8 --limit 10 --out tune/   # default limit: max(10, 8)
    eaglespec tune --draft random --steps 2,3,4 --topk 1,4 --draft-tokens 4,8,16

Runs the no-spec baseline and every shape of the grid (bench/tune.py: 28 shapes by default) through the same suite as
`eaglespec bench`, prints the whole table sorted by tok/s per batch size, then one line per batch size: the fastest
shape and its speedup, or "net-negative at batch size B: the fastest speculative configuration (S=.. K=.. D=..) runs
X tok/s, slower than no speculation at Y tok/s; run without speculation". A sweep of sampled steps (--temperature
> 0) or of steps under count penalties gives its schedule as that kind of step's entries of a `--spec`
("GREEDY;sampled=..."): greedy steps keep their own. --out writes the bench files, with the verdict under "tune"
in results.json.
"""

from __future__ import annotations

import argparse

from ..loading.default import is_default_model
from .bench import add_run_options, finish, prepare, record_writer


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="find the fastest speculative shape per batch size (or that none pays)")
    add_run_options(p, max_new_tokens=128, limit=None, min_limit=10)
    g = p.add_argument_group("grid")
    g.add_argument("--draft", default="auto", metavar="DIR|oracle|random",
                   help="the drafter to tune (default: the shipped drafter of the embedded model)")
    g.add_argument("--steps", default=None, metavar="S,..", help="draft depths to try (default: 1..8)")
    g.add_argument("--topk", default=None, metavar="K,..", help="branchings to try (default: 1,2,4,8)")
    g.add_argument("--draft-tokens", default=None, metavar="D,..",
                   help="verified tree sizes to try (default: S+1 for chains, 8,16,32 for trees)")


def run(args: argparse.Namespace) -> int:
    from ..bench.drafters import drafter_label
    from ..bench.runs import RunConfig, check_batching
    from ..bench.setup import parse_ints, spec_runs
    from ..bench.suite import run_suite
    from ..bench.tune import grid

    lists = [parse_ints(v, f"--{n}") if v is not None else None
             for n, v in (("steps", args.steps), ("topk", args.topk), ("draft-tokens", args.draft_tokens))]
    shapes = grid(*lists)
    # the embedded model, named or not (its GGUF anywhere: loading.default.is_default_model)
    default_model = args.random_weights is None and (args.model is None or is_default_model(args.model))
    drafter = spec_runs([args.draft], shapes[:1], False, default_model)[0].drafter  # resolves "auto"
    assert drafter is not None
    configs = [RunConfig.of(drafter_label(drafter), drafter, s) for s in shapes]
    check_batching(args.batching, configs)
    prep = prepare(args)
    result = run_suite(prep.model, prep.workload, configs, prep.options, on_record=record_writer("tune", args, prep))
    print(finish("tune", args, prep, result), end="")
    return 0
