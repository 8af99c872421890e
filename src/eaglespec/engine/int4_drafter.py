"""An EAGLE-3 drafter beside a target on the 4-bit CPU path (engine/int4_weights.py): its projections quantized to
4-bit groups and, where numba is installed, its forwards through the same numba kernels as the target's layer steps.

`use_int4_drafter(drafter)` (Engine._wire_drafter, once the drafter holds the target's embedding; again on the same
drafter does nothing) -> whether it converted anything: every nn.Linear the drafter owns (fc, q/k/v, o_proj, gate/up,
down_proj, its own draft-vocabulary head; not a head it shares with the target) becomes an `Int4Linear` quantized
from its weights (`Int4Linear.quantize`: lossy, ~7% of a weight's norm), and a single-layer EAGLE-3 drafter that
`fits` gets `cpu_step` (`Int4DraftStep`), which its forward runs first, and a bf16 KV cache (`kv_dtype`, as the
target's on this path, which the kernels read; without the step the cache stays the drafter's dtype).

Why lossy is allowed here: a drafter only proposes tokens; the target verifies each, so the engine's tokens stay plain
decoding's whatever the drafter computes (the tests check the outputs on this path). What quantizing could cost is
acceptance: MT-bench 1-6, 64 tokens, greedy, the chains of 1 / 2 / 3 measured 1.57 / 1.91 / 2.05 quantized, as the
bf16 drafter's 1.56 / 1.92 / 2.06; MT-bench 1-20, the chain of 2, 1.84 against 1.88 (docs/benchmarks.md "Session
72").

Why: a drafter forward beside the numba layer steps cost ~2.1-2.4 ms (~0.2 of a decode step): its bf16 products
~1.1 ms (the head's 12,288 rows read 14 MB cold), ~70 PyTorch operators the rest; converted, ~1.1 ms
(docs/benchmarks.md "Session 72").

The step (`Int4DraftStep.__call__(drafter, input_ids, hidden, ctx, from_target, need_logits)` -> (logits, next hidden)
as `LlamaForCausalLMEagle3.forward`, or None for forwards it does not take: more than ROW_MAX_TOKENS tokens, no cache):
    h = fc(aux) (the module, EAGLE-3.1's input norms included) or the incoming hidden
    x = (RMSNorm(embed(ids)), RMSNorm(h))                           two_rms_norms
    a = o_proj(attend(RoPE(qkv_proj(x))))                           rope_store_attend over the drafter's cache
    r = bf16(residual + a); y = RMSNorm(r)                           add_rms_norm (residual: h, or RMSNorm(h))
    m = down_proj(silu(gate) * up)(y)                                silu_mul
    r = bf16(r + m); n = norm(r)                                     add_rms_norm
    logits = lm_head(n) at ctx.logits_index's positions; next hidden r there (n with norm_output)
rounding where the module path rounds in bf16 (layers/int4_step_kernels.py).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import nn

from ..layers.context import ForwardContext, gather_rows
from ..layers.int4_linear import Int4Linear
from ..layers.norm import RMSNorm
from ..layers.row_attention import takes_rows
from ..models.eagle3 import LlamaForCausalLMEagle3
from . import int4_step
from .int4_step import CacheBits, Scratch, plain_attention, silu_mlp, token_arrays
from .int4_weights import on_int4_path

# a seam benchmarks turn off (the drafter's products then stay bf16; its step still runs where it fits)
QUANTIZE = True


def use_int4_drafter(drafter: nn.Module) -> bool:
    """Module docstring."""
    if on_int4_path(drafter) or not isinstance(drafter, LlamaForCausalLMEagle3):
        return False  # once; an oracle (bench) has nothing to convert
    shared = None if drafter.has_own_head else drafter.lm_head  # the target's head: left as it is
    convert = []
    for m in drafter.modules():
        for leaf, child in m.named_children():
            if QUANTIZE and isinstance(child, nn.Linear) and child is not shared:  # (CpuLinear too)
                q = Int4Linear.quantize(child.weight.detach().float(),
                                        None if child.bias is None else child.bias.detach())
                if q is not None:
                    convert.append((m, leaf, q))
    for parent, leaf, q in convert:
        setattr(parent, leaf, q)
    drafter.cpu_step = Int4DraftStep.attach(drafter)
    if drafter.cpu_step is not None:  # its kernels read bf16 keys and values (ModelRunner.draft_kv_dtype)
        drafter.kv_dtype = torch.bfloat16
    drafter.int4_weights = True
    return True


def fits(drafter: nn.Module) -> bool:
    """Whether the step computes `drafter` exactly as its modules do: one layer (no later ones), RMSNorms,
    `int4_step.plain_attention` with RoPE over the whole head, a `int4_step.silu_mlp`."""
    mid = getattr(drafter, "midlayer", None)
    if mid is None or len(drafter.layers) or mid.norm_linear is not None:
        return False
    norms = (mid.input_layernorm, mid.hidden_norm, mid.post_attention_layernorm, drafter.norm)
    return (all(type(n) is RMSNorm for n in norms) and plain_attention(mid.self_attn) and silu_mlp(mid.mlp)
            and 2 * drafter.rotary.inv_freq.shape[0] == mid.self_attn.head_dim)


class Int4DraftStep:
    """The drafter's forward through the kernels (module docstring): its norms' weights as float32 numpy arrays, its
    projections as attached, RoPE's cos / sin by position (a table grown as positions come), its scratch arrays."""

    def __init__(self, drafter: nn.Module, kernels: ModuleType) -> None:
        self.k = kernels
        mid = drafter.midlayer
        self.norms = [(n.weight.detach().float().numpy(), float(n.eps)) for n in
                      (mid.input_layernorm, mid.hidden_norm, mid.post_attention_layernorm, drafter.norm)]
        attn, mlp = mid.self_attn, mid.mlp
        self.qkv, self.o, self.gate_up, self.down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
        self.rotary = drafter.rotary
        self.cos_sin = (np.zeros((0, 1), np.float32),) * 2
        K = drafter.config.hidden_size
        # x (the two input norms), the attention's output, the gating's, the MLP's norm and the final norm
        self.scratch = Scratch(2 * K, attn.num_heads * attn.head_dim, self.down.in_features, K, K)
        self.bits = CacheBits()

    @staticmethod
    def attach(drafter: nn.Module) -> "Int4DraftStep | None":
        """The step for `drafter` where it `fits` and the kernels load (int4_step.USE_KERNELS, numba), else None."""
        kernels = int4_step.kernels() if fits(drafter) else None
        return Int4DraftStep(drafter, kernels) if kernels is not None else None

    def _rope(self, positions: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [M, D / 2] float32 of positions [B, T]: rows of a table of the rotary's own values for positions
        0..n-1 (n doubled past the largest seen), instead of its four operators a forward."""
        p = positions.reshape(-1).numpy()
        try:
            return self.cos_sin[0][p], self.cos_sin[1][p]
        except IndexError:
            n = max(256, 2 * int(p.max()) + 2)
            self.cos_sin = tuple(t.float().contiguous().numpy() for t in self.rotary(torch.arange(n)))
            return self.cos_sin[0][p], self.cos_sin[1][p]

    def __call__(self, drafter: nn.Module, input_ids: torch.Tensor, hidden: torch.Tensor, ctx: ForwardContext,
                 from_target: bool, need_logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        cache = ctx.kv[0] if ctx.kv is not None else None
        B, T = input_ids.shape
        if not takes_rows(ctx, cache, T) or cache[0].dtype != torch.bfloat16:
            return None
        mid = drafter.midlayer
        attn = mid.self_attn
        M, K = B * T, drafter.config.hidden_size
        H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
        if from_target:
            hidden = drafter.project_aux(hidden)
        dtype = drafter.norm.weight.dtype  # the drafter's (bf16 beside a 4-bit target)
        (we, ee), (wh, eh), (w2, e2), (wn, en) = self.norms
        (x, xn), (out, outn), (act, actn), (y, yn), (n, n_np) = self.scratch.get(M)
        e = drafter.embed_tokens.weight[input_ids.reshape(-1)].float()  # [M, K]
        h = hidden.reshape(M, K).float()
        self.k.two_rms_norms(e.numpy(), we, ee, h.contiguous().numpy(), wh, eh, xn)
        rows, slots, vis_n, vis_idx = token_arrays(ctx, B, T)
        c, s = self._rope(ctx.positions)
        qkv = _product(self.qkv, x, dtype)  # [M, (H + 2 Hkv) D]
        self.k.rope_store_attend(qkv.numpy(), c, s, *self.bits(cache), rows, slots, vis_n, vis_idx, H, Hkv, D**-0.5,
                                 outn)
        o = _product(self.o, out, dtype)
        # the residual stream: h, or with norm_before_residual hidden_norm(h) (x's second half)
        r = x[:, K:].clone() if mid.norm_before_residual else h.clone()
        self.k.add_rms_norm(r.numpy(), o.numpy(), w2, e2, yn)
        self.k.silu_mul(_product(self.gate_up, y, dtype).numpy(), actn)  # gate/up [M, 2 I] -> [M, I]
        m = _product(self.down, act, dtype)
        self.k.add_rms_norm(r.numpy(), m.numpy(), wn, en, n_np)  # r <- bf16(r + m), n <- norm(r)
        r, n = r.view(B, T, K).to(dtype), n.view(B, T, K).to(dtype, copy=True)  # (n is scratch: a copy leaves)
        if ctx.logits_index is not None:
            r, n = gather_rows(r, ctx.logits_index), gather_rows(n, ctx.logits_index)
        logits = None
        if need_logits:
            head = drafter.lm_head
            flat = n.reshape(-1, K)
            logits = (head.mm(flat.to(torch.bfloat16)) if isinstance(head, Int4Linear) else head(flat)).view(
                *n.shape[:2], -1)
        return logits, (n if drafter.norm_output else r)


def _product(linear: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [M, K] float32 (bf16 values) through a drafter projection -> float32 [M, N]: an Int4Linear's `mm` directly,
    a projection left dense (K not a multiple of 32, QUANTIZE off) in the drafter's dtype."""
    if isinstance(linear, Int4Linear):
        return linear.mm(x.to(torch.bfloat16)).float()
    return linear(x.to(dtype)).float()
