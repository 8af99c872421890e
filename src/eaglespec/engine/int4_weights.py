"""The 4-bit CPU path (`EngineConfig.cpu_weights = "q4"`, `--cpu-weights q4`; by default, "auto", where `int4_mode`
says so): a GGUF target's own 4-bit weights multiplied as they are stored, bf16 activations, and speculation still
lossless by construction.

`use_int4_weights(model)` (engine.transforms.prepare_for_inference, after fusing projections, on a target loaded in
float32): every nn.Linear of the target becomes an `Int4Linear` (layers/int4_linear.py: Q4_0 / Q4_1 groups, Q8_0 as two
4-bit products; the K-quants, 5-bit, IQ3_S and IQ4 types as one to four a row, layers/kquant_groups.py), every
attention layer computes decode and verify steps row by row (`GQAAttention.row_invariant`, layers/row_attention.py;
where numba is installed, a Llama-shaped layer's decode and verify steps run through engine/int4_step.py's kernels
instead of its modules, row-invariant alike; a drafter beside it is converted by the engine: engine/int4_drafter.py),
and the other parameters (embedding, norms) are cast to bf16 (buffers such as RoPE's frequencies stay float32, as a
bf16 load keeps them); the KV cache holds bf16 with the kernels, float32 without (`model.kv_dtype`). What it cannot
run it names in a ConfigError before changing anything: a weight that is not a GGUF's quantized groups (an
F16 GGUF, a safetensors checkpoint, most IQ tensors; K-quants without numba), an attention other than
grouped-query attention (MLA, linear attention), a module it does not know to be row-invariant (MoE experts, vision
towers). Engines load their target a layer at a time instead (engine/target_load.py): `convert_layer` converts each
decoder layer as its weights arrive, `use_int4_weights` the rest; where a weight fails there, that model is dropped.

Why lossless: a speculative engine commits the tokens plain decoding would where every token's logits have the same
bits in a verify of D tokens as in a one-token step. On this path each part of the step is row-invariant: the 4-bit
kernel (each output row alone), the row-wise attention, and the rest elementwise or per-row reductions (RMSNorm,
RoPE, SiLU, residual adds, the embedding's lookup); the tests check it end to end on the machine running them. A
float32 engine rests instead on float32's small rounding differences not flipping an argmax.

Why: a float32 one-token step of SmolLM2 reads ~540 MB of weights; this one ~102 MB (4 bits a weight and a bf16 scale
and zero per group of 32: 5 bits; the Q8_0 head as two such products; `bench`'s count, docs/benchmarks.md "Session
70").
"""

from __future__ import annotations

import platform
from typing import Sequence

import torch
from torch import nn

from ..config import SpecConfig
from ..errors import ConfigError
from ..layers.attention import GQAAttention
from ..layers.int4_linear import Int4Linear
from ..layers.kquant_groups import kquant_kernels_installed
from ..layers.row_attention import ROW_MAX_TOKENS
from .int4_step import Int4Step

# Where `cpu_weights="auto"` takes this path (`int4_mode`): the CPUs it was measured faster on, all x86-64 (2 cores
# each, the embedded SmolLM2, MT-bench; docs/benchmarks.md "Session 69", "Session 70"): plain 4-bit decoding ran
# 1.06-1.27x float32's best speculation on an AVX2 AMD EPYC, 1.21-1.29x on Intel Xeons, 1.09x on an AVX-512 AMD EPYC
# (Zen 4), and with its own speculation (`assets.INT4_GREEDY`) `eaglespec generate` there 61.6 / 60.6 against float32's
# 47.2 / 48.4 tok/s (1.30x / 1.25x). Other architectures (aarch64's 4-bit kernel) are not measured: dense there. Engines
# of several rows (`serve`'s 4, `api.load`'s default 8) stay dense: the kernel is compute-bound past one row (on the Zen
# 4 EPYC, `bench --no-spec --batch-sizes 1,4,8`, MT-bench 1-8, 48 tokens: plain 4-bit decoding 1.71x / 1.21x / 0.94x
# float32's at 1 / 4 / 8 rows), and a prefill of several padded prompts attends through SDPA in bf16, whose roundings
# differ from one prompt's alone enough to change answers (bench, 2 rows: 1 of 2 plain answers not the one-row engine's;
# float32's are), so what a request gets would depend on the requests beside it.
INT4_DEFAULT_MACHINES = frozenset({"x86_64", "amd64"})
INT4_DEFAULT_MAX_ROWS = 1
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)
# a decoder layer's attention, as models name it
_ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")


def _known(m: nn.Module) -> bool:
    """Whether `m` is a module the row-invariance argument (module docstring) covers: nn.Linear, grouped-query
    attention, norms and embeddings (per-row), the decoder's containers, MLPs and layers (their work is their
    children's, or elementwise), looked up by the models' class names; anything else (MoE blocks, routers, vision
    towers, a multimodal wrapper) is refused, parameters or not."""
    name = type(m).__name__
    return (isinstance(m, (nn.Embedding, nn.Linear, GQAAttention, Int4Linear) + _CONTAINERS)
            or name.endswith(("Norm", "MLP", "DecoderLayer", "Model", "ForCausalLM", "Embedding", "Rotary")))


def _check(model: nn.Module, prefix: str = "") -> None:
    """Raise a ConfigError naming what the 4-bit path cannot run (module docstring); `prefix`: `model`'s name in the
    model it belongs to ("model.layers.0." for a decoder layer converted as it loads)."""
    arch = type(model).__name__
    for name, m in model.named_modules():
        full = prefix + name if name else prefix[:-1] or "model"
        if name.rsplit(".", 1)[-1] in _ATTENTION_NAMES and not isinstance(m, GQAAttention):
            raise ConfigError(f"--cpu-weights q4 runs grouped-query attention only; {arch}'s {full} is "
                              f"{type(m).__name__} (use --cpu-weights dense)")
        if not _known(m):
            raise ConfigError(f"--cpu-weights q4 does not run {arch}'s {full} ({type(m).__name__}); use "
                              "--cpu-weights dense")


def on_int4_path(model: nn.Module) -> bool:
    """Whether `model` runs this path: a target `use_int4_weights` converted (or a drafter
    engine/int4_drafter.py did)."""
    return getattr(model, "int4_weights", False)


def check_shapes(target: nn.Module, shapes: Sequence[SpecConfig]) -> None:
    """Raise a ConfigError where a target on this path would verify more tokens a row than the row-wise attention
    takes (ROW_MAX_TOKENS: longer forwards keep SDPA, which is not row-invariant, so speculation would no longer be
    lossless). Engine calls it with its speculative shapes."""
    widest = max((s.draft_tokens for s in shapes), default=0)
    if on_int4_path(target) and widest > ROW_MAX_TOKENS:
        raise ConfigError(f"--cpu-weights q4 verifies at most {ROW_MAX_TOKENS} draft tokens a step (its row-wise "
                          f"attention, what keeps speculation lossless there); got --draft-tokens {widest}")


def int4_mode(cpu_weights: str, device: torch.device, dtype: str, compile: bool | None, rows: int) -> bool | None:
    """Whether a target goes this path, for EngineConfig's `cpu_weights`, the resolved device, the dtype asked for,
    `compile` and the most rows its engines run: True ("q4": it must, or the load fails naming why), None ("auto" on a
    CPU of INT4_DEFAULT_MACHINES, dtype "auto", not compiled, at most INT4_DEFAULT_MAX_ROWS rows: where every weight
    and module allows it, else dense), False (dense)."""
    if cpu_weights == "q4":
        return True
    if (cpu_weights == "auto" and device.type == "cpu" and dtype == "auto" and not compile
            and rows <= INT4_DEFAULT_MAX_ROWS and platform.machine().lower() in INT4_DEFAULT_MACHINES):
        return None
    return False


def use_int4_weights(model: nn.Module, required: bool = True) -> bool:
    """Module docstring. `model` float32 on the CPU, projections fused or not. Where it cannot (a ConfigError naming
    why, nothing changed): raises if `required`, else returns False and the model stays dense; True once converted."""
    try:
        _convert(model)
    except ConfigError:
        if required:
            raise
        return False
    return True


def _int4_layers(model: nn.Module, prefix: str = "") -> list[tuple[nn.Module, str, Int4Linear]]:
    """Each nn.Linear of `model` (its parent, its name there) with the Int4Linear that replaces it; a ConfigError
    naming the first that has no such form (its full name: `prefix` + its name in `model`)."""
    layers: list[tuple[nn.Module, str, Int4Linear]] = []
    for name, m in model.named_modules():
        for leaf, child in m.named_children():
            if type(child) is not nn.Linear:
                continue
            w = child.weight
            # the head keeps its Parameter as `weight` (get_embed_and_head: a drafter without its own head; tied, it is
            # the embedding)
            keep = w if leaf == "lm_head" else None
            full = prefix + (f"{name}.{leaf}" if name else leaf)
            layers.append((m, leaf, int4_linear(full, w.detach(), None if child.bias is None else child.bias.detach(),
                                                keep)))
    return layers


def int4_linear(name: str, w: torch.Tensor, bias: torch.Tensor | None = None, keep: nn.Parameter | None = None
                ) -> Int4Linear:
    """The Int4Linear of float32 weights `w` [N, K] as the GGUF loader dequantized them (`Int4Linear.from_weight`),
    or a ConfigError naming the projection `name` and the types this path takes."""
    q = Int4Linear.from_weight(w, bias, keep=keep)
    if q is None:
        kq = "" if kquant_kernels_installed() else "; its K-quant and 5-bit groups need numba"
        raise ConfigError(
            f"--cpu-weights q4 needs a GGUF's quantized groups (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, Q2_K to "
            f"Q6_K, IQ3_S / IQ4_NL / IQ4_XS){kq}; {name} [{w.shape[0]} x {w.shape[1]}] is none of them (e.g. "
            "the embedded SmolLM2's Q4_1, a Q4_K_M file; or use --cpu-weights dense)")
    return q


def convert_layer(name: str, layer: nn.Module, fuse: bool) -> None:
    """A decoder layer whose float32 weights were just loaded (loading.checkpoint.load_weights' `on_layer`, called
    by engine/target_load.py): its projections fused where `fuse` (as prepare_for_inference would fuse them), then
    each nn.Linear replaced by its Int4Linear, so that the float32 weights are freed before the next layer loads.
    `use_int4_weights` finishes the model once loaded (its other Linears, the casts, the steps). A ConfigError names
    what the layer cannot run (the layer may be left fused: the caller loads the model again or fails)."""
    _check(layer, f"{name}.")
    if fuse:
        from .transforms import fuse_projections  # (transforms imports this module where it uses it)

        fuse_projections(layer)
    for parent, leaf, q in _int4_layers(layer, f"{name}."):
        setattr(parent, leaf, q)


def _convert(model: nn.Module) -> None:
    """`use_int4_weights`' work: every check before any change (module docstring)."""
    if any(type(m) is nn.Linear and m.weight.dtype != torch.float32 for m in model.modules()):
        raise ConfigError("--cpu-weights q4 reads the weights as the GGUF loader dequantizes them: load in float32")
    _check(model)
    layers = _int4_layers(model)
    for parent, leaf, q in layers:  # nothing changed before every weight was found convertible
        setattr(parent, leaf, q)
    for m in model.modules():
        if isinstance(m, GQAAttention):
            m.row_invariant = True
    for p in model.parameters():  # the embedding, norms (and a tied head's `weight`, the embedding itself)
        p.data = p.data.to(torch.bfloat16)
    # decode and verify steps through numba kernels where numba is installed and the layers are Llama-shaped
    model.int4_steps = Int4Step.attach(model)
    # keys and values are bf16 values: the kernels read them as bf16 (half the bytes at long contexts), the modules'
    # row-wise attention (no numba) as float32, without a conversion a layer and query row (ModelRunner.kv_dtype)
    model.kv_dtype = torch.bfloat16 if model.int4_steps else torch.float32
    model.int4_weights = True  # `draft="auto"` takes this path's own policy (api.auto_spec, assets.INT4_GREEDY)
