"""Load a model (and its tokenizer) from a Hugging Face folder or a GGUF file.

Contract of `load_model(path, device, dtype)`:
1. read the config (`config.json`, or the GGUF metadata) -> `ModelConfig.from_hf`;
2. pick the class registered for `config.architecture` (`eaglespec.models.get_model_class`);
3. build it on the meta device, under the target dtype as the default dtype (so a layer that asks for float32
   explicitly keeps it), then stream the checkpoint tensors through the class's tables:
   `checkpoint_renames` (regex, replacement) applied in order, `checkpoint_ignore` (regexes) dropped, the
   checkpoint's dequantizer (`dequant.StreamDequantizer`, when config.json or hf_quant_config.json declares INT4,
   NVFP4 or FP8 weights), then the class's optional `transform_checkpoint(name, tensor) -> iterable of (name, tensor)`
   hook (split, fuse, ...); each tensor is cast to its parameter's dtype and moved to the device, then assigned
   (`load_state_dict(assign=True)`);
4. re-tie shared parameters (tied embeddings: a checkpoint without `lm_head.weight` is fine), materialize the
   non-persistent buffers and let `reset_buffers()` recompute them (RoPE frequencies), freeze, `eval()`.
Before any weight is read, a CUDA device whose free memory (`device_memory.room`), or a CPU load whose host's available
memory (`device_memory.host_available`), is smaller than the weights' bytes in that dtype raises `DeviceMemoryError`
saying both (`check_device_room`: a raw out-of-memory error would come minutes into the load, and on Linux the
kernel may kill the process instead); not where `on_layer` converts each layer as it loads (the 4-bit CPU path).
Missing, unexpected or mis-shaped weights raise `CheckpointError` naming a few of them and the checkpoint. A class may
list `checkpoint_optional` (regexes): such weights may be absent and then stay on the meta device for the caller to
set (a drafter's lm_head shared with its target, say).

`path=None` loads the embedded default (SmolLM2-135M-Instruct GGUF). `dtype=None` is float32 on the CPU and the
config's `torch_dtype` (when it is a float type) elsewhere, float16 for a bfloat16 config on a GPU without bfloat16.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from .. import device_memory
from ..config import ModelConfig
from ..device_memory import gib
from ..errors import CheckpointError, ConfigError, DeviceMemoryError
from .default import default_model_path
from .gguf_reader import GGUFFile, is_gguf
from .safetensors_io import iter_safetensors
from .tokenizer import BaseTokenizer, has_tokenizer, load_tokenizer

_FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                 "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: nn.Module
    config: ModelConfig
    tokenizer: BaseTokenizer | None
    path: Path


class Checkpoint:
    """One checkpoint on disk (HF folder or GGUF file): its config dict, tensors and tokenizer."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"{self.path} does not exist")
        self.gguf = GGUFFile(self.path) if is_gguf(self.path) else None
        if self.gguf is None and not self.path.is_dir():
            raise CheckpointError(
                f"{self.path} is neither a model folder (config.json + *.safetensors) nor a .gguf file"
            )

    def config_dict(self) -> dict[str, Any]:
        return dict(self._config_dict)

    @cached_property
    def _config_dict(self) -> dict[str, Any]:
        if self.gguf is not None:
            return self.gguf.hf_config()
        cfg = self.path / "config.json"
        if not cfg.is_file():
            raise CheckpointError(f"{cfg} does not exist")
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{cfg} is not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{cfg} is not a JSON object")
        return data

    def model_config(self) -> ModelConfig:
        where = self.path if self.gguf is not None else self.path / "config.json"
        data = self.config_dict()  # its own errors already name the file
        try:
            return ModelConfig.from_hf(data)
        except ConfigError as e:
            raise ConfigError(f"{e} ({where})") from None

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.gguf is not None:
            return self.gguf.hf_tensors()
        if not any(self.path.glob("*.safetensors")) and (self.path / "pytorch_model.bin").is_file():
            return self._torch_bin(self.path / "pytorch_model.bin")
        return iter_safetensors(self.path)

    @staticmethod
    def _torch_bin(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
        # Some published drafters ship only a pickled state dict; weights_only refuses arbitrary code.
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:
            raise CheckpointError(f"{path} cannot be read as a PyTorch state dict ({e})") from None
        yield from sd.items()

    def dequantizer(self, dtype: torch.dtype) -> Callable[[str, torch.Tensor], Any] | None:
        """The per-tensor dequantizer of a quantized HF checkpoint, None for a plain one."""
        if self.gguf is not None:
            return None
        from .dequant import StreamDequantizer, quant_spec_from_config

        spec = quant_spec_from_config(self._config_dict, self.path)
        return None if spec is None else StreamDequantizer(spec, dtype)

    def tokenizer(self) -> BaseTokenizer | None:
        if self.gguf is not None:
            from .gguf_tokenizer import tokenizer_from_gguf

            has_vocab = "tokenizer.ggml.model" in self.gguf.metadata
            return tokenizer_from_gguf(self.gguf) if has_vocab else None
        return load_tokenizer(self.path) if has_tokenizer(self.path) else None


def resolve_device(device: torch.device | str) -> torch.device:
    """"auto" -> cuda when a GPU is visible, else cpu; a CUDA device without a GPU, or past the GPUs there are, is a
    ConfigError."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} was asked for but no CUDA GPU is available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ConfigError(f"device {device!r} was asked for but this machine has {n} CUDA GPU{'s' * (n != 1)} "
                          f"(cuda:0{f' to cuda:{n - 1}' if n > 1 else ''})")
    return dev


def has_bfloat16(device: torch.device) -> bool:
    """Whether a device computes in bfloat16 natively: CUDA GPUs of compute capability 8 (Ampere) and later; not a
    CUDA device: yes (the CPU's bf16 is PyTorch's own)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 8


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device, config: ModelConfig) -> torch.dtype:
    """The model dtype: the one asked for, else float32 on the CPU and the config's float torch_dtype elsewhere. A
    GPU without bfloat16 (compute capability < 8: T4, V100) takes float16 for a bfloat16 config (as vLLM does; the
    Triton kernels' bf16 products need Ampere), and refuses an explicit bfloat16 with a ConfigError."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ConfigError(f"the model dtype must be a float type (got {dtype})")
        chosen = dtype
    elif dtype not in (None, "auto"):
        if dtype not in _FLOAT_DTYPES:
            raise ConfigError(f"dtype must be one of auto, float32, bfloat16, float16 (got {dtype!r})")
        chosen = _FLOAT_DTYPES[dtype]
    elif device.type == "cpu":
        return torch.float32
    else:
        return auto_dtype(_FLOAT_DTYPES.get(str(config.torch_dtype).removeprefix("torch."), torch.float32), device)
    return computable(chosen, device)


def auto_dtype(preferred: torch.dtype, device: torch.device) -> torch.dtype:
    """`preferred`, or float16 where it is bfloat16 and the device has none (what "auto" picks)."""
    return torch.float16 if preferred == torch.bfloat16 and not has_bfloat16(device) else preferred


def computable(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """`dtype`, or a ConfigError when the device cannot compute in it (bfloat16 before Ampere)."""
    if dtype == torch.bfloat16 and not has_bfloat16(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise ConfigError(f"{device} ({torch.cuda.get_device_name(device)}, compute capability {major}.{minor}) has "
                          "no bfloat16 arithmetic: use --dtype float16 or float32")
    return dtype


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_on_meta(cls: type, config: ModelConfig, dtype: torch.dtype) -> nn.Module:
    """The model on the meta device, its floating parameters in `dtype` (layers that ask for float32 keep it)."""
    with _default_dtype(dtype), torch.device("meta"):
        return cls(config)


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor) -> None:
    prefix, _, leaf = name.rpartition(".")
    module = model.get_submodule(prefix)
    if leaf in module._parameters:
        module._parameters[leaf] = value  # type: ignore[assignment]
    else:
        module._buffers[leaf] = value


def _few(names: list[str], n: int = 5) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _chain(
    stages: list[Callable[[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]], name: str, tensor: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """Run (name, tensor) through each stage; a stage may drop, hold back, split or rename."""
    if not stages:
        yield name, tensor
        return
    for n, t in stages[0](name, tensor):
        yield from _chain(stages[1:], n, t)


@dataclass(frozen=True)
class _Layer:
    prefix: str  # its state-dict names' prefix, "model.layers.3."
    module: nn.Module


def _layer_weights(model: nn.Module, expected: dict[str, torch.Tensor]) -> dict[_Layer, set[str]]:
    """Each decoder layer (a child of a ModuleList named `layers`) -> the state-dict names it needs (weights shared
    with anything outside it excluded: they are assigned with the rest)."""
    owners: dict[int, set[str]] = {}
    for name, t in expected.items():
        owners.setdefault(id(t), set()).add(name)
    found: dict[_Layer, set[str]] = {}
    for lname, lst in model.named_modules():
        if not (isinstance(lst, nn.ModuleList) and lname.rsplit(".", 1)[-1] == "layers"):
            continue
        for i, module in enumerate(lst):
            prefix = f"{lname}.{i}."
            names = {n for n in expected if n.startswith(prefix)}
            if names and all(o.startswith(prefix) for n in names for o in owners[id(expected[n])]):
                found[_Layer(prefix, module)] = names
    return found


def load_weights(
    model: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
    where: str | Path,
    dequantizer: Callable[[str, torch.Tensor], Any] | None = None,
    on_layer: Callable[[str, nn.Module], None] | None = None,
    on_tensor: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Assign checkpoint tensors to a model built on the meta device (see the module docstring, steps 3-4).
    `on_layer`: called with each decoder layer's name and module (each child of a ModuleList named `layers`) as soon
    as its weights are assigned, in the order they complete (the engine's 4-bit CPU path converts a layer there, so
    that one layer's float32 weights are held at a time, not the model's: engine/target_load.py). `on_tensor`: called
    with each weight outside those layers as it arrives (its model name, the tensor in the model's dtype), returning
    the tensor to hold in its place (that path narrows the embedding and converts the head there)."""
    renames = [(re.compile(p), r) for p, r in getattr(model, "checkpoint_renames", ())]
    ignore = [re.compile(p) for p in getattr(model, "checkpoint_ignore", ())]
    optional = [re.compile(p) for p in getattr(model, "checkpoint_optional", ())]
    stages = [f for f in (dequantizer, getattr(model, "transform_checkpoint", None)) if f is not None]
    expected = model.state_dict(keep_vars=True)  # name -> meta tensor; tied parameters appear under each name
    aliases: dict[int, list[str]] = {}
    for name, t in expected.items():
        aliases.setdefault(id(t), []).append(name)

    state: dict[str, torch.Tensor] = {}  # loaded, not yet assigned
    assigned: set[str] = set()
    waiting = _layer_weights(model, expected) if on_layer is not None else {}  # layer -> its names not yet loaded
    in_layers = set().union(*waiting.values())  # every layer's names (`on_tensor` takes the rest)
    unexpected: list[str] = []
    mis_shaped: list[str] = []
    for raw_name, tensor in tensors:
        name = raw_name
        for pattern, repl in renames:
            name = pattern.sub(repl, name)
        if any(p.search(name) or p.search(raw_name) for p in ignore):
            continue
        for n, t in _chain(stages, name, tensor):
            target = expected.get(n)
            if target is None:
                unexpected.append(n)
            elif tuple(t.shape) != tuple(target.shape):
                mis_shaped.append(f"{n} {tuple(t.shape)} (model: {tuple(target.shape)})")
            else:
                state[n] = t.to(device=device, dtype=target.dtype)
                if on_tensor is not None and n not in in_layers:
                    state[n] = on_tensor(n, state[n])
                for layer in [m for m, names in waiting.items() if n in names]:
                    waiting[layer].discard(n)
                    if not waiting[layer]:  # the layer is complete: assign it now, and hand it over
                        del waiting[layer]
                        names = {k for k in state if k.startswith(layer.prefix)}
                        model.load_state_dict({k: state.pop(k) for k in names}, strict=False, assign=True)
                        assigned |= names
                        on_layer(layer.prefix[:-1], layer.module)
    held = dequantizer.pending() if hasattr(dequantizer, "pending") else []
    if held:
        raise CheckpointError(f"{where} has incomplete quantized weights (a piece is missing): {_few(held)}")
    if mis_shaped:
        raise CheckpointError(f"{where} has weights of the wrong shape for this config: {_few(mis_shaped)}")
    missing = [
        names[0] for names in aliases.values()
        if not any(n in state or n in assigned for n in names)
        and not any(p.search(n) for p in optional for n in names)
    ]
    if missing:
        raise CheckpointError(f"{where} lacks {len(missing)} weights the model needs: {_few(missing)}")
    if unexpected:
        raise CheckpointError(f"{where} has {len(unexpected)} weights the model does not use: {_few(unexpected)}")

    model.load_state_dict(state, strict=False, assign=True)
    # Re-tie: assignment replaced each alias separately (or left the unloaded one on meta).
    for names in aliases.values():
        if len(names) > 1:
            src = next((n for n in names if n in state or n in assigned), None)
            if src is None:  # an optional weight the checkpoint left out
                continue
            value = model.get_parameter(src) if src in dict(model.named_parameters()) else model.get_buffer(src)
            for n in names:
                if n != src:
                    _set_tensor(model, n, value)
    # Non-persistent buffers (RoPE inv_freq) are not in the checkpoint: allocate them, then let the modules fill them.
    for mod in model.modules():
        for bname, buf in list(mod._buffers.items()):
            if buf is not None and buf.is_meta and bname in mod._non_persistent_buffers_set:
                mod._buffers[bname] = torch.empty(buf.shape, dtype=buf.dtype, device=device)
    if hasattr(model, "reset_buffers"):
        model.reset_buffers()
    still_meta = [
        n for n, t in [*model.named_parameters(), *model.named_buffers()]
        if t.is_meta and not any(o.search(n) for o in optional)
    ]
    if still_meta:
        raise CheckpointError(f"{where}: weights {_few(still_meta)} were not loaded")


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a (meta-built) model's parameters and persistent buffers in their dtypes, shared ones counted once,
    less the weights a checkpoint may leave out (`checkpoint_optional`)."""
    optional = [re.compile(p) for p in getattr(model, "checkpoint_optional", ())]
    seen: dict[int, int] = {}
    for name, t in model.state_dict(keep_vars=True).items():  # tied parameters appear under each name
        if not any(o.search(name) for o in optional):
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def check_device_room(model: nn.Module, device: torch.device, where: str | Path) -> None:
    """Raise `DeviceMemoryError` when a CUDA device's free memory, or on the CPU the host's available memory (where
    it can be read: Linux), cannot hold the model's weights (on the CPU a raw allocation failure comes late, or the
    kernel kills the process without a word)."""
    need = weight_bytes(model)
    dtype = str(next((p.dtype for p in model.parameters()), torch.float32)).removeprefix("torch.")
    if device.type == "cpu":
        avail = device_memory.host_available()
        if avail is not None and need > avail:
            raise DeviceMemoryError(
                f"{where}: its weights take {gib(need)} in {dtype} and this machine has {gib(avail)} of memory "
                "available; use a machine with more memory, a smaller dtype (--dtype bfloat16), or for a GGUF of "
                "quantized weights (Q4_0, Q4_K_M, ...) the 4-bit CPU path (--cpu-weights q4: its layers are converted "
                "as they load, so their float32 weights are never held together)")
        return
    if device.type != "cuda":
        return
    free = device_memory.room(device) or 0  # with what PyTorch holds unused (a model loaded after another was freed)
    total = device_memory.free_memory(device)[1]
    if need > free:
        raise DeviceMemoryError(
            f"{where}: its weights take {gib(need)} in {dtype} and {device} has "
            f"{gib(free)} free of {gib(total)}; use a device with more memory, a smaller dtype (--dtype), or the CPU "
            "(--device cpu)")


def load_model(
    path: str | Path | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    on_layer: Callable[[str, nn.Module], None] | None = None,
    on_tensor: Callable[[nn.Module], Callable[[str, torch.Tensor], torch.Tensor]] | None = None,
) -> LoadedModel:
    """Model, config and tokenizer of an HF folder or a `.gguf` file (None: the embedded SmolLM2). `on_layer`: see
    `load_weights`; `on_tensor`: given the model built on the meta device, `load_weights`' `on_tensor`."""
    from ..models import get_model_class

    ckpt = Checkpoint(default_model_path() if path is None else path)
    config = ckpt.model_config()
    try:
        cls = get_model_class(config.architecture)
    except ConfigError as e:
        raise ConfigError(f"{e} ({ckpt.path})") from None
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev, config)
    tokenizer = ckpt.tokenizer()  # before the weights: an unreadable tokenizer fails fast
    model = build_on_meta(cls, config, dt)
    if on_layer is None:  # (with it, the caller converts each layer as it loads: the need is not these bytes)
        check_device_room(model, dev, ckpt.path)
    load_weights(model, ckpt.tensors(), dev, ckpt.path, ckpt.dequantizer(dt), on_layer,
                 None if on_tensor is None else on_tensor(model))
    if ckpt.path.is_dir() and hasattr(model, "configure_from_folder"):  # extra files, e.g. an image processor config
        model.configure_from_folder(str(ckpt.path))
    model.requires_grad_(False)
    model.eval()
    return LoadedModel(model=model, config=config, tokenizer=tokenizer, path=ckpt.path)


def load_config(path: str | Path | None = None) -> ModelConfig:
    """Only the config of a checkpoint (no weights are read)."""
    return Checkpoint(default_model_path() if path is None else path).model_config()
