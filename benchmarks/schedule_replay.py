"""How does an admission or row policy shape a continuous run's steps? A CPU replay of the schedule, no GPU needed.

The engine's own bookkeeping (`GraphCache(capture=False)`: the bucketed, all-rows steps CUDA graphs capture, run
eagerly, overlapped as on CUDA) drives a tiny random target and drafter through N requests of fixed lengths (EOS
ignored), with the chain's verification forced, so that the schedule depends on the policy alone and not on a random
drafter's near-zero acceptance:
- `--accept all`: every draft accepted (tau = D);
- `--accept mix` (default): a draft is accepted unless its token id is a multiple of 3 (a content-dependent tau of
  about 2.4 for S3 K1 D4, close to the shipped drafter's on MT-bench).
Lengths: 60% of the requests at the budget, the rest uniform in [30, budget) (seeded): MT-bench's first turns at 256
new tokens end by EOS about that often. Each setting prints the step counts by kind, and the steps by the batch
bucket of their highest row (what a graph step replays) and by the bucket of their running count (what it could
replay with the running requests in the lowest rows).

usage: python benchmarks/schedule_replay.py [--rows 8,32] [--requests 80] [--budget 256] [--accept mix|all]
       [--setting NAME:KEY=VALUE,...]   (EngineConfig fields; default: prefill_ahead 0 and 4, compact_rows off and on)
e.g.   python benchmarks/schedule_replay.py --rows 32 --setting base:prefill_ahead=0 --setting ahead:prefill_ahead=4
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny import tiny_drafter, tiny_llama  # noqa: E402

import eaglespec.engine.spec_step as runner_module  # noqa: E402  (the speculative phases)
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.cuda_graphs import BATCH_BUCKETS, GraphCache  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402
from eaglespec.spec.verify import verify_greedy_chain_rule  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rows", default="8,32")
ap.add_argument("--requests", type=int, default=80)
ap.add_argument("--budget", type=int, default=256)
ap.add_argument("--accept", choices=("mix", "all"), default="mix")
ap.add_argument("--setting", action="append", default=[])
args = ap.parse_args()


def forced(tree, logits):
    """The chain's acceptance by rule (module docstring) instead of by the random target's argmax."""
    pred = torch.zeros_like(tree.tokens)
    pred[:, :-1] = tree.tokens[:, 1:]
    if args.accept == "mix":
        miss = tree.tokens[:, 1:] % 3 == 0
        pred[:, :-1] = torch.where(miss, (tree.tokens[:, 1:] + 1) % 97, pred[:, :-1])
    return verify_greedy_chain_rule(tree, pred)


runner_module.verify_greedy_chain = forced


def parse_setting(text: str) -> tuple[str, dict]:
    name, _, fields = text.partition(":")
    kw = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        kw[key] = {"true": True, "false": False}.get(value.lower(), value)
        if isinstance(kw[key], str):
            kw[key] = int(value)
    return name, kw


settings = [parse_setting(s) for s in args.setting] or [
    ("plain admission", {"prefill_ahead": 0, "compact_rows": False}),
    ("prefill ahead 4", {"prefill_ahead": 4, "compact_rows": False}),
    ("ahead 4 + compact", {"prefill_ahead": 4, "compact_rows": True})]


def bucket(n: int) -> int:
    return next(b for b in BATCH_BUCKETS if b >= n)


torch.manual_seed(0)
target = tiny_llama(seed=0)
drafter = tiny_drafter(target, seed=1)
rng = random.Random(1)
lens = [args.budget if rng.random() < 0.6 else rng.randint(30, args.budget - 1) for _ in range(args.requests)]
prompts = [[rng.randint(1, 90) for _ in range(rng.randint(5, 20))] for _ in range(args.requests)]
params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lens]
for rows in (int(x) for x in args.rows.split(",")):
    for name, kw in settings:
        eng = Engine(target, None, EngineConfig(max_batch_size=rows, overlap=True, max_seq_len=args.budget + 40, **kw),
                     drafter=drafter, spec=SpecConfig(3, 1, 4))
        eng.runner.graphs = GraphCache(eng.runner, capture=False)
        steps: list[tuple[int, int]] = []  # (running rows, highest row + 1) per launched step
        launch = eng.runner.launch

        def logged(kind, rs, greedy, ahead=0, lp=None, launch=launch, steps=steps):
            steps.append((len(rs), max(rs) + 1))
            return launch(kind, rs, greedy, ahead, lp=lp)

        eng.runner.launch = logged
        outs = eng.generate(prompts, params)
        assert [len(o.token_ids) for o in outs] == lens
        by_high = sorted(Counter(min(bucket(m), rows) for _, m in steps).items())
        by_count = sorted(Counter(min(bucket(n), rows) for n, _ in steps).items())
        print(f"{rows} rows, {name}: {dict(eng.step_counts)}; steps by the bucket of the highest row {by_high}, "
              f"by the bucket of the running count {by_count}", flush=True)
