"""Grouped-query attention over the engine's preallocated KV cache.

`attend(q, k, v, ctx, cache)` is the one attention entry point for cached forwards: it writes the new K/V into the
cache at `ctx.write_index`, reads cache positions [0, ctx.kv_len) of the rows in use and runs SDPA under
`ctx.attn_mask` (prefill, decode, tree verify and drafter levels differ only in that metadata, see `context.py`), or
in a sliding-window layer under `ctx.mask(window)`, the same without the keys the window leaves behind.
Without a cache (`ctx.write_index is None`) it attends within the given tokens under the [B, T, T] mask.

Eager SDPA calls on CUDA run without the cuDNN backend (`SDPA_BACKENDS`): cuDNN builds an execution plan on the host
for every new shape and strides, about 0.2 s each on the H200 (session 8, docs/benchmarks.md), and an eager multi-row
prefill brings a new shape with nearly every batch of prompts; the memory-efficient and flash backends have no such
cost. Calls inside `graph_build()` (a CUDA graph's warm-up and capture) keep every backend. Other eager attention
(MoonViT's, one shape per image size) goes through `scaled_dot_product_attention` for the same choice.

Cache layout per layer: k and v as [Bc, S_max, H_kv, head_dim] (row-major by position so that a row's prefix is
one contiguous slice and compaction after verification is a single index copy over all layers).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from .context import Chunk, ForwardContext
from .fused_linear import fused_linear
from .norm import RMSNorm, rms_scaled
from .rotary import apply_rotary
from .row_attention import attend_rows, takes_rows


@dataclass(frozen=True)
class AttentionKernel:
    """An attention over the cache for the shapes it accepts (an attention layer's `attn_kernel`, set by
    engine.transforms). GQAAttention: `run(q, k_cache, v_cache, rows, mask, scale)` with q [B, T, H, D] after RoPE, the
    layer's caches (this forward's keys written), rows [B] and mask [B, T, K] (ctx.mask(window)), keywords `sinks` [H]
    and `softcap` (None: none) -> [B, T, H, D];
    `fits(B, T, H, Hkv, D, dtype)` says whether it takes a step of that shape and q dtype (other steps use
    `attend_cached`). MLAttention: `run(q_lat, q_pe, cache, rows, mask, scale)` over the latent cache and
    `fits(T, H, r, rope, dtype, device)` (layers/mla_attention_kernel.py)."""

    run: Callable[..., torch.Tensor]
    fits: Callable[..., bool]


def write_cache(cache: torch.Tensor, new: torch.Tensor, ctx: ForwardContext) -> None:
    """cache [Bc, S, ...] <- new [B, T, ...] at (rows[b], write_index[b, t])."""
    rows = ctx.row_index(new.shape[0])
    cache[rows[:, None], ctx.write_index] = new.to(cache.dtype)


def read_cache(cache: torch.Tensor, ctx: ForwardContext, batch: int) -> torch.Tensor:
    """The [B, kv_len, ...] prefix of the rows in use (a view when rows are 0..B-1)."""
    if ctx.rows is None:
        return cache[:batch, : ctx.kv_len]
    return cache[ctx.rows, : ctx.kv_len]


# every SDPA backend but cuDNN's (module docstring): on CUDA, `sdpa` picks among these outside `graph_build`
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_graph_build = False


@contextmanager
def graph_build() -> Iterator[None]:
    """Inside (engine.cuda_graphs' warm-up and capture of a graph), SDPA keeps every backend, cuDNN's included: its
    plan is built once, in the eager warm-up before capture (which must pick the backend the capture picks: cuDNN
    cannot allocate its workspace during a capture), and its masked attention is faster in the replays (session 8:
    a Llama-8B-shape decode through SDPA 4.67 ms with it, 6.34 ms without)."""
    global _graph_build
    prev, _graph_build = _graph_build, True
    try:
        yield
    finally:
        _graph_build = prev


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
    """`F.scaled_dot_product_attention` (heads before tokens) with this module's backend choice: eager CUDA calls
    without cuDNN (~10 us of flag setting), calls inside `graph_build()` and on the CPU as PyTorch picks."""
    if q.is_cuda and not _graph_build:
        with sdpa_kernel(SDPA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return F.scaled_dot_product_attention(q, k, v, **kw)


def _repeat_kv_heads(q: torch.Tensor) -> bool:
    """Whether `sdpa` repeats KV heads instead of asking SDPA for GQA: eager CUDA calls (see there)."""
    return q.is_cuda and not _graph_build


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, K, H_kv, D*], mask [B, T, K] bool or an additive bias [B, 1, T, K] -> [B, T, H, Dv].

    Eager CUDA calls with fewer KV heads than query heads repeat each KV head for its query heads first: of the
    backends eager calls keep (SDPA_BACKENDS), only the memory-efficient one takes a mask, and it has no GQA, so
    `enable_gqa` with a mask fell to the math backend (float32 score matrices, the mask added as a bias, a softmax
    kernel): a regeneration admission's eager prefill of 60 ShareGPT prompts (7.9K tokens) spent 205 of its 229 ms
    there on the H200 (session 40, `benchmarks/admission_prefill_trace.py`). Inside `graph_build()` cuDNN takes GQA
    with a mask; the CPU keeps PyTorch's choice."""
    gqa = q.shape[2] != k.shape[2]
    if gqa and _repeat_kv_heads(q):
        g = q.shape[2] // k.shape[2]  # query head h reads KV head h // g
        k, v, gqa = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2), False
    out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask[:, None] if mask.dim() == 3 else mask, scale=scale,
                                       enable_gqa=gqa)
    return out.transpose(1, 2)


def _is_causal_fast(q: torch.Tensor) -> bool:
    """Whether a causal forward (`ForwardContext.causal`) runs SDPA with is_causal instead of its mask: everywhere
    (a seam that tests and benchmarks turn off). On CUDA that takes the flash kernel (GQA included) instead of the
    memory-efficient one reading a [B, 1, T, T] mask: a training-features forward of 8 x 1,024 tokens (SmolLM2, H200)
    spent 7.9 ms of its 18 ms of kernels in the masked attention (session 40, `benchmarks/features_attention_check.py`).
    On the CPU (2 cores, torch 2.13, session 52) is_causal skips the masked half: SmolLM2's attention shape (9 query,
    3 KV heads of 64) over 2,000 / 4,000 tokens 67.7 -> 37.1 / 261.9 -> 130.0 ms a layer, bit-identical outputs."""
    return True


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, T, H_kv, D*] -> [B, T, H, Dv]: query t sees keys 0..t (SDPA's is_causal)."""
    out = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


# query tokens per block of `sdpa_written_out` (its float32 scores: H x 256 x K a block and row)
WRITTEN_OUT_QUERY_BLOCK = 256


def sdpa_written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None,
               sinks: torch.Tensor | None, softcap: float | None = None) -> torch.Tensor:
    """Attention that SDPA has no term for, written out: q [B, T, H, D], k/v [B, K, H_kv, D], mask [B, T, K] bool
    -> [B, T, H, D]. `sinks` [H]: a learned sink logit per head (gpt-oss): each head's softmax runs over its visible
    scores and the sink, whose share of the probability goes nowhere (no value): out = softmax([s, sink])[:K] @ v.
    `softcap`: the scores soft-capped, s <- softcap * tanh(s / softcap), before the mask (Gemma 2). Scores and softmax
    in float32, over blocks of WRITTEN_OUT_QUERY_BLOCK query tokens."""
    B, T, H, D = q.shape
    g = H // k.shape[2]
    kh = k.transpose(1, 2).repeat_interleave(g, 1).float()  # [B, H, K, D]
    vh = v.transpose(1, 2).repeat_interleave(g, 1)
    out = []
    for t0 in range(0, T, WRITTEN_OUT_QUERY_BLOCK):
        qh = q[:, t0 : t0 + WRITTEN_OUT_QUERY_BLOCK].transpose(1, 2).float()  # [B, H, t, D]
        s = (qh @ kh.transpose(-1, -2)) * (scale if scale is not None else D**-0.5)  # [B, H, t, K]
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        s = s.masked_fill(~mask[:, None, t0 : t0 + WRITTEN_OUT_QUERY_BLOCK], float("-inf"))
        if sinks is None:
            p = torch.softmax(s, -1)
        else:
            s = torch.cat((s, sinks.float()[None, :, None, None].expand(B, H, s.shape[2], 1)), -1)
            p = torch.softmax(s - s.amax(-1, keepdim=True), -1)[..., :-1]
        out.append((p.to(vh.dtype) @ vh).transpose(1, 2))  # [B, t, H, D]
    return torch.cat(out, 1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: ForwardContext,
    cache: Sequence[torch.Tensor] | None,
    scale: float | None = None,
    window: int | Chunk | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """q [B, T, H, D], k/v [B, T, H_kv, D] (RoPE applied) -> [B, T, H, Dv]. `window`: a sliding-window layer's
    (`ForwardContext.mask`); `sinks` [H]: the heads' sink logits, `softcap`: the scores' soft cap
    (`sdpa_written_out`)."""
    assert ctx.attn_mask is not None
    if ctx.write_index is None or cache is None:
        if sinks is not None or softcap is not None:
            return sdpa_written_out(q, k, v, ctx.mask(window), scale, sinks, softcap)
        if ctx.causal and window is None and _is_causal_fast(q):
            return sdpa_causal(q, k, v, scale)
        return sdpa(q, k, v, ctx.mask(window), scale)
    k_cache, v_cache = cache
    write_cache(k_cache, k, ctx)
    write_cache(v_cache, v, ctx)
    return attend_cached(q, ctx, cache, scale, window, sinks, softcap)


def attend_cached(q: torch.Tensor, ctx: ForwardContext, cache: Sequence[torch.Tensor],
                  scale: float | None = None, window: int | Chunk | None = None,
                  sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Attention of q [B, T, H, D] over the cache prefix [0, kv_len) whose new entries are already written."""
    k_cache, v_cache = cache
    B = q.shape[0]
    kk = read_cache(k_cache, ctx, B).to(q.dtype)
    vv = read_cache(v_cache, ctx, B).to(q.dtype)
    if sinks is not None or softcap is not None:
        return sdpa_written_out(q, kk, vv, ctx.mask(window), scale, sinks, softcap)
    if ctx.causal and window is None and _is_causal_fast(q):  # the prefix read is this forward's own keys
        return sdpa_causal(q, kk, vv, scale)
    return sdpa(q, kk, vv, ctx.attn_bias(q.dtype, window), scale)


class GQAAttention(nn.Module):
    """Llama-style attention: q/k/v/o projections (checkpoint names kept), RoPE on halves, GQA.

    `in_features` may differ from the model width: the EAGLE-3 drafter feeds 2H (embedding and hidden) into q/k/v.
    `window`: a sliding-window layer's window (set by the model from `ModelConfig.window_of`) or a chunked layer's
    `Chunk` (Llama 4), None for full attention; `temperature` = (floor_scale, attn_scale, offset): each query scaled
    by 1 + attn_scale * log(1 + floor((position + offset) / floor_scale)) (`tempered`: Llama 4's NoPE layers, offset
    1; every layer of Ministral 3, offset 0); `scale`: the
    softmax scale (None: 1 / sqrt(head_dim)); a `sinks` parameter [H], where a subclass registers one
    (gpt-oss), adds per-head sink logits (`sdpa_written_out`, or the short-query kernel's); `rope_store_ok`: whether
    engine.transforms may give it the fused RoPE + KV-store kernel (and with it the short-query attention kernel),
    which applies `head_norms()` with Llama's RMSNorm roundings (False for an attention whose norms are not Llama's).
    """

    window: int | Chunk | None = None
    nope = False  # a NoPE layer (SmolLM3's): the model hands it the identity rotation
    scale: float | None = None
    softcap: float | None = None  # Gemma 2's attn_logit_softcapping (`sdpa_written_out`, or the short-query kernel)
    temperature: tuple[float, float, float] | None = None  # (floor_scale, attn_scale, offset): Llama 4, Ministral 3
    rope_store_ok = True
    # each query row's output the same bits in any forward (layers/row_attention.py): set on the 4-bit CPU path's
    # target (engine/int4_weights.py)
    row_invariant = False

    def __init__(
        self,
        in_features: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool = False,
        o_bias: bool | None = None,
    ) -> None:
        """`bias`: q/k/v (and, unless `o_bias` says otherwise, o_proj) have biases (Llama's attention_bias; Qwen2
        has them on q/k/v only)."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(in_features, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(in_features, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(in_features, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias if o_bias is None else o_bias)
        self.rope = apply_rotary  # engine.transforms may swap in a compiled version
        self.rope_store = None  # engine.transforms may set the fused RoPE + KV-store kernel (fused q/k/v only;
        #                         it applies `head_norms()` before RoPE)
        # and, with it, the short-query attention kernels (layers/short_attention_kernel.py) for the steps they fit
        self.attn_kernel: AttentionKernel | None = None

    def head_norms(self) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """Per-head (q weight, k weight, eps) RMSNorms between the projection and RoPE: none here."""
        return None

    def tempered(self, q: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """q [B, T, H, D] scaled by its position's temperature where the layer has one (`temperature`), else q: in
        float32, rounded to q's dtype, as transformers' Llama 4 (the factor, [B, T, 1, 1], built once a forward)."""
        if self.temperature is None:
            return q
        key = ("temperature", self.temperature)
        if key not in ctx._memo:
            floor_scale, attn_scale, offset = self.temperature
            ctx._memo[key] = (torch.log1p(torch.floor((ctx.positions.float() + offset) / floor_scale)) * attn_scale
                              + 1.0)[..., None, None]
        return (q * ctx._memo[key]).to(q.dtype)

    def _attend(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, ctx: ForwardContext,
                cache: Sequence[torch.Tensor] | None) -> torch.Tensor:
        """`attend` (k / v None: `attend_cached`, this step's keys already in the cache) with this layer's query
        temperature, scale, window, sinks and soft cap."""
        q = self.tempered(q, ctx)
        extra = (self.scale, self.window, self._parameters.get("sinks"), self.softcap)
        if self.row_invariant and takes_rows(ctx, cache, q.shape[1]):  # decode and verify steps: row by row
            if k is not None:
                write_cache(cache[0], k, ctx)
                write_cache(cache[1], v, ctx)
            return attend_rows(q, ctx, cache, *extra)
        if k is None:
            assert cache is not None
            return attend_cached(q, ctx, cache, *extra)
        return attend(q, k, v, ctx, cache, *extra)

    def fuse_qkv(self) -> None:
        """Replace q/k/v_proj by one `qkv_proj` (rows: q, then k, then v). Checkpoint names are lost: inference only."""
        fused = fused_linear(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj
        self.qkv_proj = fused

    def kv_shapes(self) -> list[tuple[int, ...]]:
        return [(self.num_kv_heads, self.head_dim), (self.num_kv_heads, self.head_dim)]

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: ForwardContext,
        cache: Sequence[torch.Tensor] | None,
    ) -> torch.Tensor:
        if hasattr(self, "qkv_proj"):  # fused by engine.transforms (one GEMM, one RoPE launch)
            return self.attend_qkv(self.qkv_proj(x), cos, sin, ctx, cache)
        B, T, _ = x.shape
        H, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.rope(self.q_proj(x).view(B, T, H, Dh), cos, sin)
        k = self.rope(self.k_proj(x).view(B, T, Hkv, Dh), cos, sin)
        v = self.v_proj(x).view(B, T, Hkv, Dh)
        out = self._attend(q, k, v, ctx, cache)  # [B, T, H, D]
        return self.o_proj(out.reshape(B, T, H * Dh))

    def attend_qkv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext,
                   cache: Sequence[torch.Tensor] | None) -> torch.Tensor:
        """The rest of a fused-projection forward from qkv [B, T, (H + 2 Hkv) * D] (the pre-norm layer may have
        computed it together with the norm: layers/norm_linear_kernel.py) -> [B, T, hidden]."""
        return self.o_proj(self.attend_heads(qkv, cos, sin, ctx, cache))

    def _stores_by_kernel(self, ctx: ForwardContext, cache: Sequence[torch.Tensor] | None) -> bool:
        """Whether this step's RoPE and KV-cache writes go through the fused `rope_store` kernel."""
        return self.rope_store is not None and cache is not None and ctx.write_index is not None

    def attend_heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext,
                     cache: Sequence[torch.Tensor] | None,
                     norm_of: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """`attend_qkv` without o_proj: qkv [B, T, (H + 2 Hkv) * D] -> the heads' outputs [B, T, H * D].
        `norm_of=(h, eps)`: qkv is h's projection through weights with the input norm's weight folded in
        (engine.transforms.fold_norms), so q, k and v are first scaled by h's RMSNorm scale (rms_scaled)."""
        B, T, _ = qkv.shape
        H, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = qkv.view(B, T, H + 2 * Hkv, Dh)
        if self._stores_by_kernel(ctx, cache):
            # one kernel: (the norm's scale,) RoPE on q and k, k and v into the cache
            q = self.rope_store(qkv, cos, sin, cache[0], cache[1], ctx.row_index(B), ctx.write_index, H, Hkv,
                                norm_of=norm_of, head_norms=self.head_norms())
            k_cache = cache[0]
            if (self.attn_kernel is not None and k_cache.dtype == q.dtype
                    and self.attn_kernel.fits(B, T, H, Hkv, Dh, q.dtype)):
                out = self.attn_kernel.run(self.tempered(q, ctx), k_cache, cache[1], ctx.row_index(B),
                                           ctx.mask(self.window), self.scale, sinks=self._parameters.get("sinks"),
                                           softcap=self.softcap)
            else:
                out = self._attend(q, None, None, ctx, cache)
            return out.reshape(B, T, H * Dh)
        if norm_of is not None:
            qkv = rms_scaled(qkv, *norm_of).to(qkv.dtype)
        qk = self.rope(qkv[:, :, : H + Hkv], cos, sin)
        out = self._attend(qk[:, :, :H], qk[:, :, H:], qkv[:, :, H + Hkv :], ctx, cache)
        return out.reshape(B, T, H * Dh)


class QKNormAttention(GQAAttention):
    """Qwen3's attention: GQAAttention with an RMSNorm over each head's q and k (`q_norm`, `k_norm`: [head_dim]
    weights, checkpoint names kept) between the projection and RoPE. The fused RoPE + KV-store kernel applies them
    (`head_norms`; the short-query attention kernel comes with it); without it `attend_heads` does."""

    def __init__(self, in_features: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 eps: float, bias: bool = False, o_bias: bool | None = None) -> None:
        super().__init__(in_features, hidden_size, num_heads, num_kv_heads, head_dim, bias, o_bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def head_norms(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        assert self.q_norm.eps == self.k_norm.eps
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext,
                cache: Sequence[torch.Tensor] | None) -> torch.Tensor:
        if hasattr(self, "qkv_proj"):
            return self.attend_qkv(self.qkv_proj(x), cos, sin, ctx, cache)
        B, T, _ = x.shape
        H, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.rope(self.q_norm(self.q_proj(x).view(B, T, H, Dh)), cos, sin)
        k = self.rope(self.k_norm(self.k_proj(x).view(B, T, Hkv, Dh)), cos, sin)
        v = self.v_proj(x).view(B, T, Hkv, Dh)
        return self.o_proj(self._attend(q, k, v, ctx, cache).reshape(B, T, H * Dh))

    def attend_heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: ForwardContext,
                     cache: Sequence[torch.Tensor] | None,
                     norm_of: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """qkv [B, T, (H + 2 Hkv) * D] -> [B, T, H * D]: (the folded input norm's scale,) q and k normed per head,
        RoPE, attention."""
        if self._stores_by_kernel(ctx, cache):
            return super().attend_heads(qkv, cos, sin, ctx, cache, norm_of)  # the kernel applies `head_norms()`
        B, T, _ = qkv.shape
        H, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = qkv.view(B, T, H + 2 * Hkv, Dh)
        if norm_of is not None:
            qkv = rms_scaled(qkv, *norm_of).to(qkv.dtype)
        q = self.rope(self.q_norm(qkv[:, :, :H].contiguous()), cos, sin)
        k = self.rope(self.k_norm(qkv[:, :, H : H + Hkv].contiguous()), cos, sin)
        out = self._attend(q, k, qkv[:, :, H + Hkv :], ctx, cache)  # [B, T, H, D]
        return out.reshape(B, T, H * Dh)
