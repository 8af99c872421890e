"""GGUF -> HF folder conversion: the folder reloads to the same logits and tokenizer, and transformers reads it."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec.layers.context import ForwardContext
from eaglespec.loading import Tokenizer, convert_gguf, load_model

TEXTS = ["Hello world", "emoji 😀 and 日本語", "<|im_start|>user\nhi<|im_end|>\n", "def f(x):\n    return 2 * x\n"]


@pytest.fixture(scope="module")
def converted(smollm2_gguf, tmp_path_factory):
    return convert_gguf(smollm2_gguf, tmp_path_factory.mktemp("smollm2-hf"), dtype=torch.float32)


def test_folder_layout(converted):
    names = {p.name for p in converted.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json"} <= names
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "float32"
    assert cfg["tie_word_embeddings"] is True
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] == 2


def test_round_trip_gives_identical_logits_and_tokenizer(converted, smollm2):
    again = load_model(converted, dtype=torch.float32)
    assert again.config == smollm2.config  # raw dicts differ (torch_dtype) but are not compared
    ids = torch.tensor([smollm2.tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        a = smollm2.model(ids, ForwardContext.plain(1, ids.shape[1])).logits
        b = again.model(ids, ForwardContext.plain(1, ids.shape[1])).logits
    assert torch.equal(a, b)
    assert isinstance(again.tokenizer, Tokenizer)
    for text in TEXTS:
        assert again.tokenizer.encode(text) == smollm2.tokenizer.encode(text)
    assert again.tokenizer.eos_token_ids == smollm2.tokenizer.eos_token_ids
    msgs = [{"role": "user", "content": "Hi"}]
    assert again.tokenizer.apply_chat_template(msgs) == smollm2.tokenizer.apply_chat_template(msgs)


def test_transformers_reads_the_converted_folder(converted, smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(converted)
    for text in TEXTS:
        assert hf_tok.encode(text, add_special_tokens=False) == smollm2.tokenizer.encode(text)
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    ids = torch.tensor([smollm2.tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        ref = model(ids).logits
        ours = smollm2.model(ids, ForwardContext.plain(1, ids.shape[1])).logits
    assert (ours - ref).abs().max().item() <= 1e-4
