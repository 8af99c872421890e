"""Chunked prefill (EngineConfig.prefill_chunk): a prompt longer than the chunk prefills in windows, each attending
to the ones before it through the cache, and every answer, first-token log-probability and drafter state is a whole
prefill's (float32, CPU)."""

from __future__ import annotations

import pytest
import torch

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import ConfigError
from eaglespec.sampling_params import SamplingParams

PROMPTS = [[(7 * i) % 90 + 3 for i in range(61)], [5, 9, 2], list(range(10, 42)), list(range(50, 66))]


def engine(target, drafter, spec, chunk, rows: int = 4) -> Engine:
    return Engine(target, None, EngineConfig(max_batch_size=rows, prefill_chunk=chunk),
                  drafter=drafter if spec is not None else None, spec=spec)


@pytest.mark.parametrize("spec", [None, SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)],
                         ids=["plain", "chain", "tree"])
def test_windows_of_a_long_prompt_answer_as_a_whole_prefill(target, drafter, spec):
    """Prompts of 61, 3, 32 and 16 tokens in one batch with windows of 16: the 61-token one runs three windows
    alone, the 32-token one one, the last windows all together; answers and first-token log-probabilities are the
    whole prefill's."""
    params = SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=2)
    chunked = engine(target, drafter, spec, 16)
    windows = []
    window = chunked.runner._prefill_window
    chunked.runner._prefill_window = lambda row, p, s, size: windows.append((row, s, size)) or window(row, p, s, size)
    got = chunked.generate(PROMPTS, params, chat=False)
    want = engine(target, drafter, spec, None).generate(PROMPTS, params, chat=False)
    assert windows == [(0, 0, 16), (0, 16, 16), (0, 32, 16), (2, 0, 16)]
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(len(set(o.token_ids)) > 3 for o in got)
    for a, b in zip(got, want):
        assert [e.logprob for e in a.logprobs] == pytest.approx([e.logprob for e in b.logprobs], abs=1e-4)


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(5, 4, 8)], ids=["chain", "tree"])
def test_the_drafters_state_after_windows_is_a_whole_prefills(target, drafter, spec):
    """Speculation is lossless whatever the drafter guesses, so its state after the prefill is checked itself: the
    windows' pairs, each ending on the next window's first token, give the same top tokens and hidden state."""
    ended = SamplingParams(max_new_tokens=1)
    a, b = engine(target, drafter, spec, 16, rows=1), engine(target, drafter, spec, None, rows=1)
    for prompt in (PROMPTS[0], PROMPTS[2][:17]):  # three windows and a 13-token rest; one window and 1 token
        assert a.generate([prompt], ended, chat=False)[0].token_ids == b.generate([prompt], ended,
                                                                                  chat=False)[0].token_ids
        assert torch.equal(a.runner.draft.top_ids[0], b.runner.draft.top_ids[0])
        torch.testing.assert_close(a.runner.draft.hidden[0], b.runner.draft.hidden[0], atol=1e-4, rtol=1e-4)


def test_windows_start_after_a_reused_prefix(target, drafter):
    """A conversation's next turn whose new part is longer than the chunk: the windows start after the reused
    prefix, and the answer is a whole prefill's."""
    spec = SpecConfig(3, 1, 4)
    eng, whole = engine(target, drafter, spec, 16, rows=1), engine(target, drafter, spec, None, rows=1)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    first = eng.generate([PROMPTS[3]], params, chat=False)[0]
    follow = PROMPTS[3] + first.token_ids + PROMPTS[0][:40]
    windows = []
    window = eng.runner._prefill_window
    eng.runner._prefill_window = lambda row, p, s, size: windows.append(s) or window(row, p, s, size)
    eng.reserve(1, len(follow) + 8)
    out = eng.generate([follow], params, chat=False)[0]
    # reused: the first turn's 24 tokens but the answer's last (never fed) and the one before it (its drafter pair
    # needs the next token); 42 left: two windows, then the last 10 with the sampling
    assert out.cached_tokens == 22 and windows == [22, 38]
    assert out.token_ids == whole.generate([follow], params, chat=False)[0].token_ids


def test_the_chunk_is_validated():
    with pytest.raises(ConfigError, match="prefill_chunk must be >= 16 tokens"):
        EngineConfig(prefill_chunk=8)
