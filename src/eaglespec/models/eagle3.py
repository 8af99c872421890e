"""The EAGLE-3 drafter `LlamaForCausalLMEagle3`, in the published checkpoint format (REFERENCE.md §3).

One draft step, for token t at position p with incoming hidden h ([.., 3*H_target] target aux states, or [.., H] the
drafter's own previous output):

    e = embed(t);  h = fc(aux_norm(h)) if h is 3*H_target wide
    x = cat(input_layernorm(e), hidden_norm(h))            # [.., 2H]
    r = h + attn(x)                                        # RoPE at p, causal over the drafter's KV
                                                           # (norm_before_residual: hidden_norm(h) + attn(x))
    r = r + mlp(post_attention_layernorm(r))
    logits = lm_head(norm(r))                              # [.., draft_vocab]; target id = id + d2t[id]
    r is returned as the next step's hidden (pre-norm, width H, so fc is skipped there); norm(r) with norm_output

A drafter of num_hidden_layers N > 1 (vLLM's and speculators' multi-layer EAGLE-3) runs N - 1 plain Llama decoder
layers (models/llama.py, width H in, no embedding) on r before the final norm: r <- r + attn(input_layernorm(r)),
then r <- r + mlp(post_attention_layernorm(r)), each with its own KV cache (engine layer i of the drafter's cache);
the head and the next step's hidden read the last layer's output.

EAGLE-3.1 (config.Eagle3Config: norm_before_fc, fc_norm, norm_output; published EAGLE-3 checkpoints set none):
aux_norm is the identity in EAGLE-3, else one RMSNorm over the concatenated aux states (`input_norm`,
norm_before_fc) or one per aux state (`fc_norm.{i}`), and with norm_output the next step's hidden is norm(r), the
head's input, as SGLang, vLLM and TensorRT-LLM run such checkpoints. With `norm_before_residual`
(config.Eagle3Config; vLLM's and speculators' flag) the residual stream starts from hidden_norm(h), the normalised
half of x, instead of h.

On CUDA engine.transforms may route the first line (the embedding lookup, both input norms, the concatenation and
RoPE's cos/sin) through one kernel (`draft_input`, layers/draft_input_kernel.py); the layer hands back its MLP output
unsummed so that the last residual add runs inside the final norm's kernel (`RMSNorm.add_forward`, or the fused
norm + head).

Weights are unprefixed: fc, midlayer.*, layers.{1..N-1}.* (the later layers, as vLLM and speculators name them),
norm, lm_head, d2t, t2d (and input_norm or fc_norm.{i}); vLLM speculators' format names the first layer layers.0.*
(its config is read by speculators_config.py). A later layer's hidden_norm, which vLLM builds but never runs, is
ignored if a checkpoint carries it. An embed_tokens in the checkpoint
is ignored: the embedding comes from the target through `set_embed_and_head` (and the lm_head too when the checkpoint
has no draft vocabulary).
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from ..layers.attention import GQAAttention
from ..layers.context import ForwardContext, gather_rows
from ..layers.mlp import GatedMLP
from ..layers.norm import RMSNorm
from ..layers.rotary import Rotary
from .llama import LlamaDecoderLayer


class Eagle3MidLayer(nn.Module):
    # engine.transforms may set the fused add + RMSNorm + gate/up + SiLU kernel (layers/norm_linear_kernel.py) for
    # the MLP half (r = h + attn, its norm, gate/up and gating in one launch); used for steps of <= norm_linear_rows
    norm_linear = None
    norm_linear_rows = 0

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = GQAAttention(
            2 * H, H, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, bias=cfg.attention_bias
        )
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = GatedMLP(H, cfg.intermediate_size, bias=cfg.mlp_bias, act=cfg.hidden_act)
        self.norm_before_residual = cfg.eagle is not None and cfg.eagle.norm_before_residual

    def inputs(self, e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """e [B, T, H] token embeddings, h [B, T, H] incoming hidden -> x [B, T, 2H], the attention's input."""
        return torch.cat((self.input_layernorm(e), self.hidden_norm(h)), dim=-1)

    def residual(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """x [B, T, 2H] (`inputs`), h [B, T, H] -> [B, T, H], what the attention's output is added to: h, or with
        norm_before_residual hidden_norm(h), read back from x's second half (a view), so that it is the very tensor
        the attention read, whichever path built x (`inputs`, or on CUDA the draft_input kernel, which rounds as
        rms_norm does)."""
        return x[..., x.shape[-1] // 2:] if self.norm_before_residual else h

    def forward(self, x, h, cos, sin, ctx: ForwardContext, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, 2H] (`inputs`), h [B, T, H] -> (r, m), both [B, T, H]: the layer's output is r + m (r = the
        residual (`residual`: h, or hidden_norm(h)) + attention, m the MLP's output), left to the caller to add
        (module docstring)."""
        a = self.self_attn(x, cos, sin, ctx, cache)
        # the residual is chosen before either path, so the fused add + norm + gate/up kernel adds it like any h (it
        # copies a strided view such as x's second half into a contiguous [M, H] first: add_norm_linear)
        h = self.residual(x, h)
        if self.norm_linear is not None and h.shape[0] * h.shape[1] <= self.norm_linear_rows:
            n2 = self.post_attention_layernorm
            r, act = self.norm_linear(h, a, n2.weight, n2.eps, self.mlp.gate_up_proj.weight, True)
            return r, self.mlp.down_proj(act)
        r = h + a
        return r, self.mlp(self.post_attention_layernorm(r))


class LlamaForCausalLMEagle3(nn.Module):
    # engine.transforms may set the fused RMSNorm + projection kernel (layers/norm_linear_kernel.py) for the final
    # norm and the draft-vocabulary head (one launch instead of two); used for steps of <= norm_head_rows rows
    norm_head = None
    norm_head_rows = 0
    # ... and the input kernel (layers/draft_input_kernel.py): embedding, both input norms, concatenation, cos/sin
    draft_input = None
    # the 4-bit CPU path's forward through numba kernels (engine/int4_drafter.py), which `forward` tries first: it
    # returns None for forwards it does not take
    cpu_step = None
    # some exports prefix "model."; vLLM speculators' format names the decoder layer layers.0 (speculators_config.py)
    checkpoint_renames: tuple[tuple[str, str], ...] = ((r"^model\.", ""), (r"^layers\.0\.", "midlayer."))
    # verifier_*: speculators' training-time copies of the verifier's norm and head (its save leaves them out; a
    # checkpoint that kept them still loads)
    checkpoint_ignore: tuple[str, ...] = (r"^embed_tokens\.weight$", r"rotary_emb\.inv_freq$",
                                          r"^verifier_(norm|lm_head)\.weight$",
                                          r"^(model\.)?layers\.[1-9][0-9]*\.hidden_norm\.weight$")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.eagle is not None, "not an EAGLE-3 drafter config"
        self.config = config
        H, Ht = config.hidden_size, config.eagle.target_hidden_size
        self.n_aux = 3
        self.fc = nn.Linear(self.n_aux * Ht, H, bias=False)
        ec = config.eagle
        self.input_norm = RMSNorm(self.n_aux * Ht, config.rms_norm_eps) if ec.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RMSNorm(Ht, config.rms_norm_eps) for _ in range(self.n_aux)) \
            if ec.fc_norm else None
        self.norm_output = ec.norm_output
        self.midlayer = Eagle3MidLayer(config)
        # the later layers, keyed "1".."N-1" so that their parameters carry the checkpoint's names (layers.1.*)
        self.layers = nn.ModuleDict({str(i): LlamaDecoderLayer(config) for i in range(1, config.num_hidden_layers)})
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.rotary = Rotary(config.rotary_dim, config.rope)
        self.draft_vocab_size = config.eagle.draft_vocab_size or config.vocab_size
        self.has_own_head = config.eagle.draft_vocab_size is not None
        # Without a draft vocabulary the head comes from the target and d2t/t2d are trivial: all may be absent.
        self.checkpoint_optional: tuple[str, ...] = () if self.has_own_head else (r"^lm_head\.weight$", r"^d2t$",
                                                                                  r"^t2d$")
        self.lm_head = nn.Linear(H, self.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self.embed_tokens: nn.Embedding | None = None

    # --- wiring to the target -----------------------------------------------------------------------------------
    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor | None) -> None:
        """Use the target's embedding (always) and its lm_head (only when there is no draft vocabulary)."""
        self.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.embed_tokens.weight = embed if isinstance(embed, nn.Parameter) else nn.Parameter(embed, False)
        if not self.has_own_head and head is not None:
            del self.lm_head.weight
            self.lm_head.weight = head if isinstance(head, nn.Parameter) else nn.Parameter(head, False)

    def kv_cache_shapes(self) -> list[tuple[int, ...]]:
        return self.midlayer.self_attn.kv_shapes()

    @property
    def num_layers(self) -> int:
        """Decoder layers, each with its own KV cache: the first (midlayer) and the later ones."""
        return 1 + len(self.layers)

    def reset_buffers(self) -> None:
        self.rotary.reset_buffers()
        if not self.has_own_head:  # identity vocabulary map (the checkpoint may not carry one)
            self.d2t = torch.zeros(self.draft_vocab_size, dtype=torch.int64, device=self.rotary.inv_freq.device)
            self.t2d = torch.ones(self.config.vocab_size, dtype=torch.bool, device=self.rotary.inv_freq.device)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        return draft_ids + self.d2t[draft_ids]

    # --- forward ------------------------------------------------------------------------------------------------
    def project_aux(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [..., n_aux*Ht] target aux states -> [..., H]: fc after EAGLE-3.1's input norms, if any."""
        aux = aux.to(self.norm.weight.dtype)  # the drafter's dtype (fc may hold 4-bit groups: engine/int4_drafter.py)
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        elif self.fc_norm is not None:
            aux = torch.cat([n(a) for n, a in zip(self.fc_norm, aux.chunk(self.n_aux, dim=-1))], dim=-1)
        return self.fc(aux)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        ctx: ForwardContext,
        from_target: bool,
        need_logits: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """input_ids [B, T] target ids; hidden [B, T, 3*Ht] target aux states (`from_target`) or [B, T, H] the
        drafter's own outputs -> (logits [B, R, Vd] or None, next hidden [B, T, H]; with `ctx.logits_index` [B, R]
        both at those positions only: the next hidden [B, R, H], what a catch-up keeps of it)."""
        assert self.embed_tokens is not None, "call set_embed_and_head with the target's embedding first"
        if self.cpu_step is not None:
            out = self.cpu_step(self, input_ids, hidden, ctx, from_target, need_logits)
            if out is not None:
                return out
        if from_target:
            hidden = self.project_aux(hidden)
        mid = self.midlayer
        if self.draft_input is not None:
            n_e, n_h = mid.input_layernorm, mid.hidden_norm
            x, cos, sin = self.draft_input(input_ids, self.embed_tokens.weight, hidden, n_e.weight, n_e.eps,
                                           n_h.weight, n_h.eps, ctx.positions, self.rotary.inv_freq,
                                           self.rotary.attn_factor)
        else:
            x = mid.inputs(self.embed_tokens(input_ids), hidden)
            cos, sin = self.rotary(ctx.positions)
        r, m = mid(x, hidden, cos, sin, ctx, ctx.kv[0] if ctx.kv is not None else None)
        for i, layer in self.layers.items():  # the output is r + m (m None: r is whole, PreNormDecoderLayer)
            r, m = layer(r, m, cos, sin, ctx, ctx.kv[int(i)] if ctx.kv is not None else None)
        if m is None:
            return self._head_whole(r, ctx, need_logits)
        idx = ctx.logits_index
        if self.norm_output:  # EAGLE-3.1: the next step takes norm(r), which the head reads too
            r, n = self.norm.add_forward(r, m)
            n = n if idx is None else gather_rows(n, idx)
            return (self.lm_head(n) if need_logits else None), n
        if idx is not None:  # some positions only: the fused head adds, selects and normalises them in one launch
            if need_logits and self.norm_head is not None and idx.numel() <= self.norm_head_rows:
                sel, logits = self.norm_head(r, m, self.norm.weight, self.norm.eps, self.lm_head.weight, False,
                                             index=idx)
                return logits, sel
            sel = gather_rows(r + m, idx)
            return (self.lm_head(self.norm(sel)) if need_logits else None), sel
        if not need_logits:
            return None, r + m
        if self.norm_head is not None and r.shape[0] * r.shape[1] <= self.norm_head_rows:
            r, logits = self.norm_head(r, m, self.norm.weight, self.norm.eps, self.lm_head.weight, False)
            return logits, r
        r, n = self.norm.add_forward(r, m)
        return self.lm_head(n), r

    def _head_whole(self, r: torch.Tensor, ctx: ForwardContext,
                    need_logits: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
        """`forward`'s end when the last layer handed back its whole output r [B, T, H] (a folded later layer)."""
        if ctx.logits_index is not None:
            r = gather_rows(r, ctx.logits_index)
        n = self.norm(r) if self.norm_output or need_logits else r
        nxt = n if self.norm_output else r
        return (self.lm_head(n) if need_logits else None), nxt


def check_drafter_fits(drafter: LlamaForCausalLMEagle3, target_config: ModelConfig, embed_rows: int,
                       aux_ids: tuple[int, ...]) -> None:
    """Raise DrafterMismatchError (naming both values) unless the drafter fits the target."""
    from ..errors import DrafterMismatchError

    ec = drafter.config.eagle
    assert ec is not None
    if ec.target_hidden_size != target_config.hidden_size:
        raise DrafterMismatchError(
            f"the drafter expects target_hidden_size {ec.target_hidden_size} but the target's hidden size is "
            f"{target_config.hidden_size}"
        )
    if drafter.config.vocab_size != embed_rows:
        raise DrafterMismatchError(
            f"the drafter's vocab_size is {drafter.config.vocab_size} but the target's vocabulary has {embed_rows} "
            "tokens"
        )
    if len(aux_ids) != drafter.n_aux:
        raise DrafterMismatchError(
            f"the drafter's fc takes {drafter.n_aux} aux layers but {len(aux_ids)} aux layer ids were given "
            f"({list(aux_ids)})"
        )
    n = target_config.num_hidden_layers
    bad = [i for i in aux_ids if not 0 <= i < n]
    if bad:
        raise DrafterMismatchError(
            f"the drafter's aux layer ids {list(aux_ids)} include {bad}, outside the target's {n} layers"
        )
    if ec.draft_vocab_size is not None and not ec.draft_vocab_size <= embed_rows:
        raise DrafterMismatchError(
            f"the drafter's draft_vocab_size {ec.draft_vocab_size} exceeds the target's vocabulary of {embed_rows}"
        )
