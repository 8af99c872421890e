"""Soft cross-entropy of the drafter's logits against the target's distributions, with the drafter's argmax: the
per-row term of the TTT loss (ttt.py).

Contract of `soft_cross_entropy(logits, probs, rows) -> (ce, argmax)`:
- logits [n, V] (any float dtype; the gradient flows to it), probs [R, V] float32 (the target's distributions over
  the draft vocabulary: features' [B, T, Vd] viewed as [B * T, Vd]), rows [n] int64: row i's label is probs[rows[i]];
- ce [n] float32 = -sum_v p_v log softmax(z)_v, computed as lse(z) * sum(p) - sum(p * z) (exact for any p, not only
  distributions), argmax [n] int64 = logits.argmax(-1) (the first index on ties; not differentiable);
- the gradient: d ce_i / d z_i = sum(p) * softmax(z_i) - p, in logits' dtype.

On CUDA two Triton kernels, one program per row over the row in chunks (an online max and sum): forward and
backward each read the row's logits and label once, and nothing of [n, V] is written but the gradient. The eager
form (the CPU, and the reference of the tests) writes float32 copies of [n, V] ~5 times forward and backward, and
the gathered labels: for SmolLM2's 12,288-token draft vocabulary at ~5,500 rows a TTT step, ~4.5 GB a step k,
~30 GB a training step. On the H200 the kernels took a step's backward from 46.2 to 32.6 ms and its loss forward
from 9.6 to 8.4 ms (phases timed with a synchronisation after each; session 41, `benchmarks/train_step_profile.py`).
Built on first use, so that `TRITON_INTERPRET=1` (CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 2048  # entries per chunk of a row (6 chunks for a 12,288-token draft vocabulary)


def _use_kernel(logits: torch.Tensor) -> bool:
    """The Triton kernels on CUDA; the eager form elsewhere (tests force the kernels through the interpreter)."""
    return logits.is_cuda


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def forward_kernel(z_ptr, p_ptr, rows_ptr, ce_ptr, lse_ptr, psum_ptr, am_ptr, s_z, s_p, V: tl.constexpr,
                       BLOCK: tl.constexpr):  # V constexpr: one draft vocabulary a run, one compilation
        r = tl.program_id(0)
        row = tl.load(rows_ptr + r)
        offs0 = tl.arange(0, BLOCK)
        m = float("-inf")  # running max
        s = 0.0  # running sum of exp(z - m)
        dot = 0.0  # sum p * z
        psum = 0.0
        best = float("-inf")
        best_i = V  # int32: the first index of the maximum so far
        for c in range(0, V, BLOCK):
            offs = c + offs0
            inside = offs < V
            z = tl.load(z_ptr + r * s_z + offs, mask=inside, other=float("-inf")).to(tl.float32)
            p = tl.load(p_ptr + row * s_p + offs, mask=inside, other=0.0)
            cm = tl.max(z, 0)
            ci = tl.min(tl.where(z == cm, offs, V), 0)  # the chunk's first maximum
            best_i = tl.where(cm > best, ci, best_i)  # strictly greater: an earlier chunk keeps a tie
            best = tl.maximum(best, cm)
            new_m = tl.maximum(m, cm)
            s = s * tl.exp(m - new_m) + tl.sum(tl.where(inside, tl.exp(z - new_m), 0.0), 0)
            m = new_m
            dot += tl.sum(p * tl.where(inside, z, 0.0), 0)  # p = 0 outside; z = -inf there
            psum += tl.sum(p, 0)
        lse = m + tl.log(s)
        tl.store(ce_ptr + r, lse * psum - dot)
        tl.store(lse_ptr + r, lse)
        tl.store(psum_ptr + r, psum)
        tl.store(am_ptr + r, best_i.to(tl.int64))

    @triton.jit
    def backward_kernel(z_ptr, p_ptr, rows_ptr, lse_ptr, psum_ptr, g_ptr, dz_ptr, s_z, s_p, s_dz, V: tl.constexpr,
                        BLOCK: tl.constexpr):
        r = tl.program_id(0)
        row = tl.load(rows_ptr + r)
        g = tl.load(g_ptr + r)
        lse = tl.load(lse_ptr + r)
        psum = tl.load(psum_ptr + r)
        offs0 = tl.arange(0, BLOCK)
        for c in range(0, V, BLOCK):
            offs = c + offs0
            inside = offs < V
            z = tl.load(z_ptr + r * s_z + offs, mask=inside, other=0.0).to(tl.float32)
            p = tl.load(p_ptr + row * s_p + offs, mask=inside, other=0.0)
            dz = g * (psum * tl.exp(z - lse) - p)
            tl.store(dz_ptr + r * s_dz + offs, dz.to(dz_ptr.dtype.element_ty), mask=inside)

    return forward_kernel, backward_kernel


class _SoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, probs: torch.Tensor, rows: torch.Tensor):  # type: ignore[override]
        n, V = logits.shape
        dev = logits.device
        ce = torch.empty(n, dtype=torch.float32, device=dev)
        lse = torch.empty(n, dtype=torch.float32, device=dev)
        psum = torch.empty(n, dtype=torch.float32, device=dev)
        am = torch.empty(n, dtype=torch.int64, device=dev)
        if n:
            fwd, _ = _kernels()
            fwd[(n,)](logits, probs, rows, ce, lse, psum, am, logits.stride(0), probs.stride(0), V=V, BLOCK=BLOCK,
                      num_warps=8)
        ctx.save_for_backward(logits, probs, rows, lse, psum)
        ctx.mark_non_differentiable(am)
        return ce, am

    @staticmethod
    def backward(ctx, g_ce: torch.Tensor, g_am: torch.Tensor | None):  # type: ignore[override]
        logits, probs, rows, lse, psum = ctx.saved_tensors
        n, V = logits.shape
        dz = torch.empty_like(logits)
        if n:
            _, bwd = _kernels()
            g = g_ce.float().contiguous()
            bwd[(n,)](logits, probs, rows, lse, psum, g, dz, logits.stride(0), probs.stride(0), dz.stride(0), V=V,
                      BLOCK=BLOCK, num_warps=8)
        return dz, None, None


def soft_cross_entropy(logits: torch.Tensor, probs: torch.Tensor,
                       rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [n, V], probs [R, V] float32, rows [n] int64 -> (ce [n] float32, argmax [n] int64): module docstring."""
    if _use_kernel(logits):
        assert probs.dtype == torch.float32 and probs.stride(-1) == 1, "soft_cross_entropy: probs float32 rows"
        logits = logits if logits.stride(-1) == 1 else logits.contiguous()
        return _SoftCrossEntropy.apply(logits, probs, rows.contiguous())
    p = probs[rows]  # [n, V]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(p * logp).sum(-1), logits.argmax(-1)
