"""Per-request seeds (`SamplingParams.seed`, layers/row_draws.py): a seeded sampled request's answer depends on its
seed and its own progress only: not on the engine's seed, its batch-mates, its row, overlap or the graph path."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import RequestError
from eaglespec.layers.row_draws import hashed_uniform
from eaglespec.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 30)), [5]]
SAMPLED = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=30, ignore_eos=True)


SHAPES = [None, SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)]


@pytest.mark.parametrize("spec", SHAPES, ids=["plain", "chain", "tree"])
def test_a_seeded_answer_depends_on_its_seed_only(target, drafter, spec):
    def engine(seed: int, rows: int) -> Engine:
        return Engine(target, None, EngineConfig(seed=seed, max_batch_size=rows), drafter=drafter if spec else None,
                      spec=spec)

    mine = replace(SAMPLED, seed=1234)
    alone = engine(0, 1).generate([PROMPTS[0]], mine)[0].token_ids
    # another engine seed, other requests beside it (seeded or not), another row
    params = [replace(SAMPLED, seed=7), SAMPLED, mine, replace(SAMPLED, temperature=0.0)]
    batch = engine(99, 4).generate([PROMPTS[1], PROMPTS[2], PROMPTS[0], PROMPTS[3]], params)
    assert batch[2].token_ids == alone
    assert engine(5, 2).generate([PROMPTS[0], PROMPTS[0]], [replace(SAMPLED, seed=1235), mine])[1].token_ids == alone
    # another seed gives another answer; an unseeded request still follows the engine's seed
    other = engine(0, 1).generate([PROMPTS[0]], replace(SAMPLED, seed=1235))[0].token_ids
    assert other != alone
    a, b = (engine(3, 1).generate([PROMPTS[0]], SAMPLED)[0].token_ids for _ in range(2))
    assert a == b and a != engine(4, 1).generate([PROMPTS[0]], SAMPLED)[0].token_ids


@pytest.mark.parametrize("spec", SHAPES, ids=["plain", "chain", "tree"])
def test_the_static_graph_path_with_overlap_draws_the_same(target, drafter, spec):
    """The graph path (CUDA's, run eagerly on the CPU: seeded steps are graphs of their own) with overlap and
    prefill ahead gives a seeded request the eager engine's answer."""
    from test_static_path import static_engine

    mine = replace(SAMPLED, seed=42)
    want = Engine(target, None, drafter=drafter if spec else None, spec=spec).generate([PROMPTS[2]], mine)[0]
    eng = static_engine(target, drafter if spec else None, spec, rows=3, overlap=True, prefill_ahead=1)
    params = [SAMPLED, replace(SAMPLED, seed=3), mine, SAMPLED]
    outs = eng.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]], params)
    assert outs[2].token_ids == want.token_ids
    keys = [k for k in eng.runner.graphs.graphs if k[0] != "prefill"]
    # seeded steps, and the unseeded ones after the seeded finished
    assert {k[-1].seeded for k in keys} == {True, False}


def test_hashed_draws_are_uniform_and_distinct():
    seeds = torch.tensor([0, 1, 1, 2 ** 62], dtype=torch.int64)
    pos = torch.tensor([5, 5, 6, 5], dtype=torch.int64)
    u = hashed_uniform(seeds, pos, 3, (4, 50_000))
    assert u.dtype == torch.float32 and 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert not any(torch.equal(u[i], u[j]) for i in range(4) for j in range(i))  # seed or position apart: apart
    assert not torch.equal(u, hashed_uniform(seeds, pos, 4, (4, 50_000)))  # another site
    assert torch.equal(u, hashed_uniform(seeds, pos, 3, (4, 50_000)))


def test_seed_is_validated():
    with pytest.raises(RequestError, match=r"seed must be between 0 and 2\*\*63 - 1 \(got -1\)"):
        SamplingParams(temperature=1.0, seed=-1)
    assert SamplingParams(seed=5).greedy  # a greedy request's seed changes nothing
