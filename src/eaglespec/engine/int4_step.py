"""A decoder layer's decode and verify steps on the 4-bit CPU path in seven calls: the four 4-bit products
(layers/int4_linear.py) and three numba kernels for the work between them (layers/int4_step_kernels.py: add +
RMSNorm, RoPE + KV store + attention, SiLU gating), instead of the module path's ~70 PyTorch operators, whose dispatch
cost most of a one-row step (docs/benchmarks.md "Session 71": plain decoding of the embedded SmolLM2 1.3-1.4x).

`Int4Step.attach(model)` (engine/int4_weights.py, after the conversion) gives every layer it `fits` a
`PreNormDecoderLayer.cpu_step`; numba missing (`ImportError`) or `USE_KERNELS` off, it attaches nothing and the layers
keep the module path. A step, `cpu_step(layer, h, delta, cos, sin, ctx, cache, keep_input)`, runs the forwards the
row-wise attention runs (`row_attention.takes_rows`: a cached, non-causal forward of at most ROW_MAX_TOKENS
tokens; with RoPE over the whole head) and returns None for any other (prefills), which the layer then runs as modules.

Contract with the layer (`PreNormDecoderLayer.forward`): h [B, T, K] (bf16, or float32 from a layer before), delta
None or [B, T, K] -> (h, delta) as float32 h (bf16 values; updated in place where it was already float32, as the
folded path does) and bf16 delta, plus with keep_input a copy of the layer's input sum. The KV cache is bf16
(`model.kv_dtype` once steps are attached: engine/int4_weights.py; keys and values are bf16 values, so float32 would
only double what a long context's attention reads). Every token is computed alone (the kernels' module docstring),
so this step is row-invariant like the path it replaces; its roundings are that path's, its sums in another order.
"""

from __future__ import annotations

from types import ModuleType
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..layers.attention import GQAAttention
from ..layers.context import ForwardContext
from ..layers.int4_linear import Int4Linear
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.row_attention import takes_rows, visible_keys
from ..models.base import PreNormDecoderLayer

# a seam tests and benchmarks turn off (the module path then runs every step, as without numba)
USE_KERNELS = True
# the largest forward whose scratch arrays a step keeps (`Scratch`)
SCRATCH_MAX_TOKENS = 16


def kernels() -> ModuleType | None:
    """layers/int4_step_kernels.py, its machine code loaded (now, not in a first step: ~0.5 s, LLVM's start), or None
    where numba is not installed or USE_KERNELS is off (the module path)."""
    if not USE_KERNELS:
        return None
    try:
        from ..layers import int4_step_kernels as k
    except ImportError:  # numba not installed
        return None
    k.warm()
    return k


def plain_attention(attn: nn.Module) -> bool:
    """Whether `attn` is grouped-query attention the kernels compute exactly: fused q/k/v, no window, sinks, soft cap,
    query temperature, NoPE or custom scale, an even head_dim (RoPE on halves). The layer step and the drafter's
    (engine/int4_drafter.py) both ask."""
    return (type(attn) is GQAAttention and getattr(attn, "qkv_proj", None) is not None and attn.window is None
            and not attn.nope and attn.scale is None and attn.softcap is None and attn.temperature is None
            and "sinks" not in attn._parameters and attn.head_dim % 2 == 0)


def silu_mlp(mlp: nn.Module) -> bool:
    """Whether `mlp` is a SiLU-gated MLP with fused gate/up (`silu_mul`'s input)."""
    return type(mlp) is GatedMLP and mlp.act_name == "silu" and getattr(mlp, "gate_up_proj", None) is not None


def fits(layer: nn.Module) -> bool:
    """Whether `layer` is a Llama-shaped pre-norm layer this step computes exactly: RMSNorms, `plain_attention` with
    fused 4-bit q/k/v and o_proj, a `silu_mlp` with fused 4-bit gate/up and down_proj."""
    if not isinstance(layer, PreNormDecoderLayer) or layer.folded_norms or layer.norm_linear is not None:
        return False
    attn, mlp = layer.self_attn, layer.mlp
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    return (all(type(n) is RMSNorm for n in norms) and plain_attention(attn) and silu_mlp(mlp)
            and all(isinstance(p, Int4Linear) for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)))


class Scratch:
    """Arrays [M, width] a step reuses, per token count M up to SCRATCH_MAX_TOKENS (decode and verify steps; larger
    forwards get fresh ones), each as (tensor, its numpy view): float32, or bf16 with a uint16 view of its bits (the
    kernels' "bits": the 4-bit products' inputs, written by the kernels and read by the products as they are). They
    never leave the step."""

    def __init__(self, *widths: int, dtype: torch.dtype = torch.float32) -> None:
        self.widths, self.dtype = widths, dtype
        self._by_m: dict[int, list[tuple[torch.Tensor, np.ndarray]]] = {}

    def get(self, M: int) -> list[tuple[torch.Tensor, np.ndarray]]:
        got = self._by_m.get(M)
        if got is None:
            got = [(t, _numpy(t)) for t in (torch.zeros(M, w, dtype=self.dtype) for w in self.widths)]
            if M <= SCRATCH_MAX_TOKENS:
                self._by_m[M] = got
        return got


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor as the kernels take it: a bf16 one's bits (uint16), a float32 one's numpy view, any other
    dtype (a delta from a layer of other modules) a float32 copy."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy()
    return t.numpy() if t.dtype == torch.float32 else t.float().numpy()


class Int4Step:
    """One layer's step (module docstring): its norms' weights as float32 numpy arrays, its four products (the
    layer's Int4Linear modules as attached) and its scratch arrays."""

    def __init__(self, layer: PreNormDecoderLayer, kernels: ModuleType) -> None:
        self.k = kernels
        n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
        self.w1, self.eps1 = n1.weight.detach().float().numpy(), float(n1.eps)
        self.w2, self.eps2 = n2.weight.detach().float().numpy(), float(n2.eps)
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv, self.o, self.gate_up, self.down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
        # x (the norms' outputs), the attention's output, the gating's, and zeros (a first layer's delta): bf16, the
        # products' inputs, which the kernels write as bits
        K = self.down.out_features
        self.scratch = Scratch(K, self.o.in_features, self.down.in_features, K, dtype=torch.bfloat16)
        self.bits = CacheBits()

    @staticmethod
    def attach(model: nn.Module) -> int:
        """Give every layer of `model` that `fits` its step; -> how many (0 where numba is missing)."""
        layers = [m for m in model.modules() if fits(m)]
        k = kernels() if layers else None  # (numba not even imported for a model none of whose layers fit)
        if k is None:
            return 0
        for m in layers:
            m.cpu_step = Int4Step(m, k)
        return len(layers)

    def __call__(self, layer: PreNormDecoderLayer, h: torch.Tensor, delta: torch.Tensor | None, cos: torch.Tensor,
                 sin: torch.Tensor, ctx: ForwardContext, cache, keep_input: bool = False) -> tuple | None:
        B, T, K = h.shape
        attn = layer.self_attn
        H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
        if not takes_rows(ctx, cache, T) or 2 * cos.shape[-1] != D or cache[0].dtype != torch.bfloat16:
            return None  # prefills, partial RoPE (and a cache of another dtype): the modules
        M = B * T
        rows, slots, vis_n, vis_idx, c, s = forward_arrays(ctx, cos, sin, B, T)
        # bf16 scratch: the products' inputs as tensors, the kernels' outputs as bits
        (x, xn), (out, outn), (act, actn), (_, zeros) = self.scratch.get(M)
        h32 = h.reshape(M, K).float().contiguous()  # h itself when a layer before made it (updated in place)
        dn = zeros if delta is None else _numpy(delta.reshape(M, K).contiguous())  # bf16 (a step's): its bits
        self.k.add_rms_norm(h32.numpy(), dn, self.w1, self.eps1, xn)
        s_in = h32.clone().view(B, T, K) if keep_input else None  # the layer's input sum (an aux state)
        qkv = self.qkv.mm(x)  # [M, (H + 2 Hkv) D] bf16
        self.k.rope_store_attend(_numpy(qkv), c, s, *self.bits(cache), rows, slots, vis_n, vis_idx, H, Hkv, D**-0.5,
                                 outn)
        o = self.o.mm(out)
        self.k.add_rms_norm(h32.numpy(), _numpy(o), self.w2, self.eps2, xn)
        gu = self.gate_up.mm(x)  # [M, 2 I]
        self.k.silu_mul(_numpy(gu), actn)
        d = self.down.mm(act).view(B, T, K)  # bf16
        return (h32.view(B, T, K), d, s_in) if keep_input else (h32.view(B, T, K), d)


class CacheBits:
    """A layer's bf16 key and value caches as the kernels take them, uint16 numpy views of their bits, made once for
    the tensors the engine holds (`KVCache.layers()` hands the same ones each forward until it grows): two views a
    forward cost ~5 us a layer."""

    def __init__(self) -> None:
        self._of: torch.Tensor | None = None
        self._views: tuple[np.ndarray, np.ndarray] = ()

    def __call__(self, cache: Sequence[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
        if cache[0] is not self._of:  # (the views keep the old tensors' memory until a new cache replaces them)
            self._of, self._views = cache[0], (_numpy(cache[0]), _numpy(cache[1]))
        return self._views


def token_arrays(ctx: ForwardContext, B: int, T: int) -> tuple:
    """Per forward (memoised in ctx): numpy int64 rows [M] and write slots [M] of the tokens, their visible key counts
    [M] and positions [M, W] (W = 0 where every token sees a prefix of its row, as decode and chain verifies do:
    row_attention.visible_keys)."""
    key = ("int4_tokens", B, T)
    if key not in ctx._memo:
        rows = ctx.row_index(B)[:, None].expand(B, T).reshape(-1).to(torch.int64).contiguous()
        slots = ctx.write_index.reshape(-1).to(torch.int64).contiguous()
        vis = [v for row in visible_keys(ctx, None) for v in row]
        counts = [v if isinstance(v, int) else v.numel() for v in vis]
        if all(isinstance(v, int) for v in vis):
            idx = torch.zeros(len(vis), 0, dtype=torch.int64)
        else:  # a tree's tokens see gathered positions: each token's list, padded to the longest
            idx = torch.zeros(len(vis), max(counts), dtype=torch.int64)
            for i, v in enumerate(vis):
                idx[i, : counts[i]] = torch.arange(v) if isinstance(v, int) else v
        n = torch.tensor(counts, dtype=torch.int64)
        ctx._memo[key] = (rows.numpy(), slots.numpy(), n.numpy(), idx.numpy())
    return ctx._memo[key]


def forward_arrays(ctx: ForwardContext, cos: torch.Tensor, sin: torch.Tensor, B: int, T: int) -> tuple:
    """Per forward and RoPE table (the layers share it): `token_arrays`, then float32 cos / sin [M, D / 2]."""
    key = ("int4_step", id(cos))
    if key not in ctx._memo:
        c, s = (t.reshape(B * T, -1).float().contiguous().numpy() for t in (cos, sin))
        ctx._memo[key] = token_arrays(ctx, B, T) + (c, s)
    return ctx._memo[key]
