"""engine/target_load.py: a target loaded for the 4-bit CPU path converts each decoder layer as soon as its weights are
loaded (never holding the model's float32 weights together); where a weight has no 4-bit form, `auto` loads the model
again, dense, and `q4` names it; a dense CPU load larger than the host's available memory is refused, saying so."""

from __future__ import annotations

import gguf
import pytest
import torch
from test_loading_gguf import write_tiny_gguf
from tiny import plain_logits

from eaglespec import device_memory
from eaglespec.engine import target_load
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.errors import ConfigError, DeviceMemoryError
from eaglespec.layers.int4_linear import Int4Linear
from eaglespec.loading import checkpoint as ck
from eaglespec.loading.checkpoint import load_model

Q = gguf.GGMLQuantizationType
CPU = torch.device("cpu")
# every projection in a form the 4-bit path takes without numba (Q4_0 / Q4_1 one product, Q8_0 two)
FOUR_BIT = {"token_embd": Q.Q8_0, "output": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q4_0,
            "attn_output": Q.Q4_1, "ffn_gate": Q.Q4_0, "ffn_up": Q.Q8_0, "ffn_down": Q.Q4_1}
IDS = torch.tensor([[3, 17, 5, 60, 2, 9]])


def whole_then_converted(path) -> torch.nn.Module:
    """The model loaded whole in float32, then converted (prepare_for_inference's path since session 62)."""
    return prepare_for_inference(load_model(path, dtype=torch.float32).model, CPU, None, None, int4=True)


def test_each_layer_is_converted_before_the_next_is_read(tmp_path, monkeypatch):
    path = tmp_path / "four.gguf"
    write_tiny_gguf(path, FOUR_BIT, layers=3)
    read: list[str] = []
    tensors = ck.Checkpoint.tensors

    def logged(self):  # type: ignore[no-untyped-def]
        for name, t in tensors(self):
            read.append(name)
            yield name, t

    monkeypatch.setattr(ck.Checkpoint, "tensors", logged)
    converted: list[str] = []
    convert = target_load.convert_layer

    def spy(name: str, layer: torch.nn.Module, fuse: bool) -> None:
        i = int(name.rsplit(".", 1)[1])
        assert sum(r.startswith(f"{name}.") for r in read) == 9  # its norms and projections, all read
        assert not any(r.startswith(f"model.layers.{i + 1}.") for r in read)  # and nothing of the next layer
        assert type(layer.self_attn.q_proj) is torch.nn.Linear and layer.self_attn.q_proj.weight.dtype == torch.float32
        convert(name, layer, fuse)
        if fuse:  # fused as prepare_for_inference would fuse them, then converted
            assert isinstance(layer.self_attn.qkv_proj, Int4Linear) and isinstance(layer.mlp.gate_up_proj, Int4Linear)
            assert not hasattr(layer.self_attn, "q_proj")
        else:
            assert isinstance(layer.self_attn.q_proj, Int4Linear) and isinstance(layer.mlp.down_proj, Int4Linear)
        converted.append(name)

    monkeypatch.setattr(target_load, "convert_layer", spy)
    streamed = target_load.load_target(path, CPU, "float32", None, None, True).model
    assert converted == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert streamed.int4_weights and isinstance(streamed.lm_head, Int4Linear)
    assert not any(type(m) is torch.nn.Linear for m in streamed.modules())
    assert next(streamed.parameters()).dtype == torch.bfloat16
    with torch.no_grad():  # the same packed weights as a whole load converted after: the same bits
        assert torch.equal(plain_logits(streamed, IDS), plain_logits(whole_then_converted(path), IDS))
    read.clear()
    converted.clear()
    unfused = target_load.load_target(path, CPU, "float32", False, None, True).model  # fuse_projections False
    assert converted == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert isinstance(unfused.model.layers[0].self_attn.q_proj, Int4Linear)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_embedding_and_head_are_taken_as_they_arrive(tmp_path, monkeypatch, tied):
    """The embedding is held in bf16 as it arrives, the head converted from its float32 weights once a decoder layer
    has been (tied: from the embedding's, before they are narrowed; the head's weight is then the embedding's bf16
    Parameter itself): the model is the whole load's converted after, bit for bit."""
    path = tmp_path / "four.gguf"
    write_tiny_gguf(path, FOUR_BIT, layers=2, tied=tied)
    events: list[str] = []
    convert, head = target_load.convert_layer, target_load.int4_linear

    def on_layer(name: str, layer: torch.nn.Module, fuse: bool) -> None:
        convert(name, layer, fuse)
        events.append(name)

    def on_head(name: str, w: torch.Tensor) -> Int4Linear:
        assert w.dtype == torch.float32
        events.append(name)
        return head(name, w)

    held: dict[str, torch.dtype] = {}  # what the load holds of each weight outside the layers, as it arrives
    take = target_load._EmbedAndHead.__call__

    def on_tensor(self, name: str, t: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        out = take(self, name, t)
        held[name] = out.dtype
        return out

    monkeypatch.setattr(target_load, "convert_layer", on_layer)
    monkeypatch.setattr(target_load, "int4_linear", on_head)
    monkeypatch.setattr(target_load._EmbedAndHead, "__call__", on_tensor)
    model = target_load.load_target(path, CPU, "float32", None, None, True).model
    assert events.count("lm_head") == 1 and events.index("lm_head") > events.index("model.layers.0")
    assert held["model.embed_tokens.weight"] == torch.bfloat16 and held["model.norm.weight"] == torch.float32
    assert held.get("lm_head.weight", torch.bfloat16) == torch.bfloat16 and ("lm_head.weight" in held) != tied
    embed, head_weight = model.get_embed_and_head()
    assert embed.dtype == torch.bfloat16 and isinstance(model.lm_head, Int4Linear)
    assert (head_weight is embed) == tied and head_weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(plain_logits(model, IDS), plain_logits(whole_then_converted(path), IDS))


@pytest.mark.parametrize("where", ["layers", "head"])
def test_a_weight_without_a_4bit_form_loads_dense_under_auto_and_is_named_under_q4(tmp_path, where, monkeypatch):
    """F16 projections (the first layer fails) or only an F16 head (every layer converted before the head fails):
    `auto` (int4 None) gives the dense float32 model, the same as a dense load; `q4` (True) names the weight."""
    path = tmp_path / "f16.gguf"
    f16 = {"attn_v": Q.F16} if where == "layers" else {"output": Q.F16}
    write_tiny_gguf(path, {**FOUR_BIT, **f16}, layers=2)
    heads: list[str] = []
    convert_head = target_load.int4_linear

    def spy(name: str, w: torch.Tensor) -> Int4Linear:
        heads.append(name)
        return convert_head(name, w)

    monkeypatch.setattr(target_load, "int4_linear", spy)
    model = target_load.load_target(path, CPU, "float32", None, None, None).model
    assert heads == ([] if where == "layers" else ["lm_head"])  # a model refused at its first layer: no head work
    assert not getattr(model, "int4_weights", False) and not any(isinstance(m, Int4Linear) for m in model.modules())
    assert next(model.parameters()).dtype == torch.float32
    dense = prepare_for_inference(load_model(path, dtype=torch.float32).model, CPU, None, None, int4=False)
    with torch.no_grad():
        assert torch.equal(plain_logits(model, IDS), plain_logits(dense, IDS))
    named = r"model\.layers\.0\.self_attn\.qkv_proj \[128 x 64\]" if where == "layers" else r"lm_head \[64 x 64\]"
    with pytest.raises(ConfigError, match=r"needs a GGUF's quantized groups .*; " + named + " is none of them"):
        target_load.load_target(path, CPU, "float32", None, None, True)


def test_a_layer_the_path_cannot_run_is_named_as_it_loads():
    """A layer converted as it loads is checked as the whole model is (int4_weights._check): MLA named by its full
    name, the layer left unconverted."""
    from test_deepseek_v3 import CASES
    from transformers import DeepseekV3Config

    from eaglespec.config import ModelConfig
    from eaglespec.engine.int4_weights import convert_layer
    from eaglespec.models import get_model_class

    d = DeepseekV3Config(**next(iter(CASES.values()))).to_dict()
    d["architectures"] = ["DeepseekV3ForCausalLM"]
    cfg = ModelConfig.from_hf(d)
    layer = get_model_class(cfg.architecture)(cfg).model.layers[0]
    with pytest.raises(ConfigError, match=r"runs grouped-query attention only; \w+'s model\.layers\.0\.self_attn is "
                                          r"MLAttention"):
        convert_layer("model.layers.0", layer, True)
    assert not any(isinstance(m, Int4Linear) for m in layer.modules())


def test_a_dense_cpu_load_larger_than_the_hosts_memory_is_refused(tmp_path, monkeypatch):
    """The host's available memory below the float32 weights: DeviceMemoryError naming both, before any weight is
    read; the 4-bit path (layers converted as they load) is not refused by that sum, and a host whose memory cannot
    be read is not checked."""
    path = tmp_path / "four.gguf"
    write_tiny_gguf(path, FOUR_BIT, layers=2)
    monkeypatch.setattr(device_memory, "host_available", lambda: 1000)
    with pytest.raises(DeviceMemoryError, match=r"four\.gguf: its weights take 0\.0 GiB in float32 and this machine "
                                                r"has 0\.0 GiB of memory available; use a machine with more memory, a "
                                                r"smaller dtype \(--dtype bfloat16\), or .*--cpu-weights q4"):
        target_load.load_target(path, CPU, "float32", None, None, False)
    assert target_load.load_target(path, CPU, "float32", None, None, True).model.int4_weights
    monkeypatch.setattr(device_memory, "host_available", lambda: None)
    assert not getattr(target_load.load_target(path, CPU, "float32", None, None, False).model, "int4_weights", False)
