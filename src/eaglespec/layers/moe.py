"""Mixture of experts: a router, routed SwiGLU experts and optional shared experts (DeepSeek-V2 / V3; Qwen2-MoE's
sigmoid-gated one; Llama 4's), for DeepSeek, Qwen2 / Qwen3-MoE, Mixtral, GLM-4.5, Llama 4 and gpt-oss (its experts
`layers/mlp.ClampedSwiGLUMLP`, with biases).

Contract (REFERENCE.md §6), checkpoint names kept: `gate.weight` [E, H], `experts.E.{gate,up,down}_proj.weight`,
`shared_experts.{gate,up,down}_proj.weight` (DeepSeek, Qwen2-MoE's one shared expert renamed to it) and
`shared_expert_gate.weight` [1, H] (Qwen2-MoE: the shared output scaled by sigmoid(x @ gate^T)); `make_router` picks the
router from the MoEConfig's (scoring_func, topk_method), and refuses other pairs by name. Every router returns (weights
[N, k] float32, expert ids [N, k] int64).

- `NoAuxRouter` (DeepSeek-V3, Kimi: sigmoid / noaux_tc), in float32, `gate.weight` and `gate.e_score_correction_bias`
  [E] kept float32 under `.to(dtype)` as transformers' `_keep_in_fp32_modules_strict` does (the bias decides between
  near-equal scores): `s = sigmoid(x @ gate^T)`; choose with `s + bias`: when n_group > 1 a group scores the sum of
  its top-2 biased scores and only the best `topk_group` groups stay eligible; take the top-k eligible experts; their
  weights are the *unbiased* `s`, divided by their sum when `norm_topk_prob`, times `routed_scaling_factor`.
- `SigmoidTopKRouter` (Llama 4: sigmoid / greedy): the top-k logits, weighted by their sigmoid; with
  `MoEConfig.weight_inputs` the weights scale the experts' inputs (rounded to the model's dtype), not their outputs.
- `SoftmaxTopKRouter` (Qwen3-MoE, Mixtral, gpt-oss, ERNIE 4.5, DeepSeek-V2: softmax / greedy; DeepSeek-V2: softmax /
  group_limited_greedy): the logits `x @ gate^T` (+ `gate.bias`, gpt-oss's) in the model's dtype (`gate.weight` follows
  `.to(dtype)`, as in transformers and vLLM), or in float32 with a float32 `gate.weight` when the config says
  `router_float32` (DeepSeek-V2, as transformers' DeepseekV2TopkRouter), then in float32 `p = softmax(logits)`;
  group_limited_greedy keeps the `topk_group` groups of the largest single `p` eligible (the others' `p` set to 0); the
  top-k of `p` (ERNIE 4.5: of `p + e_score_correction_bias`, weighted by `p`), divided by their sum (floored at
  `norm_min`) when `norm_topk_prob`, times `routed_scaling_factor` (1 for Qwen). transformers
  casts these weights to the model's dtype before weighting the experts; here they stay float32 (the same in float32
  parity).
On CUDA `engine.transforms.use_router_kernel` sets `fused` (not for a group-limited softmax router): the router then
computes its logits as above and the rest in one Triton kernel (layers/router_kernel.py; ties pick the lower expert
id); `use_gemv_kernel` sets `logits_rows` and `logits_max_rows`, through which steps of a few rows compute the logits
(layers/gemv_kernel.py: float32 accumulation either way; on an H100 cuBLAS took 4.9 us for Qwen3's 128 x 2048 gate at
1-4 rows, the GEMV kernel 1.5-2.3).

Eagerly, experts run per expert over the tokens routed to it: the (token, expert) pairs are sorted by expert, each
expert with tokens runs once on its contiguous slice, and the weighted outputs are scattered back with `index_add_`
in float32. That split reads the counts on the host (one sync per MoE layer): fine on the CPU, but no CUDA graph can
hold it, so such a MoE says `supports_cuda_graphs = False`. On CUDA `engine.transforms.use_grouped_experts` stacks
the experts' weights into the buffers `w13` [E, 2I, H] and `w2` [E, H, I] (non-persistent, None until then; each
expert's parameters become views into them), and gpt-oss's biases into `b13` [E, 2I] and `b2` [E, H]: the routed
experts then run as `layers/moe_kernel.grouped_experts` (static shapes, no host sync; gpt-oss's clamped SwiGLU
through `clamp` = (swiglu_limit, swiglu_alpha)) and the module may be captured.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import MoEConfig
from ..errors import ConfigError
from .few_rows_linear import RowsKernel
from .mlp import ClampedSwiGLUMLP, GatedMLP
from .moe_kernel import grouped_experts
from .router_kernel import route


def _logits(router: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, H] @ router.weight^T (+ bias, gpt-oss's: in the product's float32 sum, rounded once as F.linear's) in x's
    dtype; steps of at most `logits_max_rows` rows through the router's `logits_rows` kernel when set."""
    if router.logits_rows is not None and x.shape[0] <= router.logits_max_rows:
        return router.logits_rows(x, router.weight) if bias is None else router.logits_rows(x, router.weight,
                                                                                            bias=bias)
    return F.linear(x, router.weight, bias)


def _keep_float32(*params: nn.Parameter) -> None:
    """After a `.to()` / `_apply`: float parameters moved back to float32 (moves follow; the dtype does not)."""
    for p in params:
        if p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()


def _limit_groups(choice: torch.Tensor, n_group: int, topk_group: int,
                  group_score: Callable[[torch.Tensor], torch.Tensor], fill: float) -> torch.Tensor:
    """choice [N, E] with the experts outside the `topk_group` best of `n_group` equal groups set to `fill`; a group's
    score is `group_score` of its choices [N, G, E/G] -> [N, G]."""
    N = choice.shape[0]
    grouped = choice.view(N, n_group, -1)
    keep = torch.zeros(N, n_group, dtype=torch.bool, device=choice.device)
    keep.scatter_(1, group_score(grouped).topk(topk_group, dim=-1).indices, True)
    return choice.masked_fill(~keep[:, :, None].expand_as(grouped).reshape(N, -1), fill)


class NoAuxRouter(nn.Module):
    """noaux_tc top-k router; checkpoint name `gate`. Returns (weights [N, k] fp32, expert ids [N, k] int64)."""

    fused = False  # engine.transforms.use_router_kernel: the selection after the logits as one Triton kernel
    logits_rows: RowsKernel | None = None  # engine.transforms.use_gemv_kernel: the logits of few-row steps
    logits_max_rows = 0

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        if moe.scoring_func != "sigmoid" or moe.topk_method != "noaux_tc":
            raise ValueError(
                f"only sigmoid / noaux_tc routing is implemented (got {moe.scoring_func} / {moe.topk_method})"
            )
        if moe.n_routed_experts % moe.n_group:
            raise ValueError(f"{moe.n_routed_experts} experts do not split into {moe.n_group} groups")
        self.num_experts, self.top_k = moe.n_routed_experts, moe.num_experts_per_tok
        self.n_group, self.topk_group = moe.n_group, moe.topk_group
        self.norm_topk_prob, self.scaling = moe.norm_topk_prob, moe.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(self.num_experts, hidden_size, dtype=torch.float32))
        nn.init.normal_(self.weight, std=0.02)  # a usable random router when nothing is loaded (tiny test models)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(self.num_experts, dtype=torch.float32), False)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        super()._apply(fn, recurse)
        _keep_float32(self.weight, self.e_score_correction_bias)
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _logits(self, x.float())  # [N, E] float32
        if self.fused:
            return route(logits, self.top_k, True, self.e_score_correction_bias, self.n_group, self.topk_group,
                         self.norm_topk_prob, self.scaling)
        scores = torch.sigmoid(logits)  # [N, E]
        choice = scores + self.e_score_correction_bias.float()  # [N, E] biased, for choosing only
        if self.n_group > 1:  # a group scores the sum of its two largest biased scores
            choice = _limit_groups(choice, self.n_group, self.topk_group,
                                   lambda g: g.topk(min(2, g.shape[-1]), dim=-1).values.sum(-1), float("-inf"))
        ids = choice.topk(self.top_k, dim=-1).indices  # [N, k]
        weights = scores.gather(1, ids)  # [N, k] unbiased
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class SoftmaxTopKRouter(nn.Module):
    """softmax top-k router (Qwen3-MoE, DeepSeek-V2: greedy; DeepSeek-V2's group_limited_greedy); checkpoint name
    `gate`. Returns (weights [N, k] fp32, ids [N, k])."""

    fused = False  # engine.transforms.use_router_kernel: the selection after the logits as one Triton kernel
    logits_rows: RowsKernel | None = None  # engine.transforms.use_gemv_kernel: the logits of few-row steps
    logits_max_rows = 0

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.n_group = moe.n_group if moe.topk_method == "group_limited_greedy" else 1  # greedy ignores groups
        if moe.n_routed_experts % self.n_group:
            raise ConfigError(f"{moe.n_routed_experts} experts do not split into {moe.n_group} groups")
        self.topk_group = moe.topk_group
        self.num_experts, self.top_k = moe.n_routed_experts, moe.num_experts_per_tok
        self.norm_topk_prob, self.scaling = moe.norm_topk_prob, moe.routed_scaling_factor
        self.float32 = moe.router_float32
        # the model's dtype, as a Linear's (Qwen3); float32 under any `.to(dtype)` for DeepSeek-V2 (`_apply`)
        self.weight = nn.Parameter(torch.empty(self.num_experts, hidden_size,
                                               dtype=torch.float32 if self.float32 else None))
        nn.init.normal_(self.weight, std=0.02)  # a usable random router when nothing is loaded (tiny test models)
        # gpt-oss: a bias added to the logits (`gate.bias`, the checkpoint's `router.bias`)
        self.bias = nn.Parameter(torch.zeros(self.num_experts)) if moe.router_bias else None
        # ERNIE 4.5: a float32 correction bias added to the probabilities for choosing only
        self.e_score_correction_bias = (nn.Parameter(torch.zeros(self.num_experts, dtype=torch.float32), False)
                                        if moe.choice_bias else None)
        self.norm_min = moe.norm_min

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        super()._apply(fn, recurse)
        if self.float32:
            _keep_float32(self.weight)
        if self.e_score_correction_bias is not None:
            _keep_float32(self.e_score_correction_bias)
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [N, E] logits: in x's dtype as transformers' and vLLM's Qwen3 gate computes them; DeepSeek-V2's in float32
        logits = _logits(self, x.float() if self.float32 else x, self.bias)
        if self.fused:
            return route(logits, self.top_k, False, None, 1, 1, self.norm_topk_prob, self.scaling)
        probs = torch.softmax(logits.float(), dim=-1)  # [N, E] float32
        if self.n_group > 1:  # group_limited_greedy: a group scores its largest single probability
            probs = _limit_groups(probs, self.n_group, self.topk_group, lambda g: g.amax(-1), 0.0)
        if self.e_score_correction_bias is None:
            weights, ids = probs.topk(self.top_k, dim=-1)  # [N, k] each
        else:  # ERNIE 4.5: chosen by probability + bias, weighted by the probability
            ids = (probs + self.e_score_correction_bias).topk(self.top_k, dim=-1).indices
            weights = probs.gather(1, ids)
        if self.norm_topk_prob:  # softmax values: the sum is > 0 (ERNIE's floor `norm_min`)
            weights = weights / weights.sum(-1, keepdim=True).clamp(min=self.norm_min)
        return weights * self.scaling, ids


class SigmoidTopKRouter(nn.Module):
    """Llama 4's router (sigmoid / greedy); checkpoint name `gate` (the releases' `router`): the top-k of the logits
    `x @ gate^T` in the model's dtype, each weighted by the sigmoid of its logit in float32 (not normalised).
    Returns (weights [N, k] fp32, ids [N, k])."""

    fused = False  # never set: the router kernel's sigmoid chooses by a correction bias this router lacks
    logits_rows: RowsKernel | None = None  # engine.transforms.use_gemv_kernel: the logits of few-row steps
    logits_max_rows = 0

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k = moe.n_routed_experts, moe.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(self.num_experts, hidden_size))
        nn.init.normal_(self.weight, std=0.02)  # a usable random router when nothing is loaded (tiny test models)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, ids = _logits(self, x).topk(self.top_k, dim=-1)  # [N, k] each, in x's dtype
        return torch.sigmoid(top.float()), ids


# (scoring_func, topk_method) -> router class
ROUTERS: dict[tuple[str, str], type[nn.Module]] = {
    ("sigmoid", "noaux_tc"): NoAuxRouter,
    ("sigmoid", "greedy"): SigmoidTopKRouter,
    ("softmax", "greedy"): SoftmaxTopKRouter,
    ("softmax", "group_limited_greedy"): SoftmaxTopKRouter,
}


def make_router(hidden_size: int, moe: MoEConfig) -> nn.Module:
    """The router the config names by (scoring_func, topk_method); a ConfigError for any other pair."""
    cls = ROUTERS.get((moe.scoring_func, moe.topk_method))
    if cls is None:
        known = ", ".join(f"{s} / {t}" for s, t in ROUTERS)
        raise ConfigError(f"MoE routing {moe.scoring_func} / {moe.topk_method} (scoring_func / topk_method) is not "
                          f"implemented (implemented: {known})")
    return cls(hidden_size, moe)


def _expert(hidden_size: int, moe: MoEConfig, act: str) -> nn.Module:
    """One routed expert: the SwiGLU of `act`, or gpt-oss's clamped one with biases."""
    if moe.swiglu_limit is not None:
        return ClampedSwiGLUMLP(hidden_size, moe.moe_intermediate_size, moe.swiglu_limit, moe.swiglu_alpha)
    if moe.expert_bias:
        raise ConfigError("MoE experts with biases are implemented for gpt-oss's clamped SwiGLU only")
    return GatedMLP(hidden_size, moe.moe_intermediate_size, act=act)


class MoE(nn.Module):
    """Routed experts (+ shared experts when the config has them): x [..., H] -> [..., H]."""

    # the eager dispatch reads how many tokens each expert got on the host: no CUDA-graph capture, unless
    # `use_grouped_experts` installs the grouped kernels (it sets this True on the instance)
    supports_cuda_graphs = False

    def __init__(self, hidden_size: int, moe: MoEConfig, act: str = "silu") -> None:
        super().__init__()
        self.gate = make_router(hidden_size, moe)
        self.experts = nn.ModuleList(_expert(hidden_size, moe, act) for _ in range(moe.n_routed_experts))
        shared = moe.shared_intermediate_size or moe.moe_intermediate_size * moe.n_shared_experts
        self.shared_experts = GatedMLP(hidden_size, shared, act=act) if moe.n_shared_experts else None
        # Qwen2-MoE: the shared output times sigmoid(x @ shared_expert_gate^T), one scalar a token
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False) if moe.shared_gate else None
        # the stacked experts of the grouped kernels (`use_grouped_experts`): buffers, so that moves follow them
        self.register_buffer("w13", None, persistent=False)  # [E, 2I, H] gate rows then up rows
        self.register_buffer("w2", None, persistent=False)  # [E, H, I]
        self.register_buffer("b13", None, persistent=False)  # [E, 2I] gpt-oss's gate then up biases
        self.register_buffer("b2", None, persistent=False)  # [E, H] gpt-oss's down biases
        # gpt-oss's clamped SwiGLU for the grouped kernels: (limit, alpha)
        self.clamp = (moe.swiglu_limit, moe.swiglu_alpha) if moe.swiglu_limit is not None else None
        self.weight_inputs = moe.weight_inputs  # Llama 4: the routing weight scales the expert's input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [N, H]
        weights, ids = self.gate(flat)
        shared = self.shared_experts(flat) if self.shared_experts is not None else None
        if self.shared_expert_gate is not None:
            shared = shared * torch.sigmoid(self.shared_expert_gate(flat))  # [N, H] * [N, 1]
        if self.w13 is not None:  # the shared output added in the kernel that sums the pairs
            return grouped_experts(flat, weights, ids, self.w13, self.w2, shared, self.b13, self.b2, self.clamp,
                                   self.weight_inputs).view(shape)
        out = self._routed(flat, weights, ids)
        return (out if shared is None else out + shared).view(shape)

    def _routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [N, H], weights/ids [N, k] -> sum_k weights * expert_ids(x) (`weight_inputs`: sum_k expert_ids(x *
        weights), the product rounded to x's dtype), [N, H] in x's dtype."""
        k = ids.shape[1]
        flat_ids = ids.reshape(-1)  # [N*k]: pair p is (token p // k, expert flat_ids[p])
        order = flat_ids.argsort(stable=True)
        token = order // k  # [N*k] token of each pair, grouped by expert
        pair_w = weights.reshape(-1)[order]  # [N*k]
        counts = torch.bincount(flat_ids, minlength=len(self.experts)).tolist()
        xs = x[token]  # [N*k, H] the routed copies, grouped by expert
        acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        start = 0
        if self.weight_inputs:  # in x's dtype, as transformers' Llama 4 (its routing weights rounded to it first)
            xs = xs * pair_w.to(x.dtype)[:, None]
            pair_w = torch.ones_like(pair_w)
        for e, n in enumerate(counts):
            if n:
                y = self.experts[e](xs[start : start + n]).float() * pair_w[start : start + n, None]
                acc.index_add_(0, token[start : start + n], y)
                start += n
        return acc.to(x.dtype)
