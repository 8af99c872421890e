"""A MoE router's selection after its logits as one Triton kernel: scores, group limit, top-k, normalisation.

PyTorch spends ~17 us per MoE layer of a one-token step on what follows the router's logits (softmax or sigmoid,
top-k through a sort, a gather, a sum, a division: ~8 launches; 0.8 ms of Qwen3-30B-A3B's 5.4 ms decode step on an
H100, session 54). Here one program per token row holds the row's E scores in registers and picks the k experts by
k masked argmaxes, so a layer's selection is one launch of a few microseconds.

`route(logits, k, sigmoid, bias, n_group, topk_group, norm, scaling) -> (weights [N, k] float32, ids [N, k] int64)`
computes exactly what `layers/moe.py`'s routers compute from their logits [N, E] (any float dtype, read as float32):
- softmax (Qwen3-MoE): p = softmax(logits); the k largest p; weights p;
- sigmoid (DeepSeek-V3's noaux_tc): s = sigmoid(logits), choice = s + bias; with n_group > 1 a group scores the sum
  of its two largest choices and only the topk_group best groups stay eligible; the k largest eligible choices;
  weights the unbiased s;
then divided by their sum when `norm` (+1e-20 for sigmoid, as the module), times `scaling`. Ties pick the lower
expert id (torch.topk leaves their order unspecified). `fits(E, n_group)`: the shapes it takes (groups need
E / n_group a power of two and n_group a power of two). Launches with programmatic dependent launch where the device
has it (layers/pdl.py): the correction bias (a weight) is loaded before the wait, the logits after it. Built on first
use (`TRITON_INTERPRET=1` for CPU tests).
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .pdl import launch_options

# num_warps of a program (one token row) up to 256 experts; more experts take 4. Session 56 measured 1 against 2 on
# Qwen3-30B-A3B's 128 experts (benchmarks/moe_graphs_check.py --part model, with_setting.py)
SMALL_WARPS = 2
USE_PDL = True  # False: launch without PDL (the benchmarks' A/B through with_setting.py)


def fits(num_experts: int, n_group: int) -> bool:
    if n_group <= 1:
        return True
    size = num_experts // n_group
    return num_experts % n_group == 0 and size & (size - 1) == 0 and n_group & (n_group - 1) == 0


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def router_kernel(logits, bias, w_out, id_out, E, s_row, scaling, K: tl.constexpr, KP: tl.constexpr,
                      EP: tl.constexpr, SIGMOID: tl.constexpr, G: tl.constexpr, TOPG: tl.constexpr,
                      NORM: tl.constexpr, PDL: tl.constexpr = False):
        n = tl.program_id(0)
        re = tl.arange(0, EP)
        valid = re < E
        if PDL:  # layers/pdl.py: the bias is a weight; the logits come from the kernel before
            tl.extra.cuda.gdc_launch_dependents()
        if SIGMOID:
            b = tl.load(bias + re, mask=valid, other=0.0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()
        x = tl.load(logits + n.to(tl.int64) * s_row + re, mask=valid, other=0.0).to(tl.float32)
        if SIGMOID:
            src = tl.where(valid, 1.0 / (1.0 + tl.exp(-x)), 0.0)  # [EP] the weights' source
            choice = tl.where(valid, src + b, float("-inf"))
            if G > 1:  # group limit: a group's score is the sum of its two largest choices
                grp = tl.reshape(choice, [G, EP // G])
                rg = tl.arange(0, EP // G)[None, :]
                m1 = tl.max(grp, 1)
                if EP // G > 1:
                    first = tl.argmax(grp, 1)
                    score = m1 + tl.max(tl.where(rg == first[:, None], float("-inf"), grp), 1)
                else:
                    score = m1
                gi = tl.arange(0, G)
                keep = gi < 0
                for _ in tl.static_range(TOPG):
                    j = tl.argmax(tl.where(keep, float("-inf"), score), 0)
                    keep = keep | (gi == j)
                choice = tl.reshape(tl.where(keep[:, None], grp, float("-inf")), [EP])
        else:
            x = tl.where(valid, x, float("-inf"))
            e = tl.exp(x - tl.max(x, 0))
            src = e / tl.sum(e, 0)
            choice = tl.where(valid, src, float("-inf"))
        rk = tl.arange(0, KP)
        wv = tl.zeros([KP], dtype=tl.float32)
        iv = tl.zeros([KP], dtype=tl.int64)
        for i in tl.static_range(K):  # the k largest, largest first (the lower id on ties)
            j = tl.argmax(choice, 0)
            wv = tl.where(rk == i, tl.sum(tl.where(re == j, src, 0.0), 0), wv)
            iv = tl.where(rk == i, j.to(tl.int64), iv)
            choice = tl.where(re == j, float("-inf"), choice)
        if NORM:
            if SIGMOID:
                wv = wv / (tl.sum(wv, 0) + 1e-20)
            else:
                wv = wv / tl.sum(wv, 0)
        tl.store(w_out + n * K + rk, wv * scaling, mask=rk < K)
        tl.store(id_out + n * K + rk, iv, mask=rk < K)

    return router_kernel


def route(logits: torch.Tensor, k: int, sigmoid: bool, bias: torch.Tensor | None, n_group: int, topk_group: int,
          norm: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E] -> (weights [N, k] float32, ids [N, k] int64); see the module docstring."""
    N, E = logits.shape
    assert bias is not None or not sigmoid, "route: a sigmoid router chooses by its correction bias"
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    weights = torch.empty(N, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(N, k, dtype=torch.int64, device=logits.device)
    if N:
        G = n_group if n_group > 1 else 1
        _kernel()[(N,)](logits, bias if bias is not None else logits, weights, ids, E, logits.stride(0),
                        float(scaling), K=k, KP=pow2(k), EP=pow2(E, 16) if G == 1 else E, SIGMOID=sigmoid, G=G,
                        TOPG=topk_group, NORM=norm, num_warps=4 if E > 256 else SMALL_WARPS,
                        **launch_options(logits, USE_PDL))
    return weights, ids
