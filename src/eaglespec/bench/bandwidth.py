"""Memory traffic of plain decoding, and the device's own copy bandwidth.

A decode step of a static batch reads every weight once (the embedding table excepted: only B rows of it; a tied
table is read whole by the head) and, per sequence, the KV entries of its context. For a sequence with a P-token
prompt that generates g tokens (the first by the prefill), decode step j = 1..g-1 attends over P + j cache entries.
So a static batch of sequences (P_b, g_b) costs

    steps      = max_b (g_b - 1)                           (all rows start together, finished rows leave)
    bytes      = steps * weight_bytes + kv_bytes_per_token * sum_b sum_{j=1..g_b-1} (P_b + j)

and the achieved bandwidth is bytes / decode time (the PhaseTimer's 'decode' total; where decode steps are not timed
one by one, as CUDA graph replays are not, the run's wall time less its prefills: a lower bound of the bandwidth).
Under continuous batching rows come and go, so `steps` is the number of decode steps the engine ran. Counting the
useful KV entries (not the padded range the kernel may touch) keeps the number a lower bound of the real traffic. A
mixture of experts counts, per MoE layer, the `num_experts_per_tok` routed experts one token reads (the fewest a step
reads; a step of several rows reads up to all of them) besides its router and shared experts, so the bound holds for
MoE targets too (counting every expert overstated a one-row step's weights by E / k: 16x for Qwen3-30B-A3B). On the
4-bit CPU path (engine/int4_weights.py) a projection reads its packed codes and bf16 scales / zeros, which are not
parameters, and its head those of the head (a tied embedding's table is then read only B rows at a time).

`copy_bandwidth(device)` measures a device-to-device copy (read + write bytes per second) on CUDA; None elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..layers.int4_linear import Int4Linear
from ..layers.moe import MoE


def _nbytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def weight_bytes_per_step(model: nn.Module) -> int:
    """Bytes of parameters one decode step reads at least: each parameter once, the input embedding table excluded
    unless it is tied to the head, and of each MoE layer's routed experts the `num_experts_per_tok` one token reads
    (all of them the same size)."""
    embed = model.get_embed_and_head()[0] if hasattr(model, "get_embed_and_head") else None
    head = model.get_embed_and_head()[1] if embed is not None else None
    seen: set[int] = set()
    total = 0
    for lin in (m for m in model.modules() if isinstance(m, Int4Linear)):  # the 4-bit path: packed, not parameters
        total += sum(t.packed.nbytes + t.scale_zero.nbytes for t in lin.terms)
        if lin.weight is not None:  # a head's kept `weight` (a tied one: the embedding, read B rows a step) is not read
            seen.add(id(lin.weight))
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        seen.update(id(p) for p in moe.experts.parameters())
        total += moe.gate.top_k * _nbytes(moe.experts[0].parameters())
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if embed is not None and p is embed and p is not head:
            continue
        total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(model: nn.Module, dtype: torch.dtype) -> int:
    """Cache bytes of one token over all layers (the engine's KV cache layout, `kv_cache_shapes`)."""
    per_layer = 0
    for shape in model.kv_cache_shapes():
        n = 1
        for s in shape:
            n *= s
        per_layer += n
    return per_layer * model.config.num_hidden_layers * torch.tensor([], dtype=dtype).element_size()


@dataclass
class DecodeTraffic:
    steps: int = 0
    kv_token_reads: int = 0  # cache entries read, summed over steps and sequences

    def add_batch(self, prompt_lens: Sequence[int], generated: Sequence[int]) -> None:
        """One static batch: prompt lengths and tokens generated per sequence (EOS included)."""
        self.add_sequences(prompt_lens, generated, max((max(g - 1, 0) for g in generated), default=0))

    def add_sequences(self, prompt_lens: Sequence[int], generated: Sequence[int], steps: int) -> None:
        """Sequences that ran through `steps` batched decode steps however they shared them (continuous batching
        counts the steps it ran): each sequence reads its own cache entries, every step the weights."""
        self.steps += steps
        reads = [max(g - 1, 0) for g in generated]
        self.kv_token_reads += sum(m * P + m * (m + 1) // 2 for P, m in zip(prompt_lens, reads))

    def bytes(self, weight_bytes: int, kv_bytes: int) -> int:
        return self.steps * weight_bytes + self.kv_token_reads * kv_bytes


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 10) -> float | None:
    """Device-to-device copy bandwidth in bytes/s (read + write), or None when the device is not CUDA."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = int(min(nbytes, free // 4)) // 256 * 256
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize(device)
    seconds = start.elapsed_time(end) / 1000.0
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes * iters / seconds
