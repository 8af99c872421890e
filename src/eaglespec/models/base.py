"""The decoder-only skeleton shared by every target architecture, with the EAGLE-3 target protocol built in.

A concrete model (llama.py, deepseek_v3.py) builds `self.model.embed_tokens`, `self.model.layers` (pre-norm decoder
layers, `PreNormDecoderLayer`, or layers with the same call), `self.model.norm`, `self.model.rotary` (and
`self.model.rotary_local`, the sliding-window layers' RoPE, where it differs: Gemma 3) and `self.lm_head`; this class
runs them, captures the aux states and implements the protocol (REFERENCE.md §2, names as in SGLang):

- `get_embed_and_head()` -> the live (embed_tokens.weight, lm_head.weight), not copies;
- `set_embed_and_head(embed, head)` replaces both;
- `set_eagle3_layers_to_capture(ids)`: from then on `forward` also returns `aux_hidden`, the outputs (residual stream,
  before the final norm) of the 0-based layers `ids`, concatenated in that order on the last dim: [B, T, len(ids)*H].
  `None` turns capture off. This is the SGLang convention; the engine maps the vLLM one (id k = after k layers) onto it.

`LanguageModelWrapper` is a multimodal wrapper's forward over its `language_model` (Kimi-K2.5, Mistral Small 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..config import ModelConfig
from ..layers.context import ForwardContext, gather_rows
from ..layers import norm_linear_kernel as nlk
from ..layers.norm_linear_kernel import add_norm_linear, embed_norm_linear
from ..layers.norm_silu_kernel import norm_silu_mul
from ..protocol import delegate_eagle3


# Which steps read the embedding's rows inside the first layer's kernel (`PreNormDecoderLayer.fuses_embedding`):
# EMBED_FOLD_MIN_ROWS to EMBED_FOLD_MAX_ROWS rows (and under norm_linear_kernel.DOT_MIN_ROWS: the CUDA-core kernel
# reads them), and only forwards that capture aux states unless EMBED_FOLD_PLAIN. Measured on an H100 (session 64,
# random SmolLM2 weights): a chain's 4-token verify gained, while a one-row plain decode graph without the
# embedding's kernel replayed ~50 us slower by CUDA events over the same kernel span (session 65: GPU time, when a
# replay follows another; not located); plain decode graphs of 2-4 rows and 5-row verifies (the row grid's since
# session 65) were not measured with it. benchmarks/with_setting.py can set these for a probe.
EMBED_FOLD_MIN_ROWS = 2
EMBED_FOLD_MAX_ROWS = 4
EMBED_FOLD_PLAIN = False


class PreNormDecoderLayer(nn.Module):
    """h -> h + attn(norm(h)) -> (that) + mlp(norm(that)); subclasses build the four modules.

    The residual stream travels as (h, delta) with the layer's output = h + delta: the last add of a layer is fused with
    the next layer's first norm (`RMSNorm.add_forward`), one kernel instead of two. delta None: h is the output (the
    first layer's input, and every output of `_forward_folded`).
    """

    input_layernorm: nn.Module
    self_attn: nn.Module
    post_attention_layernorm: nn.Module
    mlp: nn.Module
    # engine.transforms may set the fused add + RMSNorm + projection kernel (layers/norm_linear_kernel.py) for
    # layers with a fused q/k/v projection and a fused gate/up SiLU MLP; used for steps of <= norm_linear_rows rows
    norm_linear = None
    norm_linear_rows = 0
    # engine.transforms.fold_norms may fold both norms' weights into q/k/v and gate/up (the weights become ones);
    # longer steps then take `_forward_folded`
    folded_norms = False
    # engine.int4_step may set the 4-bit CPU path's step (numba kernels between the 4-bit products): it runs the
    # decode and verify forwards it takes and returns None for the others, which take the module path
    cpu_step = None

    def forward(self, h, delta, cos, sin, ctx: ForwardContext, cache, keep_input: bool = False,
                embed_ids: torch.Tensor | None = None) -> tuple:
        """-> (h, delta), the layer's output h + delta; keep_input (delta given): (h, delta, s) with s = the input
        h + delta, the previous layer's output, which the layer's first add computes anyway (an aux state captured
        without an add kernel of its own; s is never updated in place). embed_ids [B, T] (a first layer on its
        fused path, `fuses_embedding`): h is the embedding table and the input its rows embed_ids, gathered by the
        first kernel."""
        if embed_ids is not None:
            return self._forward_fused(h, None, cos, sin, ctx, cache, embed_ids=embed_ids)
        if self.cpu_step is not None:
            out = self.cpu_step(self, h, delta, cos, sin, ctx, cache, keep_input)
            if out is not None:
                return out
        if self.fused_for(h.shape[0] * h.shape[1]):
            return self._forward_fused(h, delta, cos, sin, ctx, cache, keep_input)
        if self.folded_norms:
            if keep_input:  # the folded path updates its input sum in place: hand it a copy
                s = h + delta
                return (*self._forward_folded(s.clone(), None, cos, sin, ctx, cache), s)
            return self._forward_folded(h, delta, cos, sin, ctx, cache)
        if delta is None:
            x = self.input_layernorm(h)
        else:
            h, x = self.input_layernorm.add_forward(h, delta)
        s = h
        h, x = self.post_attention_layernorm.add_forward(h, self.self_attn(x, cos, sin, ctx, cache))
        return (h, self.mlp(x), s) if keep_input else (h, self.mlp(x))

    def fused_for(self, rows: int) -> bool:
        """Whether a step of `rows` rows takes the fused kernels (`_forward_fused`)."""
        return self.norm_linear is not None and rows <= self.norm_linear_rows

    def fuses_embedding(self, rows: int) -> bool:
        """Whether the first kernel of a step of `rows` rows gathers the embedding's rows itself (`embed_ids`, in
        capturing forwards unless EMBED_FOLD_PLAIN: DecoderOnlyLM.forward): the fused path's CUDA-core kernel,
        EMBED_FOLD_MIN_ROWS (2) to EMBED_FOLD_MAX_ROWS (4) rows, as measured. One-row steps keep the embedding's
        kernel: on an H100 (session 64) the plain decode graph without it replayed in 0.475-0.481 ms against
        0.429-0.430 by CUDA events, with the same kernel span (423 against 425 us), while a chain's 4-token verify
        gained (0.536 -> 0.527 ms with the aux states' adds gone too)."""
        return (self.fused_for(rows) and self.norm_linear is add_norm_linear
                and EMBED_FOLD_MIN_ROWS <= rows <= EMBED_FOLD_MAX_ROWS and rows < nlk.DOT_MIN_ROWS)

    def _forward_fused(self, h, delta, cos, sin, ctx: ForwardContext, cache, keep_input: bool = False,
                       embed_ids: torch.Tensor | None = None) -> tuple:
        """The same layer in 6 kernels for a few rows: (add, norm, q/k/v), RoPE + KV store, attention, o_proj,
        (add, norm, gate/up, SiLU gating), down_proj."""
        fn, attn, mlp = self.norm_linear, self.self_attn, self.mlp
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        if embed_ids is not None:  # h: the embedding table
            s, qkv = embed_norm_linear(h, embed_ids, n1.weight, n1.eps, attn.qkv_proj.weight)
        else:
            s, qkv = fn(h, delta, n1.weight, n1.eps, attn.qkv_proj.weight, False)
        h, act = fn(s, attn.attend_qkv(qkv, cos, sin, ctx, cache), n2.weight, n2.eps, mlp.gate_up_proj.weight, True)
        return (h, mlp.down_proj(act), s) if keep_input else (h, mlp.down_proj(act))

    def _forward_folded(self, h, delta, cos, sin, ctx: ForwardContext, cache) -> tuple[torch.Tensor, None]:
        """The same layer in 7 kernels when its projections are GEMMs that take no prologue (cuBLAS, past the fused
        kernel's rows): with the norms' weights folded into q/k/v and gate/up, each norm is left as a per-row scale of
        the projection's output, applied by the kernel after it (RoPE + KV store; SiLU gating), and the residual adds
        ride on o_proj's and down_proj's GEMMs (addmm). The module path's two add + norm kernels are gone. Returns
        the layer's output with delta None (the residual stream is whole). With delta None the layer updates h in
        place and returns it: `DecoderOnlyLM.forward` hands layers only tensors it owns (the embedding's output, a
        copy of inputs_embeds, layer outputs it did not keep: captured aux states are copies)."""
        attn, mlp = self.self_attn, self.mlp
        if delta is not None:
            h = h + delta
        B, T, K = h.shape
        h2 = h.view(B * T, K)  # updated in place: an out-of-place addmm copies h into its output first (a memcpy)
        heads = attn.attend_heads(attn.qkv_proj(h), cos, sin, ctx, cache, norm_of=(h, self.input_layernorm.eps))
        h2.addmm_(heads.reshape(B * T, -1), attn.o_proj.weight.t())
        act = norm_silu_mul(mlp.gate_up_proj(h), h, self.post_attention_layernorm.eps)
        h2.addmm_(act.reshape(B * T, -1), mlp.down_proj.weight.t())
        return h, None


def set_windows(layers: nn.ModuleList, cfg: ModelConfig) -> None:
    """Give each layer's attention its sliding window (`ModelConfig.window_of`; None: full attention) and, for a NoPE
    layer (`ModelConfig.uses_rope` false), `nope` (DecoderOnlyLM.forward hands it cos 1, sin 0)."""
    for i, layer in enumerate(layers):
        layer.self_attn.window = cfg.window_of(i)
        layer.self_attn.nope = not cfg.uses_rope(i)


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, R, V] at ctx.logits_index (R = T when it is None)
    aux_hidden: torch.Tensor | None = None  # [B, T, n_aux * H] when capture is on


class DecoderOnlyLM(nn.Module):
    config: ModelConfig
    model: nn.Module
    lm_head: nn.Module
    final_logit_softcap: float | None = None  # logits <- cap * tanh(logits / cap) (Gemma 2's 30)
    logits_divisor = 1.0  # logits <- logits / it (Granite's logits_scaling)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self._capture_after: tuple[int, ...] = ()  # capture after this many layers (id i -> i + 1)

    # --- EAGLE-3 target protocol -------------------------------------------------------------------------------
    def get_embed_and_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.embed_tokens.weight, self.lm_head.weight

    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        del self.model.embed_tokens.weight
        del self.lm_head.weight
        self.model.embed_tokens.weight = embed if isinstance(embed, nn.Parameter) else nn.Parameter(embed, False)
        self.lm_head.weight = head if isinstance(head, nn.Parameter) else nn.Parameter(head, False)

    def set_eagle3_layers_to_capture(self, layer_ids: Sequence[int] | None) -> None:
        n = self.config.num_hidden_layers
        if layer_ids is None:
            self._capture_after = ()
            return
        for i in layer_ids:
            if not -1 <= int(i) < n:
                raise ValueError(f"aux layer id {i} is outside the target's {n} layers")
        self._capture_after = tuple(int(i) + 1 for i in layer_ids)

    # --- engine interface -----------------------------------------------------------------------------------------
    def kv_cache_shapes(self) -> list[tuple[int, ...]]:
        """Per-token trailing shapes of one layer's cache tensors (the same for every layer)."""
        return self.model.layers[0].self_attn.kv_shapes()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        ctx: ForwardContext,
        inputs_embeds: torch.Tensor | None = None,
    ) -> ModelOutput:
        layers = self.model.layers
        capture = self._capture_after
        embed = self.model.embed_tokens
        # a plain embedding's rows gathered by the first layer's first kernel (one PyTorch kernel fewer a step), in
        # forwards that capture aux states (a speculative engine's verify steps), not the embedding's output
        # (EMBED_FOLD_MIN_ROWS, EMBED_FOLD_PLAIN: the measured policy)
        embed_ids = input_ids if (inputs_embeds is None and (capture or EMBED_FOLD_PLAIN) and 0 not in capture
                                  and type(embed) is nn.Embedding and isinstance(layers[0], PreNormDecoderLayer)
                                  and layers[0].fuses_embedding(input_ids.numel())) else None
        # [B, T, H]; layers may update h in place (PreNormDecoderLayer._forward_folded): never the caller's tensor
        h = (embed.weight if embed_ids is not None else embed(input_ids) if inputs_embeds is None
             else inputs_embeds.clone(memory_format=torch.contiguous_format))
        cos, sin = self.model.rotary(ctx.positions)
        # the sliding-window layers' own RoPE, where the model has one (Gemma 3's local base frequency)
        local_rotary = getattr(self.model, "rotary_local", None)
        local = local_rotary(ctx.positions) if local_rotary is not None else (cos, sin)
        # NoPE layers (SmolLM3's): the identity rotation, so that every RoPE path (kernels included) leaves q / k be
        identity = (torch.ones_like(cos), torch.zeros_like(sin)) if self.config.rope_layers else (cos, sin)
        aux: dict[int, torch.Tensor | None] = {}  # None: to be taken from the next layer (keep_input)
        if 0 in capture:
            aux[0] = h.clone()
        delta = None  # the residual stream is h + delta (see PreNormDecoderLayer)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            layer_cos, layer_sin = (identity if getattr(attn, "nope", False) else
                                    local if getattr(attn, "window", None) else (cos, sin))
            cache = ctx.kv[i] if ctx.kv is not None else None
            if i == 0 and embed_ids is not None:
                h, delta = layer(h, None, layer_cos, layer_sin, ctx, cache, embed_ids=embed_ids)
            elif i in aux and aux[i] is None:  # the previous layer's output, as this layer's first add computes it
                h, delta, aux[i] = layer(h, delta, layer_cos, layer_sin, ctx, cache, keep_input=True)
            else:
                h, delta = layer(h, delta, layer_cos, layer_sin, ctx, cache)
            if i + 1 in capture:  # a copy when delta is None: the next layer may update h in place
                # (written straight into slices of one tensor instead, the adds take PyTorch's strided path: 2.9
                # against 1.5 us each on an H100, more than the concatenation saves; session 63)
                if delta is not None and i + 1 < len(layers) and isinstance(layers[i + 1], PreNormDecoderLayer):
                    aux[i + 1] = None  # taken from the next layer (keep_input): one add kernel fewer
                else:
                    aux[i + 1] = h.clone() if delta is None else h + delta
        if ctx.logits_index is not None:
            s = h if delta is None else h + delta
            x = self.model.norm(gather_rows(s, ctx.logits_index))
        elif delta is None:
            x = self.model.norm(h)
        else:
            _, x = self.model.norm.add_forward(h, delta)
        logits = self.lm_head(x)
        if self.logits_divisor != 1.0:
            logits = logits / self.logits_divisor
        if self.final_logit_softcap is not None:
            logits = torch.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap
        aux_hidden = torch.cat([aux[k] for k in capture], dim=-1) if capture else None
        return ModelOutput(logits=logits, aux_hidden=aux_hidden)

    def reset_buffers(self) -> None:
        """Recompute non-persistent buffers after materializing from the meta device."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_buffers"):
                m.reset_buffers()


class LanguageModelWrapper(nn.Module):
    """A multimodal wrapper's text side: `forward` and `reset_buffers` run `self.language_model` (a DecoderOnlyLM)
    unchanged, so its logits and aux states come back as they are. The protocol comes by delegation in the subclass's
    body (`eagle3 = delegate_eagle3("language_model")`); kimi_k25.py and mistral3.py."""

    language_model: DecoderOnlyLM

    def forward(
        self, input_ids: torch.Tensor | None, ctx: ForwardContext, inputs_embeds: torch.Tensor | None = None
    ) -> ModelOutput:
        return self.language_model(input_ids, ctx, inputs_embeds=inputs_embeds)

    def reset_buffers(self) -> None:
        self.language_model.reset_buffers()


class VisionLanguageForText(LanguageModelWrapper):
    """A vision-language checkpoint run for text: its language model (`language_model_class` built from the config's
    `text_config`), the protocol by delegation; the vision tower and projector's weights skipped (images refused: no
    `prepare_multimodal`). Checkpoint names: the releases' `language_model.model.*` / `language_model.lm_head.*` as
    they are, transformers 5's `model.language_model.*` and `lm_head.*` renamed onto them. Mistral Small 3.x
    (mistral3.py), Gemma 3 (gemma3.py)."""

    eagle3 = delegate_eagle3("language_model")
    language_model_class: type[DecoderOnlyLM]

    checkpoint_renames: tuple[tuple[str, str], ...] = (
        (r"^model\.language_model\.", "language_model.model."),  # transformers 5's layout
        (r"^lm_head\.", "language_model.lm_head."),
    )
    checkpoint_ignore: tuple[str, ...] = (r"^(?:model\.)?(?:vision_tower|multi_modal_projector)\.",
                                          r"rotary_emb(?:_local)?\.inv_freq$")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.language_model = self.language_model_class(config)
