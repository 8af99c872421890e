"""DeepSeek-V3.2 (models/deepseek_v3.py's DeepseekV32ForCausalLM): a checkpoint with the lightning indexer's tensors
loads as V3 with them ignored, answers as the V3 model of the same weights (within index_topk positions sparse
attention is dense), and its context is capped at index_topk, a longer prompt refused saying why."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny import plain_logits, tiny_moe

from eaglespec.config import EngineConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import RequestError
from eaglespec.loading import load_model
from eaglespec.sampling_params import SamplingParams


def test_v32_runs_as_v3_within_index_topk(tmp_path):
    v3 = tiny_moe("deepseek_v3", seed=3)
    cfg = dict(v3.config.raw, architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", index_topk=24,
               index_n_heads=2, index_head_dim=8)
    sd = {k: v.contiguous() for k, v in v3.state_dict().items()}
    for i in range(cfg["num_hidden_layers"]):  # the indexer's weights, as the release holds them (ignored)
        pre = f"model.layers.{i}.self_attn.indexer."
        sd.update({pre + "wq_b.weight": torch.zeros(16, 24), pre + "wk.weight": torch.zeros(8, 32),
                   pre + "k_norm.weight": torch.ones(8), pre + "k_norm.bias": torch.zeros(8),
                   pre + "weights_proj.weight": torch.zeros(2, 32)})
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    lm = load_model(tmp_path, dtype=torch.float32)
    assert type(lm.model).__name__ == "DeepseekV32ForCausalLM" and lm.config.context_limit == 24
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(plain_logits(lm.model, ids), plain_logits(v3, ids), rtol=1e-5, atol=1e-5)
    engine = Engine(lm.model, None, EngineConfig(max_batch_size=1))
    with pytest.raises(RequestError, match="the prompt has 30 tokens but the model's context is 24 tokens "
                                           "\\(DeepSeek Sparse Attention's index_topk: past it the indexer"):
        engine.generate([list(range(1, 31))], SamplingParams(max_new_tokens=2))
