"""The engine on the real SmolLM2-135M-Instruct (float32, CPU): batching and speculation change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglespec.config import EngineConfig, ModelConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.models.eagle3 import LlamaForCausalLMEagle3
from eaglespec.sampling_params import SamplingParams

MT_BENCH = Path(__file__).resolve().parents[1] / "src" / "eaglespec" / "assets" / "mt_bench_question.jsonl"


def mt_bench_prompts(n: int) -> list[str]:
    rows = [json.loads(l) for l in MT_BENCH.read_text().splitlines() if l.strip()]
    return [r["turns"][0] for r in rows[:n]]


@pytest.fixture(scope="module")
def prompts():
    return mt_bench_prompts(3)


@pytest.fixture(scope="module")
def reference(smollm2, prompts):
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=1))
    return [eng.generate([p], SamplingParams(max_new_tokens=24))[0].token_ids for p in prompts]


def random_drafter(target_cfg: ModelConfig, seed: int = 0, draft_vocab: int = 4096) -> LlamaForCausalLMEagle3:
    cfg = ModelConfig.from_hf(dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", vocab_size=target_cfg.vocab_size,
        hidden_size=target_cfg.hidden_size, intermediate_size=1536, num_hidden_layers=1, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
        draft_vocab_size=draft_vocab, target_hidden_size=target_cfg.hidden_size,
    ))
    torch.manual_seed(seed)
    d = LlamaForCausalLMEagle3(cfg).eval()
    keep = torch.randperm(target_cfg.vocab_size)[:draft_vocab].sort().values
    d.d2t.copy_(keep - torch.arange(draft_vocab))
    return d


def test_batched_equals_one_by_one(smollm2, prompts, reference):
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=3))
    outs = eng.generate(prompts, SamplingParams(max_new_tokens=24))
    assert [o.token_ids for o in outs] == reference
    assert all(len(r) > 0 for r in reference)


@pytest.mark.parametrize("spec", [SpecConfig(3, 1, 4), SpecConfig(4, 4, 12)], ids=["chain", "tree"])
def test_speculative_equals_plain_with_random_drafter(smollm2, prompts, reference, spec):
    drafter = random_drafter(smollm2.config)
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=3), drafter=drafter, spec=spec)
    outs = eng.generate(prompts, SamplingParams(max_new_tokens=24))
    assert [o.token_ids for o in outs] == reference
    assert eng.stats.verify_steps > 0
    smollm2.model.set_eagle3_layers_to_capture(None)  # the fixture is shared


def test_default_aux_layers(smollm2):
    assert smollm2.config.default_aux_layer_ids() == (1, 14, 26)


@pytest.fixture(scope="module")
def shipped_drafter(smollm2):
    from eaglespec.api import load_drafter
    from eaglespec.assets import default_drafter_path

    path = default_drafter_path()
    assert path is not None, "the package must carry the embedded model's drafter (src/eaglespec/assets)"
    d = load_drafter(path, "cpu", torch.float32)
    embed, head = smollm2.model.get_embed_and_head()
    d.set_embed_and_head(embed, head)
    return d


@pytest.mark.parametrize("spec", [SpecConfig(1, 1, 2), SpecConfig(3, 1, 4), SpecConfig(3, 2, 6), SpecConfig(5, 4, 16)],
                         ids=["S1", "chain3", "tree6", "tree16"])
def test_shipped_drafter_is_lossless_and_accepts(smollm2, prompts, reference, shipped_drafter, spec):
    """The shipped drafter on the real SmolLM2, a batch of three MT-bench prompts: the plain greedy tokens, and a
    trained drafter's acceptance (a random drafter's is ~1.0; measured tau with S3 on MT-bench is ~1.6)."""
    eng = Engine(smollm2.model, smollm2.tokenizer, EngineConfig(max_batch_size=3), drafter=shipped_drafter, spec=spec)
    reqs = [eng.add_request(eng.encode_prompt(p), SamplingParams(max_new_tokens=24))
            for p in prompts]
    while eng.has_work():
        eng.step()
    assert [r.output_ids for r in reqs] == reference
    steps = sum(r.stats.verify_steps for r in reqs)
    committed = sum(len(r.output_ids) - 1 for r in reqs)  # the first token comes from the prefill
    assert committed / steps > 1.15  # tokens per verification (tau)
