"""A fresh EAGLE-3 drafter for a target: its HF config (the published format, REFERENCE.md §3) and initial weights.

Contract:
- `drafter_hf_config(target_config, aux_ids, draft_vocab_size, shape=DrafterShape())`: the `config.json` dict of a
  `LlamaForCausalLMEagle3` of `shape.num_hidden_layers` decoder layers (default one, the published EAGLE-3 drafter;
  more: vLLM's and speculators' multi-layer drafter, models/eagle3.py) with the target's width, KV heads, head_dim, norm eps, RoPE and context, and the
  target's query heads and intermediate size unless `shape` widens them (still the published format: SGLang
  and vLLM read both from the config; the width must stay the target's, whose embedding the drafter shares);
  `vocab_size` is the target's, `draft_vocab_size` is omitted when None (the drafter then shares the target's
  lm_head), `target_hidden_size` and `eagle_config {eagle_aux_hidden_state_layer_ids, use_aux_hidden_state: true}`
  are set; the ids use the SGLang convention (id i = output of layer i), `tie_word_embeddings` is false.
- `new_drafter(target, aux_ids, vocab, seed)`: the module in float32 on the CPU, wired to the target through
  `set_embed_and_head` (the embedding, and the lm_head without a draft vocabulary, are the target's live tensors and
  stay frozen), linear weights ~ N(0, 0.02) from `seed`, norms 1, and with a draft vocabulary `d2t` / `t2d` set and
  the lm_head initialised from the target's head rows of the kept tokens.
- `drafter_from_checkpoint(target, path)`: a drafter exported earlier (warm start, e.g. continuing over several
  device sessions), checked against the target, wired the same way, its own vocabulary map kept, trainable again;
  one in vLLM speculators' format is refused (the export would write its config.json over the EAGLE-3 layout's
  weight names).
- `widen_drafter(drafter, shape, seed)`: the same drafter with a wider MLP and/or more query heads (in every decoder
  layer), computing the same function (Net2Net-style: the new MLP units and query heads get N(0, 0.02) inputs and zero
  outputs, so the first gradient step starts them from the trained drafter instead of from scratch); narrowing is
  refused.
- `deepen_drafter(drafter, shape, seed)`: the same drafter with more decoder layers, computing the same function
  (each new layer's q/k/v and gate/up ~ N(0, 0.02), its o_proj and down_proj zero, its norms 1: it adds nothing to
  the residual stream until training moves it); removing layers is refused.
- `renorm_drafter(drafter, shape)`: the same drafter with the EAGLE-3.1 norms `shape` adds (their weights 1: a
  different function, which training re-adapts); removing one is refused.
- `calibrate_aux_norms(drafter, aux)`: sets the weights of its aux input norm(s) to the per-channel least-squares fit
  of norm(x) * w to x (relative to each token's scale) over a sample of the target's aux states, so that a just-added
  norm passes fc about the inputs it was trained on (exactly where every token has the same RMS) instead of inputs
  ~14x smaller (SmolLM2's aux states have RMS 11-16).
- `revocab_drafter(drafter, vocab)`: the same drafter moved onto another draft vocabulary (e.g. one rebuilt from
  more data, or larger): the lm_head rows of tokens both vocabularies hold are kept, the others start at zero (a
  logit of 0, below the drafter's usual top logit, so it drafts as before until training raises them; the target's
  head rows instead, as `new_drafter` uses, won the argmax so often that acceptance fell from 0.55 to 0.18 per depth),
  d2t / t2d are the new vocabulary's; everything else is unchanged.
- `trainable_parameters(drafter)`: what the optimiser updates (fc, midlayer, the later layers, norm, and the lm_head
  when it is the drafter's own), by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from ..config import EAGLE31_FLAGS, ModelConfig
from ..errors import ConfigError
from ..models.eagle3 import LlamaForCausalLMEagle3
from ..models.llama import LlamaDecoderLayer
from .vocab import DraftVocab

INIT_STD = 0.02


@dataclass(frozen=True)
class DrafterShape:
    """The drafter layer's own sizes and EAGLE-3.1's norms; None: the target layer's size, no such norm (for an
    --init drafter: its own). A one-layer drafter of a small target is small (for SmolLM2-135M: 5.1M parameters
    besides the lm_head), and on a GPU at small batch its step costs launches, not bytes, so a wider MLP or more query
    heads cost little time there."""

    intermediate_size: int | None = None
    num_attention_heads: int | None = None  # a multiple of the target's KV heads (grouped-query attention)
    num_hidden_layers: int | None = None  # decoder layers (None: one; the first takes the embedding and the hidden)
    # EAGLE-3.1 (config.Eagle3Config): an RMSNorm over the concatenated aux states before fc, or one per aux state,
    # and the final norm's output fed to the next draft step; all three load in SGLang, vLLM and TensorRT-LLM
    norm_before_fc: bool | None = None
    fc_norm: bool | None = None
    norm_output: bool | None = None

    def check(self, target: ModelConfig) -> None:
        if self.norm_before_fc and self.fc_norm:
            raise ConfigError("--norm-before-fc (one RMSNorm over the concatenated aux states) and --fc-norm (one per "
                              "aux state) are alternatives: choose one")
        if self.intermediate_size is not None and self.intermediate_size < 1:
            raise ConfigError(f"--drafter-intermediate-size must be >= 1 (got {self.intermediate_size})")
        if self.num_hidden_layers is not None and self.num_hidden_layers < 1:
            raise ConfigError(f"--drafter-layers must be >= 1 (got {self.num_hidden_layers})")
        h = self.num_attention_heads
        if h is not None and (h < 1 or h % target.num_key_value_heads):
            raise ConfigError(f"--drafter-heads must be a positive multiple of the target's "
                              f"{target.num_key_value_heads} key/value heads (got {h})")


def drafter_hf_config(target: ModelConfig, aux_ids: Sequence[int], draft_vocab_size: int | None,
                      torch_dtype: str = "bfloat16", shape: DrafterShape = DrafterShape()) -> dict[str, Any]:
    shape.check(target)
    d: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target.hidden_size,
        "intermediate_size": shape.intermediate_size or target.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers or 1,
        "num_attention_heads": shape.num_attention_heads or target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "hidden_act": target.hidden_act,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope.theta,
        "rope_scaling": target.rope.to_hf(),
        "max_position_embeddings": target.max_position_embeddings,
        "vocab_size": target.vocab_size,
        "target_hidden_size": target.hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bias": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [int(i) for i in aux_ids], "use_aux_hidden_state": True},
        "torch_dtype": torch_dtype,
    }
    if draft_vocab_size is not None:
        d["draft_vocab_size"] = int(draft_vocab_size)
    for name in EAGLE31_FLAGS:  # EAGLE-3.1, top level as vLLM and SGLang read them
        if getattr(shape, name):
            d[name] = True
    if target.bos_token_id is not None:
        d["bos_token_id"] = target.bos_token_id
    if target.eos_token_ids:
        d["eos_token_id"] = list(target.eos_token_ids) if len(target.eos_token_ids) > 1 else target.eos_token_ids[0]
    return d


def new_drafter(target: nn.Module, aux_ids: Sequence[int], vocab: DraftVocab | None, seed: int = 0,
                shape: DrafterShape = DrafterShape()) -> LlamaForCausalLMEagle3:
    """A freshly initialised drafter wired to `target` (see the module docstring)."""
    tcfg: ModelConfig = target.config
    cfg = ModelConfig.from_hf(drafter_hf_config(tcfg, aux_ids, vocab.size if vocab is not None else None,
                                                shape=shape))
    with torch.device("cpu"):
        drafter = LlamaForCausalLMEagle3(cfg).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)
            else:
                p.fill_(1.0)  # RMSNorm weights
    embed, head = target.get_embed_and_head()
    if vocab is not None:
        drafter.d2t.copy_(vocab.d2t)
        drafter.t2d.copy_(vocab.t2d)
        with torch.no_grad():
            drafter.lm_head.weight.copy_(head.detach().index_select(0, vocab.kept.to(head.device)).float().cpu())
    drafter.set_embed_and_head(embed, head)
    drafter.embed_tokens.weight.requires_grad_(False)
    if not drafter.has_own_head:
        drafter.lm_head.weight.requires_grad_(False)
    return drafter


def trainable_parameters(drafter: LlamaForCausalLMEagle3) -> dict[str, nn.Parameter]:
    names = ("fc.", "input_norm.", "fc_norm.", "midlayer.", "layers.", "norm.") + (("lm_head.",)
                                                                                  if drafter.has_own_head else ())
    return {n: p for n, p in drafter.named_parameters() if n.startswith(names)}


def drafter_shape(drafter: LlamaForCausalLMEagle3) -> DrafterShape:
    """The drafter layer's own sizes, layers and norms (all set)."""
    ec = drafter.config.eagle
    return DrafterShape(drafter.config.intermediate_size, drafter.config.num_attention_heads,
                        drafter.config.num_hidden_layers, ec.norm_before_fc, ec.fc_norm, ec.norm_output)


def _rebuilt(drafter: LlamaForCausalLMEagle3, changes: dict[str, Any],
             replaced: dict[str, torch.Tensor]) -> LlamaForCausalLMEagle3:
    """A drafter of `drafter`'s config with `changes`, holding `drafter`'s own weights with `replaced` swapped in,
    wired to the same target embedding (and shared lm_head), on its device and in its dtype."""
    w = drafter.fc.weight
    with torch.device(w.device):
        new = LlamaForCausalLMEagle3(ModelConfig.from_hf({**drafter.config.raw, **changes})).to(w.dtype)
    own = {n: t for n, t in drafter.state_dict().items() if not n.startswith("embed_tokens.")}
    if not drafter.has_own_head:
        own.pop("lm_head.weight", None)
    own.update(replaced)
    with torch.no_grad():
        missing, unexpected = new.load_state_dict(own, strict=False)
    # the weights left out are a shared lm_head (the target's, wired below) and norms added by `renorm_drafter`
    # (RMSNorm weights start at 1); layers added by `deepen_drafter` come in `replaced`
    added = {n for n in missing if n.startswith(("input_norm.", "fc_norm."))}
    assert not unexpected and set(missing) - added <= ({"lm_head.weight"} - set(own)), (missing, unexpected)
    if drafter.embed_tokens is not None:
        new.set_embed_and_head(drafter.embed_tokens.weight, None if drafter.has_own_head else drafter.lm_head.weight)
    new.reset_buffers()
    return new  # its own parameters are fresh, so trainable; the target's embedding (and head) stay frozen


def widen_drafter(drafter: LlamaForCausalLMEagle3, shape: DrafterShape, seed: int = 0) -> LlamaForCausalLMEagle3:
    """`drafter` widened to `shape` (None fields: unchanged), the same function at the start (module docstring).

    Query heads are laid out by KV group (head h reads KV head h // (heads / kv_heads)), so the old heads of each
    group keep their KV head: group g's new heads follow its old ones, and o_proj's columns move with them."""
    cfg = drafter.config
    I0, Q0, G = cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    I1, Q1 = shape.intermediate_size or I0, shape.num_attention_heads or Q0
    if I1 < I0 or Q1 < Q0:
        raise ConfigError(f"--drafter-intermediate-size {I1} / --drafter-heads {Q1} would narrow the --init drafter "
                          f"({I0} / {Q0}): a continued drafter can only be widened")
    if Q1 % G:
        raise ConfigError(f"--drafter-heads must be a positive multiple of the drafter's {G} key/value heads "
                          f"(got {Q1})")
    if (I1, Q1) == (I0, Q0):
        return drafter
    if cfg.attention_bias or cfg.mlp_bias:
        raise ConfigError("the --init drafter's layer has biases: only the published bias-free layer can be widened")
    dev, dt = drafter.fc.weight.device, drafter.fc.weight.dtype
    resized: dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(seed)

    def fresh(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g) * INIT_STD).to(device=dev, dtype=dt)

    hd = cfg.head_dim
    with torch.no_grad():
        for prefix, layer in _decoder_layers(drafter):
            old_attn, old_mlp = layer.self_attn, layer.mlp
            # MLP: old units first, then new ones whose down_proj columns are zero
            for name in ("gate_proj", "up_proj"):
                w = getattr(old_mlp, name).weight  # [I0, in]
                resized[f"{prefix}mlp.{name}.weight"] = torch.cat((w, fresh(I1 - I0, w.shape[1])))
            w = old_mlp.down_proj.weight  # [H, I0]
            resized[f"{prefix}mlp.down_proj.weight"] = torch.cat((w, w.new_zeros(w.shape[0], I1 - I0)), dim=1)
            # attention: per KV group, its Q0/G old heads then (Q1-Q0)/G new ones with zero o_proj columns
            q = old_attn.q_proj.weight.view(G, Q0 // G, hd, -1)  # [G, old heads per group, hd, in (2H or H)]
            add = (Q1 - Q0) // G
            new_q = fresh(G * add * hd, q.shape[-1]).view(G, add, hd, -1)
            resized[f"{prefix}self_attn.q_proj.weight"] = torch.cat((q, new_q), dim=1).reshape(Q1 * hd, -1)
            o = old_attn.o_proj.weight.view(-1, G, Q0 // G, hd)  # [H, G, old heads per group, hd]
            resized[f"{prefix}self_attn.o_proj.weight"] = torch.cat((o, o.new_zeros(o.shape[0], G, add, hd)),
                                                                    dim=2).reshape(o.shape[0], Q1 * hd)
    return _rebuilt(drafter, {"intermediate_size": I1, "num_attention_heads": Q1}, resized)


def _decoder_layers(drafter: LlamaForCausalLMEagle3) -> list[tuple[str, nn.Module]]:
    """(state-dict prefix, module) of each decoder layer: midlayer, then the later ones."""
    return [("midlayer.", drafter.midlayer)] + [(f"layers.{i}.", m) for i, m in drafter.layers.items()]


def deepen_drafter(drafter: LlamaForCausalLMEagle3, shape: DrafterShape, seed: int = 0) -> LlamaForCausalLMEagle3:
    """`drafter` with `shape.num_hidden_layers` decoder layers (None: unchanged), the same function at the start
    (module docstring): a new layer's attention and MLP outputs are zero, so the residual stream passes it as it
    is; only their input projections are random, so that the first gradient steps have something to move."""
    N0, N1 = drafter.config.num_hidden_layers, shape.num_hidden_layers or drafter.config.num_hidden_layers
    if N1 < N0:
        raise ConfigError(f"--drafter-layers {N1} would remove layers from the --init drafter ({N0}): a continued "
                          "drafter can only be deepened")
    if N1 == N0:
        return drafter
    cfg = drafter.config
    if cfg.attention_bias or cfg.mlp_bias:
        raise ConfigError("the --init drafter's layer has biases: only the published bias-free layer can be deepened")
    w = drafter.fc.weight
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):  # the new layers' shapes, from a layer of the drafter's own config
        shapes = {n: p.shape for n, p in LlamaDecoderLayer(cfg).named_parameters()}
    added: dict[str, torch.Tensor] = {}
    for i in range(N0, N1):
        for name, shp in shapes.items():
            if len(shp) == 1:  # RMSNorm weights
                t = torch.ones(shp)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):  # the layer's outputs: zero
                t = torch.zeros(shp)
            else:
                t = torch.randn(shp, generator=g) * INIT_STD
            added[f"layers.{i}.{name}"] = t.to(device=w.device, dtype=w.dtype)
    return _rebuilt(drafter, {"num_hidden_layers": N1}, added)


def renorm_drafter(drafter: LlamaForCausalLMEagle3, shape: DrafterShape) -> LlamaForCausalLMEagle3:
    """`drafter` with the EAGLE-3.1 norms `shape` asks for and it lacks (norm weights 1; None fields: unchanged).
    Unlike widening this changes the function (the aux states and the later steps' inputs are normalised), so
    training re-adapts it; removing a norm, or trading one aux norm for the other, is refused."""
    ec = drafter.config.eagle
    want = {n: getattr(shape, n) for n in EAGLE31_FLAGS}
    have = {n: getattr(ec, n) for n in want}
    if any(v is False and have[n] for n, v in want.items()):
        raise ConfigError("the --init drafter has EAGLE-3.1 norms ("
                          + ", ".join(n for n, v in have.items() if v) + "): a continued drafter keeps them")
    changes = {n: True for n, v in want.items() if v and not have[n]}
    if not changes:
        return drafter
    if (have["norm_before_fc"] or changes.get("norm_before_fc")) and (have["fc_norm"] or changes.get("fc_norm")):
        raise ConfigError("--norm-before-fc and --fc-norm are alternatives: the --init drafter already has the other")
    nested = dict(drafter.config.raw.get("eagle_config") or {})
    if any(n in nested for n in changes):  # a value in eagle_config wins over the top level's (config.py): set both
        changes = {**changes, "eagle_config": {**nested, **{n: True for n in changes if n in nested}}}
    return _rebuilt(drafter, changes, {})


@torch.no_grad()
def calibrate_aux_norms(drafter: LlamaForCausalLMEagle3, aux: torch.Tensor) -> list[str]:
    """aux [N, n_aux*Ht] the target's aux states at N tokens (the fc input) -> the names of the norm weights set.

    For a norm over x [N, D] with r_t = rms(x_t) and u = x / r, the w minimising the relative error
    sum_t ||u_t * w - x_t||^2 / r_t^2 is, per channel j, sum_t u_tj^2 / r_t / sum_t u_tj^2 / r_t^2; a channel that is
    0 everywhere keeps weight 1. Relative, so that every token counts alike: a plain least-squares fit is ruled by
    the few tokens with massive activations (a Llama's first token: RMS ~850 against ~14 elsewhere in SmolLM2's aux
    states, 25K in two channels), and with it the shipped drafter's held-out step-0 accuracy fell 0.54 -> 0.17
    (this fit: 0.53; docs/training.md, session 35)."""
    def fit(norm: nn.Module, x: torch.Tensor) -> None:
        x = x.float()
        inv_r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)  # [N, 1]
        u2 = (x * inv_r).pow(2)  # [N, D]
        den = (u2 * inv_r.pow(2)).sum(0)
        w = torch.where(den > 0, (u2 * inv_r).sum(0) / den.clamp_min(torch.finfo(torch.float32).tiny), 1.0)
        norm.weight.copy_(w.to(norm.weight))

    if drafter.input_norm is not None:
        fit(drafter.input_norm, aux)
        return ["input_norm.weight"]
    if drafter.fc_norm is not None:
        for n, a in zip(drafter.fc_norm, aux.chunk(drafter.n_aux, dim=-1)):
            fit(n, a)
        return [f"fc_norm.{i}.weight" for i in range(drafter.n_aux)]
    return []


def revocab_drafter(drafter: LlamaForCausalLMEagle3, vocab: DraftVocab) -> LlamaForCausalLMEagle3:
    """`drafter` (with its own draft vocabulary) on `vocab` (module docstring): the logits of the tokens both
    vocabularies hold are unchanged, the new tokens' are 0."""
    if not drafter.has_own_head:
        raise ConfigError("the --init drafter shares the target's lm_head (no draft vocabulary): it has no vocabulary "
                          "to rebuild")
    old = DraftVocab(drafter.d2t.cpu(), drafter.t2d.cpu())
    if torch.equal(old.t2d, vocab.t2d.cpu()):
        return drafter
    w = drafter.lm_head.weight  # [old n, H]
    old_row = old.target_to_draft[vocab.kept]  # [n] the old draft id of each kept token (ascending), -1 where new
    with torch.no_grad():
        rows = w.new_zeros(vocab.size, w.shape[1])
        have = old_row >= 0
        rows[have.to(w.device)] = w[old_row[have].to(w.device)]
    return _rebuilt(drafter, {"draft_vocab_size": vocab.size},
                    {"lm_head.weight": rows, "d2t": vocab.d2t.to(w.device), "t2d": vocab.t2d.to(w.device)})


def drafter_from_checkpoint(target: nn.Module, path: str) -> tuple[LlamaForCausalLMEagle3, DraftVocab | None]:
    """Load an exported drafter to continue training it; returns it with its vocabulary (None: full vocabulary)."""
    from ..api import load_drafter
    from ..models.eagle3 import check_drafter_fits
    from ..speculators_config import is_speculators

    drafter = load_drafter(path, "cpu", torch.float32)
    if is_speculators(drafter.config.raw):  # widening and new norms rebuild from its raw config, the export writes it
        raise ConfigError(f"{path} is a drafter in vLLM speculators' format, which eaglespec runs but does not "
                          "continue training (--init takes the EAGLE-3 layout, as `eaglespec train` exports it)")
    tcfg: ModelConfig = target.config
    aux = drafter.config.eagle.aux_layer_ids or tcfg.default_aux_layer_ids()
    embed, head = target.get_embed_and_head()
    check_drafter_fits(drafter, tcfg, embed.shape[0], tuple(aux))
    drafter.set_embed_and_head(embed, head)
    for p in trainable_parameters(drafter).values():
        p.requires_grad_(True)
    vocab = DraftVocab(drafter.d2t.clone(), drafter.t2d.clone()) if drafter.has_own_head else None
    return drafter, vocab
