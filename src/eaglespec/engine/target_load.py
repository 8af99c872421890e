"""A target loaded and prepared for inference as an EngineConfig asks (api.load, bench's models).

`load_target(path, device, dtype, fuse, compile, int4) -> LoadedModel`: `int4` is `int4_weights.int4_mode`'s answer
(True: the 4-bit CPU path required, None: where the weights allow, False: dense in `dtype`). Dense, it is
`load_model` then `prepare_for_inference`. On the 4-bit path each decoder layer is fused and converted as soon as its
weights are loaded (`int4_weights.convert_layer` through `load_model`'s `on_layer`), and `prepare_for_inference`
converts the rest (the head) and finishes; where a weight or module has no 4-bit form, True raises the ConfigError
naming it, None loads the model again, dense in `dtype` (a GGUF of F16 weights fails at its first layer).

Why: the path reads the weights as the GGUF loader dequantizes them, float32, 8x a Q4_K_M file's bytes; converted
only after the whole load, an 8B model's 32 GB of float32 weights had to fit in memory first (a 24 GB machine's
process was killed). Converted a layer at a time, the peak is the packed model, the embedding and head in float32,
and one layer's float32 weights (SmolLM2: ~17 MB a layer).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError
from ..loading.checkpoint import LoadedModel, load_model
from .int4_weights import convert_layer
from .transforms import prepare_for_inference


def load_target(path: str | Path | None, device: torch.device, dtype: str | torch.dtype, fuse: bool | None,
                compile: bool | None, int4: bool | None) -> LoadedModel:
    """Module docstring. `dtype`: the dense model's (the 4-bit path loads float32 and computes in bf16)."""
    if int4 is not False and device.type == "cpu":
        fuse_layers = fuse is not False  # prepare_for_inference fuses on the CPU unless told not to

        def on_layer(name: str, layer: torch.nn.Module) -> None:
            convert_layer(name, layer, fuse_layers)

        loaded: LoadedModel | None = None
        try:
            loaded = load_model(path, device=device, dtype=torch.float32, on_layer=on_layer)
            prepare_for_inference(loaded.model, device, fuse, compile, int4=True)
            return loaded
        except ConfigError:
            if int4:
                raise
            loaded = None  # the half-converted model, freed before the dense one loads
    dense = load_model(path, device=device, dtype=dtype)
    prepare_for_inference(dense.model, device, fuse, compile, int4=False)
    return dense
