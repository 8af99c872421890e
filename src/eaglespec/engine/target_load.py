"""A target loaded and prepared for inference as an EngineConfig asks (api.load, bench's models).

`load_target(path, device, dtype, fuse, compile, int4) -> LoadedModel`: `int4` is `int4_weights.int4_mode`'s answer
(True: the 4-bit CPU path required, None: where the weights allow, False: dense in `dtype`). Dense, it is
`load_model` then `prepare_for_inference`. On the 4-bit path each decoder layer is fused and converted as soon as
its weights are loaded (`int4_weights.convert_layer` through `load_model`'s `on_layer`), the embedding and head as
below, and `prepare_for_inference` converts the rest and finishes; where a weight or module has no 4-bit form,
True raises the ConfigError naming it, None loads the model again, dense in `dtype` (a GGUF of F16 weights fails at
its first layer).

The embedding and the head (`get_embed_and_head`) are taken as they arrive too (`load_model`'s `on_tensor`,
`_EmbedAndHead`): the embedding held in bf16 (the path's dtype for it), the head converted from its float32 weights
and its weight held in bf16 (tied, the embedding itself: the head is converted from the embedding's float32 values
before they are narrowed). A head that arrives before any decoder layer was converted waits in float32 for the
first one, so that a model the path refuses at its first layer (MoE, MLA) costs no head conversion first.

Why: the path reads the weights as the GGUF loader dequantizes them, float32, 8x a Q4_K_M file's bytes; converted
only after the whole load, an 8B model's 32 GB of float32 weights had to fit in memory first (a 24 GB machine's
process was killed). Converted a layer at a time, the peak is the packed model, one layer's float32 weights
(SmolLM2: ~17 MB a layer), the embedding in bf16 and the head's terms (an 8B model's 128K-token embedding and head
held in float32 until the end were 4.2 GB more: docs/benchmarks.md "Session 76").
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError
from ..layers.int4_linear import Int4Linear
from ..loading.checkpoint import LoadedModel, load_model
from .int4_weights import convert_layer, int4_linear
from .transforms import prepare_for_inference


class _EmbedAndHead:
    """`load_model`'s `on_tensor` on the 4-bit path (module docstring): `bind(model)` with the model built on the
    meta device, then called with each weight outside the decoder layers; `layer_converted()` after each layer;
    `attach(model)` once loaded."""

    def __init__(self) -> None:
        self.embed: set[str] = set()  # the embedding's state-dict names
        self.head_names: set[str] = set()  # the head's (tied: the embedding's as well)
        self.module: str | None = None  # the nn.Linear that multiplies by the head (None: left to use_int4_weights)
        self.layer_done = False  # a decoder layer converted: the path takes this model as far as it has gone
        self.waiting: torch.Tensor | None = None  # the head's float32 weights, until then
        self.head: Int4Linear | None = None

    def bind(self, model: nn.Module) -> "_EmbedAndHead":
        if not hasattr(model, "get_embed_and_head"):  # not a target of the protocol: use_int4_weights decides
            return self
        embed, head = model.get_embed_and_head()  # meta tensors, the protocol's
        named = model.state_dict(keep_vars=True)
        self.embed = {n for n, t in named.items() if t is embed}
        self.head_names = {n for n, t in named.items() if t is head}
        self.module = next((n for n, m in model.named_modules() if type(m) is nn.Linear and m.weight is head), None)
        return self

    def __call__(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self.module is not None and name in self.head_names:
            self.waiting = t
            self._convert()
            return t.to(torch.bfloat16)
        return t.to(torch.bfloat16) if name in self.embed else t

    def layer_converted(self) -> None:
        self.layer_done = True
        self._convert()

    def _convert(self) -> None:
        """The waiting head converted, once a layer has been."""
        if self.waiting is not None and self.layer_done:
            self.head = int4_linear(self.module, self.waiting)
            self.waiting = None

    def attach(self, model: nn.Module) -> None:
        """The loaded model's head replaced by its Int4Linear, whose `weight` is the held (bf16) Parameter."""
        self.layer_converted()  # (a model without decoder layers: its head now)
        if self.head is None:
            return
        lin = model.get_submodule(self.module)
        self.head.weight = lin.weight
        if lin.bias is not None:
            self.head.bias = nn.Parameter(lin.bias.detach().to(torch.bfloat16), requires_grad=False)
        parent, _, leaf = self.module.rpartition(".")
        setattr(model.get_submodule(parent), leaf, self.head)


def load_target(path: str | Path | None, device: torch.device, dtype: str | torch.dtype, fuse: bool | None,
                compile: bool | None, int4: bool | None) -> LoadedModel:
    """Module docstring. `dtype`: the dense model's (the 4-bit path loads float32 and computes in bf16)."""
    if int4 is not False and device.type == "cpu":
        fuse_layers = fuse is not False  # prepare_for_inference fuses on the CPU unless told not to

        ends = _EmbedAndHead()

        def on_layer(name: str, layer: nn.Module) -> None:
            convert_layer(name, layer, fuse_layers)
            ends.layer_converted()

        loaded: LoadedModel | None = None
        try:
            loaded = load_model(path, device=device, dtype=torch.float32, on_layer=on_layer, on_tensor=ends.bind)
            ends.attach(loaded.model)
            prepare_for_inference(loaded.model, device, fuse, compile, int4=True)
            return loaded
        except ConfigError:
            if int4:
                raise
            loaded = ends = None  # the half-converted model, freed before the dense one loads
    dense = load_model(path, device=device, dtype=dtype)
    prepare_for_inference(dense.model, device, fuse, compile, int4=False)
    return dense
