"""Adjusted steps (penalties, logit_bias, allowed tokens: engine/row_adjust.py) through the CUDA path's Triton kernels,
run by Triton's interpreter on the CPU: the argmax, the drafter's top-k, the tree's construction and the greedy
acceptance, and for sampled rows the probability kernels and the sampled chain's acceptance, each fed float32
adjusted logits with -inf entries. Speculation still gives plain decoding's tokens under the same adjustments (the
GPU has not run these steps yet)."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (on first use)

import pytest  # noqa: E402
from test_spec_greedy import PROMPTS  # noqa: E402 (the tiny `target` and `drafter` fixtures: conftest.py)
from test_tree_kernels import chain_kernel_result, kernel_result  # noqa: E402

import eaglespec.engine.runner as runner  # noqa: E402
import eaglespec.engine.spec_step as spec_step  # noqa: E402
import eaglespec.spec.draft as draft  # noqa: E402
import eaglespec.spec.verify as verify  # noqa: E402
from eaglespec.config import EngineConfig, SpecConfig  # noqa: E402
from eaglespec.engine.engine import Engine  # noqa: E402
from eaglespec.layers import sampled_chain_kernel, sampling, sampling_kernel  # noqa: E402
from eaglespec.layers.argmax_kernel import argmax_rows  # noqa: E402
from eaglespec.layers.topk_kernel import logsoftmax_topk  # noqa: E402
from eaglespec.sampling_params import SamplingParams  # noqa: E402
from eaglespec.spec.tree import build_tree  # noqa: E402

ADJUSTED = SamplingParams(max_new_tokens=10, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.5,
                          logit_bias={5: 2.0, 81: -100.0}, allowed_token_ids=tuple(range(3, 90)))


def route_through_kernels(monkeypatch, calls: list) -> None:
    def argmax(logits, table=None, out=None):
        calls.append("argmax")
        return argmax_rows(logits, table, out)

    def topk(logits, k):
        calls.append("topk")
        return logsoftmax_topk(logits, k)

    def accept(tree, logits):
        calls.append("accept")
        return (chain_kernel_result if tree.topk == 1 else kernel_result)(tree, argmax_rows(logits))

    for mod in (runner, verify, draft, sampling):
        monkeypatch.setattr(mod, "greedy_ids", argmax)
    monkeypatch.setattr(draft, "topk_logp", topk)
    monkeypatch.setattr(spec_step, "draft_tree", functools.partial(draft.draft_tree, kernels=True))
    monkeypatch.setattr(spec_step, "build_tree", functools.partial(build_tree, kernels=True))
    monkeypatch.setattr(spec_step, "verify_greedy", accept)
    monkeypatch.setattr(spec_step, "verify_greedy_chain", accept)
    monkeypatch.setattr(spec_step, "target_probs", sampling_kernel.target_probs)
    monkeypatch.setattr(runner, "sample_probs", lambda logits, t, k, p, generator=None, table=None:
                        sampling.sample_probs(logits, t, k, p, generator, table, kernels=True))


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)], ids=["chain", "tree"])
def test_adjusted_greedy_speculation_through_the_kernels_equals_plain(target, drafter, spec, monkeypatch):
    want = [o.token_ids for o in Engine(target, None).generate(PROMPTS[:2], ADJUSTED)]
    calls: list = []
    route_through_kernels(monkeypatch, calls)
    eng = Engine(target, None, EngineConfig(max_batch_size=2), drafter=drafter, spec=spec)
    assert [o.token_ids for o in eng.generate(PROMPTS[:2], ADJUSTED)] == want
    assert {"argmax", "accept"} <= set(calls) and ("topk" in calls) == (spec.topk > 1)


def test_adjusted_sampled_chain_through_the_kernels_draws_what_pytorch_draws(target, drafter, monkeypatch):
    params = SamplingParams(max_new_tokens=8, temperature=0.8, top_k=20, ignore_eos=True, presence_penalty=0.7,
                            min_p=0.05, logit_bias={5: 3.0})

    def run() -> list[list[int]]:
        eng = Engine(target, None, EngineConfig(max_batch_size=2, seed=5), drafter=drafter, spec=SpecConfig(3, 1, 4))
        return [o.token_ids for o in eng.generate(PROMPTS[:2], params)]

    want = run()
    calls: list = []
    route_through_kernels(monkeypatch, calls)
    monkeypatch.setattr(draft, "sample_probs", lambda logits, t, k, p, generator=None, table=None:
                        sampling.sample_probs(logits, t, k, p, generator, table, kernels=True))

    def accept_sampled(tree, probs, draft_probs, draft_index, u, e):
        calls.append("accept_sampled")
        m, path, tokens, bonus = sampled_chain_kernel.accept_sampled_chain(
            probs, draft_probs, draft_index, tree.tokens, u, e, tree.paths.shape[-1])
        return verify.VerifyResult(accept_len=m, best=m, path=path, tokens=tokens, bonus=bonus)

    monkeypatch.setattr(verify, "verify_sampled_chain_rule", accept_sampled)
    assert run() == want and "accept_sampled" in calls
