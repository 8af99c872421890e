"""DeepSeek multi-head latent attention (MLA) over a latent-only KV cache.

Contract (REFERENCE.md §6):

- Checkpoint names: `q_a_proj`, `q_a_layernorm`, `q_b_proj` (or `q_proj` when `q_lora_rank` is None),
  `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`.
- The cache keeps only the compressed latent: one tensor per layer, `[Bc, S_max, kv_lora_rank + qk_rope_head_dim]`
  (`kv_shapes()`), holding the normalised latent `c` followed by the rope'd shared key `k_pe`. Writes and reads use
  the layout and helpers of `attention.py` (write at `ctx.write_index` of rows `ctx.rows`, read `[0, ctx.kv_len)`,
  dense mask `ctx.attn_mask [B, T, kv_len]`). Without a cache (`ctx.write_index is None`) the tokens attend among
  themselves under the `[B, T, T]` mask.
- Softmax scale `(qk_nope + qk_rope)^-0.5 * yarn_softmax_mscale(rope)`, at every length.
- RoPE on `q_pe` / `k_pe` rotates adjacent pairs (`interleaved=True`, DeepSeek's layout and transformers'
  `rope_interleave=True` default) or halves. Transformers de-interleaves its output while we keep the pairs in place;
  q and k share the layout, so the scores are the same.

Two attention paths, numerically equal up to rounding:

- plain: expand every visible latent through `kv_b_proj` into per-head `k_nope` and `v`, then SDPA with
  head dim nope + rope (values v_head_dim);
- absorbed: fold `W_UK` (the k_nope rows of `kv_b_proj`) into the query and `W_UV` (its v rows) into the output,
  and attend over the cache itself as one shared KV head: keys `[c, k_pe]`, values `c`.

On CUDA (`engine.transforms.use_mla_kernel`) the absorbed path of a step with a cache runs its attention as
layers/mla_attention_kernel.py's Triton kernels straight over the cache (`attn_kernel`), for the steps they fit;
the W_UK / W_UV products stay PyTorch's.

Choice (`absorb`: None = auto, True, False). The two paths cost the same attention over kv_len keys except that plain
pays `kv_len * r * H * (nope + v)` to expand the latents while absorbed pays `T * kv_len * H * (2r - nope - v)` for its
wider dot products (r = kv_lora_rank); both scale with kv_len, so absorbed wins exactly when
`T < r (nope + v) / (2r - nope - v)` (170 tokens for DeepSeek-V3 / Kimi-K2.5). Auto therefore picks absorbed for
decode, tree verification and drafting (T small) and plain for long prefills; the branch depends only on T, so it is
fixed per CUDA-graph bucket.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..config import MLAConfig, RopeConfig
from .attention import AttentionKernel, read_cache, sdpa, write_cache
from .context import ForwardContext
from .norm import RMSNorm
from .rotary import apply_rotary, yarn_softmax_mscale


class MLAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mla: MLAConfig,
        rope: RopeConfig,
        bias: bool = False,
        interleaved: bool = True,
        latent_eps: float = 1e-6,  # DeepSeek's reference and transformers build the latent norms with the default eps
        absorb: bool | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_lora_rank = mla.q_lora_rank
        self.kv_lora_rank = mla.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.qk_dim = self.nope_dim + self.rope_dim
        self.interleaved = interleaved
        self.absorb = absorb
        self.scale = self.qk_dim**-0.5 * yarn_softmax_mscale(rope)
        r, H = self.kv_lora_rank, num_heads
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden_size, H * self.qk_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden_size, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, latent_eps)
            self.q_b_proj = nn.Linear(self.q_lora_rank, H * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, r + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(r, latent_eps)
        self.kv_b_proj = nn.Linear(r, H * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(H * self.v_dim, hidden_size, bias=bias)
        extra = 2 * r - self.nope_dim - self.v_dim
        self.absorb_below = math.inf if extra <= 0 else r * (self.nope_dim + self.v_dim) / extra
        self.rope = apply_rotary  # engine.transforms may swap in a compiled version (one fused kernel on CUDA)
        # the absorbed attention over the cache itself (layers/mla_attention_kernel.py) for the steps it fits; None:
        # the eager paths (set by engine.transforms)
        self.attn_kernel: AttentionKernel | None = None

    def kv_shapes(self) -> list[tuple[int, ...]]:
        return [(self.kv_lora_rank + self.rope_dim,)]

    def use_absorbed(self, num_tokens: int) -> bool:
        return self.absorb if self.absorb is not None else num_tokens < self.absorb_below

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        ctx: ForwardContext,
        cache: Sequence[torch.Tensor] | None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        H, r = self.num_heads, self.kv_lora_rank
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, self.qk_dim)
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)  # [B, T, H, nope], [B, T, H, rope]
        q_pe = self.rope(q_pe, cos, sin, self.interleaved)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([r, self.rope_dim], dim=-1)  # [B, T, r], [B, T, rope]
        k_pe = self.rope(k_pe[:, :, None], cos, sin, self.interleaved)[:, :, 0]
        latent = torch.cat([self.kv_a_layernorm(c), k_pe], dim=-1)  # [B, T, r + rope]: one cache entry per token
        assert ctx.attn_mask is not None
        if ctx.write_index is not None and cache is not None:
            (kv_cache,) = cache
            write_cache(kv_cache, latent, ctx)
            if self._by_kernel(T, kv_cache, q_pe):
                assert self.attn_kernel is not None
                w_uk, w_uv = self._absorbed_weights()
                q_lat = torch.einsum("bthn,hnr->bthr", q_nope, w_uk.to(q_nope.dtype))  # [B, T, H, r]
                o_lat = self.attn_kernel.run(q_lat, q_pe, kv_cache, ctx.row_index(B), ctx.attn_mask, self.scale)
                out = torch.einsum("bthr,hvr->bthv", o_lat, w_uv.to(o_lat.dtype))
                return self.o_proj(out.reshape(B, T, H * self.v_dim))
            latent = read_cache(kv_cache, ctx, B).to(x.dtype)  # [B, kv_len, r + rope]
        if self.use_absorbed(T):
            out = self._absorbed(q_nope, q_pe, latent, ctx.attn_mask)
        else:
            out = self._plain(q_nope, q_pe, latent, ctx.attn_mask)
        return self.o_proj(out.reshape(B, T, H * self.v_dim))

    def _by_kernel(self, T: int, kv_cache: torch.Tensor, q_pe: torch.Tensor) -> bool:
        """Whether this step's absorbed attention runs as `attn_kernel` over the cache (the cache in q's dtype)."""
        return (self.attn_kernel is not None and self.use_absorbed(T) and kv_cache.dtype == q_pe.dtype
                and self.attn_kernel.fits(T, self.num_heads, self.kv_lora_rank, self.rope_dim, q_pe.dtype,
                                          q_pe.device))

    def _absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, nope, r], W_UV [H, v, r]): views of `kv_b_proj`'s k_nope and v rows."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        return w[:, : self.nope_dim], w[:, self.nope_dim :]

    def _plain(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Expand the latents into per-head keys and values: -> [B, T, H, v]."""
        B, K, _ = latent.shape
        H, r = self.num_heads, self.kv_lora_rank
        c, k_pe = latent.split([r, self.rope_dim], dim=-1)
        kv = self.kv_b_proj(c).view(B, K, H, self.nope_dim + self.v_dim)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe[:, :, None].expand(B, K, H, self.rope_dim)], dim=-1)  # [B, K, H, nope + rope]
        q = torch.cat([q_nope, q_pe], dim=-1)
        return sdpa(q, k, v, mask, self.scale)

    def _absorbed(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attend over the latent cache directly (one shared KV head): -> [B, T, H, v]."""
        r = self.kv_lora_rank
        w_uk, w_uv = self._absorbed_weights()  # [H, nope, r], [H, v, r]
        q_lat = torch.einsum("bthn,hnr->bthr", q_nope, w_uk.to(q_nope.dtype))  # q_nope.k_nope == q_lat.c
        q = torch.cat([q_lat, q_pe], dim=-1)  # [B, T, H, r + rope]
        k = latent[:, :, None]  # [B, K, 1, r + rope]: the cache entry is the key
        v = latent[:, :, None, :r]  # [B, K, 1, r]: and its latent part the value
        o_lat = sdpa(q, k, v, mask, self.scale)  # [B, T, H, r]
        return torch.einsum("bthr,hvr->bthv", o_lat, w_uv.to(o_lat.dtype))
