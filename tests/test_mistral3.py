"""Mistral Small 3.x (`Mistral3ForConditionalGeneration`, models/mistral3.py) for text: a tiny random transformers
Mistral3 (Pixtral tower + projector + Mistral language model) saved and loaded through our loader (the vision weights
skipped, both checkpoint layouts), transformers' text-only logits, speculation through the wrapper against plain
greedy, and the refusal of images."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny import assert_speculation_equals_plain, plain_logits, tiny_drafter

from eaglespec.config import EngineConfig, SpecConfig
from eaglespec.engine.engine import Engine
from eaglespec.errors import RequestError
from eaglespec.loading import load_model
from eaglespec.protocol import check_target
from eaglespec.sampling_params import SamplingParams

TEXT = dict(model_type="mistral", vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
            sliding_window=None, rope_theta=1e6, tie_word_embeddings=False)
VISION = dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
              image_size=32, patch_size=8, head_dim=16)
IDS = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hc = transformers.Mistral3Config(text_config=TEXT, vision_config=VISION, image_token_index=100,
                                     spatial_merge_size=2, tie_word_embeddings=False)
    ref = transformers.Mistral3ForConditionalGeneration(hc).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # O(1) logits (the default init is too small to tell layouts apart)
        for _, t in ref.named_parameters():
            t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=g) if t.dim() == 1
                    else torch.randn(t.shape, generator=g) / math.sqrt(t.shape[-1]))
    folder = tmp_path_factory.mktemp("mistral3")
    ref.save_pretrained(folder)
    return ref, folder


def test_text_logits_match_transformers(pair):
    ref, folder = pair
    names = set(load_file(str(folder / "model.safetensors")))
    assert any(n.startswith("vision_tower.") for n in names) and "language_model.lm_head.weight" in names
    lm = load_model(folder, dtype=torch.float32)
    assert type(lm.model).__name__ == "Mistral3ForConditionalGeneration" and lm.config.head_dim == 32
    assert not check_target(lm.model).missing
    with torch.no_grad():
        want = ref(input_ids=IDS).logits
    torch.testing.assert_close(plain_logits(lm.model, IDS), want, rtol=1e-4, atol=1e-4)


def test_transformers5_layout_loads_the_same(pair, tmp_path):
    """The same weights under `model.language_model.*` / `model.vision_tower.*` / `lm_head.weight`."""
    ref, folder = pair
    sd = load_file(str(folder / "model.safetensors"))
    renamed = {("lm_head.weight" if k == "language_model.lm_head.weight"
                else "model.language_model." + k.removeprefix("language_model.model.")
                if k.startswith("language_model.model.") else "model." + k): v for k, v in sd.items()}
    save_file(renamed, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    a, b = load_model(folder, dtype=torch.float32), load_model(tmp_path, dtype=torch.float32)
    assert torch.equal(plain_logits(a.model, IDS), plain_logits(b.model, IDS))


def test_speculation_through_the_wrapper_equals_plain(pair):
    _, folder = pair
    target = load_model(folder, dtype=torch.float32).model
    drafter = tiny_drafter(target.language_model, seed=2, hidden=64)
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 2], list(range(20, 45))]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    plain = assert_speculation_equals_plain(target, drafter, prompts, params,
                                            (SpecConfig(3, 1, 4), SpecConfig(4, 3, 8)))
    assert all(len(set(p)) > 4 for p in plain)


def test_images_are_refused(pair):
    _, folder = pair
    engine = Engine(load_model(folder, dtype=torch.float32).model, None, EngineConfig(max_batch_size=1))
    with pytest.raises(RequestError, match="Mistral3ForConditionalGeneration does not take images"):
        engine.prepare([1, 2, 3], images=[object()])
