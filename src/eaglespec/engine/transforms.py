"""Inference transforms applied to built models (DESIGN.md principle 8: model files stay plain).

- `fuse_projections(model)`: q/k/v into one GEMM and gate/up into one GEMM, in every GQA attention and gated MLP;
  fewer, larger kernels, which matters when a decode step is bound by kernel count (small models, batch 1).
- `use_grouped_experts(model)` (CUDA): every MoE's routed SwiGLU experts (gpt-oss's clamped ones with their biases
  too) as two grouped Triton GEMMs over
  expert-sorted blocks (layers/moe_kernel.py) instead of the eager per-expert loop, whose host sync per layer kept
  MoE targets off CUDA graphs; the experts' weights stacked, their parameters views into the stacks.
- `use_router_kernel(model)` (CUDA): every MoE router's selection after its logits (scores, group limit, top-k,
  normalisation) as one Triton kernel (layers/router_kernel.py) instead of ~8 PyTorch launches.
- `use_rope_store_kernel(model)` (CUDA): RoPE on q/k and both KV-cache writes as one Triton kernel per layer.
- `use_short_attention_kernel(model)` (CUDA): attention of decode / verify / drafter steps of small batches over the
  cache as two Triton kernels (split-K + combine) instead of SDPA's cuDNN kernel.
- `use_mla_kernel(model)` (CUDA): MLA's absorbed attention of steps of few query tokens straight over the latent
  cache as two Triton kernels (layers/mla_attention_kernel.py) instead of a cache copy and SDPA over one shared head.
- `use_norm_linear_kernel(model)` (CUDA): in Llama-style layers, residual add + RMSNorm + q/k/v projection and
  residual add + RMSNorm + gate/up projection + SiLU gating as one Triton kernel each, for steps of a few rows; in an
  EAGLE-3 drafter's layer the second of these.
- `fold_norms(model)` (CUDA): in the layers that took the norm + projection kernel, both norms' weights folded into
  q/k/v and gate/up (W diag(g); the norms' weights become ones), so that steps past that kernel's rows, whose
  projections are cuBLAS GEMMs, apply each norm as a per-row scale in the kernel after the projection and carry the
  residual adds in o_proj's and down_proj's GEMMs: 7 kernels per layer instead of 9 (`PreNormDecoderLayer.
  _forward_folded`).
- `use_linear_rows_kernel(model)` (CUDA): the small bias-free o_proj / down_proj (and an EAGLE-3 drafter's fc and
  q/k/v) as `FewRowsLinear`: the same kernel without add and norm for steps of a few rows (inputs <= ONE_SHOT_K wide,
  at most FEW_ROWS_MAX_WEIGHTS weights).
- `use_gemv_kernel(model)` (CUDA): the bias-free q/k/v, o_proj, down_proj and MLA projections of wide models (inputs
  >= 1536) and their biased o_proj (gpt-oss's) as `FewRowsLinear` through the GEMV kernel for one-row steps (cuBLAS
  reads them at 1.0-3.7 TB/s there), and MoE routers' logits (with a router's bias) of steps of up to 4 rows.
- `use_draft_input_kernel(model)` (CUDA): an EAGLE-3 drafter's embedding lookup, two input norms, their
  concatenation and RoPE's cos/sin as one Triton kernel (layers/draft_input_kernel.py).
- `use_cpu_linear(model)` (CPU): every nn.Linear as a `CpuLinear`, whose product is weight-major (W x^T) at 1-2
  rows: on the CPU measured (session 19), F.linear's few-row GEMMs cost about one weight read per row; from 3 rows
  on through a oneDNN copy of its weight where the copies fit the host's memory (session 61); F.linear where the
  copy does not serve if timing both on the model's weights finds it faster (session 66: an Intel CPU).
- `use_elementwise_kernels(model)` (CUDA): RMSNorm, residual add + RMSNorm, RoPE's cos/sin, MLA's RoPE and SiLU
  gating as one Triton kernel each (layers/elementwise_kernels.py), where the fused kernels above leave them (a
  target's final norm, each forward's cos/sin, steps past the fused kernels' rows), without the compiler's start-up.
- `compile_elementwise(model)`: RMSNorm, residual-add + RMSNorm, RoPE, RoPE's cos/sin tables and SiLU-gating through
  `torch.compile` (one fused kernel each instead of ~5), shapes dynamic so one compilation serves every batch and
  length bucket. On CUDA the Triton kernels above take all but GQA's RoPE where the RoPE + KV-store kernel does not
  apply, which the compiler then serves (it traces a function on its first call only).
None changes anything numerically beyond floating-point reassociation, except that `fold_norms` rounds W diag(g) once
in the weights' dtype; none is applied to models being trained.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import device_memory
from ..layers.attention import GQAAttention
from ..layers.mla import MLAttention
from ..layers.mlp import ClampedSwiGLUMLP, GatedMLP, silu_mul
from ..layers.norm import RMSNorm, add_rms_norm, rms_norm
from ..layers.rotary import Rotary, apply_rotary, rotary_cos_sin


def fuse_projections(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, GQAAttention) and hasattr(m, "q_proj"):
            m.fuse_qkv()
        elif isinstance(m, GatedMLP) and hasattr(m, "gate_proj"):
            m.fuse_gate_up()
    return model


RECOMPILE_LIMIT = 64  # compilations per compiled function and process (PyTorch's default: 8)


class _Compiled:
    """`fn` through `torch.compile`, set up on its first call: the compiler (torch._dynamo, whose import alone took
    ~1.5 s of a CPU start-up, more on the H200) is imported only by a process that runs a compiled function, not by
    every one that prepares a model (on CUDA the Triton kernels replace all but RoPE outside the RoPE + KV-store
    kernel)."""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.fn, self.compiled = fn, None

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.compiled is None:
            import torch._dynamo

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
        return self.compiled(*args, **kwargs)


_compiled: dict[str, _Compiled] = {name: _Compiled(fn) for name, fn in (
    ("norm", rms_norm), ("add_norm", add_rms_norm), ("rope", apply_rotary), ("silu_mul", silu_mul),
    ("cos_sin", rotary_cos_sin))}


def compile_elementwise(model: nn.Module) -> nn.Module:
    """The compiled functions are shared by every model of the process, and each compiles once per guard they fail:
    sizes of 0 and 1 are specialised even with dynamic shapes (a 1-row decode, a 4-row tree level, an 8-row batch),
    so are dtypes and Python floats (RoPE's attention factor, norms' eps): target and drafter, bf16 and float32, all
    batch and tree shapes. A process that runs many engines (bench, tune) passed PyTorch's default limit of 8 for
    RoPE's cos/sin on the H200 (2026-11-30: a tree drafter at 8 rows after chains and trees at 1 and 8 rows), a hard
    failure under fullgraph=True; hence RECOMPILE_LIMIT, set when a function first compiles (`_Compiled`)."""
    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.impl, m.add_impl = _compiled["norm"], _compiled["add_norm"]
        elif isinstance(m, (GQAAttention, MLAttention)):  # MLA's q_pe and k_pe: ~10 PyTorch kernels each eagerly
            m.rope = _compiled["rope"]
        elif isinstance(m, GatedMLP):
            m.gated_act = _compiled["silu_mul"]
        elif isinstance(m, Rotary):
            m.impl = _compiled["cos_sin"]
    return model


def use_elementwise_kernels(model: nn.Module) -> nn.Module:
    """RMSNorm (rows of up to MAX_K), residual add + RMSNorm, RoPE's cos/sin, MLA's RoPE and SiLU gating through the
    Triton kernels of layers/elementwise_kernels.py."""
    from ..layers.elementwise_kernels import (MAX_K, add_rms_norm_rows, rms_norm_rows, rope_rows,
                                              rotary_cos_sin_rows, silu_mul_rows)

    for m in model.modules():
        if isinstance(m, RMSNorm) and m.weight.shape[0] <= MAX_K:
            m.impl, m.add_impl = rms_norm_rows, add_rms_norm_rows
        elif isinstance(m, MLAttention):  # its q_pe and k_pe (GQA's RoPE is in the RoPE + KV-store kernel)
            m.rope = rope_rows
        elif isinstance(m, GatedMLP):
            m.gated_act = silu_mul_rows
        elif isinstance(m, Rotary):
            m.impl = rotary_cos_sin_rows
    return model


STACK_HEADROOM = 512 << 20  # bytes left free on the device after stacking a layer's experts there


def _room_for(device: torch.device, nbytes: int) -> bool:
    """Whether `device` can hold `nbytes` more (free memory plus what PyTorch's allocator caches, less
    STACK_HEADROOM); any device but CUDA can."""
    free = device_memory.room(device)
    return free is None or free >= nbytes + STACK_HEADROOM


def use_grouped_experts(model: nn.Module) -> nn.Module:
    """In every MoE whose experts are bias-free SiLU GatedMLPs or gpt-oss's ClampedSwiGLUMLPs: stack their weights
    into w13 [E, 2I, H] (gate rows then up rows, fused or not) and w2 [E, H, I] (gpt-oss's biases into b13 [E, 2I]
    and b2 [E, H]), make each expert's parameters views into the stacks (the same
    names and values: state dicts and parameter counts hold, and memory is not doubled past one layer's copy), held
    as the MoE's buffers `w13` / `w2` (the routed experts then run as `moe_kernel.grouped_experts`), and set
    `supports_cuda_graphs`. Idempotent. (A later `.to()` would copy the buffers and the parameters apart: apply it
    after the model's last move, as `prepare_for_inference` does.) Stacking holds a layer's experts twice for a
    moment; where the device lacks the room (`_room_for`), the layer's experts go through host memory instead, so a
    model that fits also fits stacked (one layer of Kimi-K2.5's experts is 34 GB)."""
    from ..layers.moe import MoE

    def fits(e: nn.Module) -> bool:
        lins = [getattr(e, n) for n in ("gate_up_proj", "gate_proj", "up_proj", "down_proj") if hasattr(e, n)]
        if type(e) is ClampedSwiGLUMLP:  # its biases stacked too; the clamp is the kernel's CLAMP epilogue
            return all(type(lin) is nn.Linear and lin.bias is not None for lin in lins)
        return (isinstance(e, GatedMLP) and e.act_name == "silu" and all(type(lin) is nn.Linear and lin.bias is None
                                                                          for lin in lins))

    for m in model.modules():
        if not isinstance(m, MoE) or m.w13 is not None or not all(fits(e) for e in m.experts):
            continue
        device = m.experts[0].down_proj.weight.device
        staged = not _room_for(device, sum(p.numel() * p.element_size() for p in m.experts.parameters()))
        with torch.no_grad():
            if staged:  # the experts to host memory first: the device then holds the layer once, stacked
                for p in m.experts.parameters():
                    p.data = p.data.cpu()
                torch.cuda.empty_cache()
            w13 = torch.stack([e.gate_up_proj.weight if hasattr(e, "gate_up_proj")
                               else torch.cat((e.gate_proj.weight, e.up_proj.weight)) for e in m.experts])
            w2 = torch.stack([e.down_proj.weight for e in m.experts])
            biased = m.experts[0].down_proj.bias is not None  # gpt-oss (fits: all of a MoE's experts or none)
            b13 = torch.stack([torch.cat((e.gate_proj.bias, e.up_proj.bias)) for e in m.experts]) if biased else None
            b2 = torch.stack([e.down_proj.bias for e in m.experts]) if biased else None
            if staged:
                w13, w2 = w13.to(device), w2.to(device)
                b13, b2 = (b13.to(device), b2.to(device)) if biased else (None, None)
            for i, e in enumerate(m.experts):
                if hasattr(e, "gate_up_proj"):
                    e.gate_up_proj.weight.data = w13[i]
                else:
                    half = e.gate_proj.weight.shape[0]
                    e.gate_proj.weight.data, e.up_proj.weight.data = w13[i, :half], w13[i, half:]
                    if biased:
                        e.gate_proj.bias.data, e.up_proj.bias.data = b13[i, :half], b13[i, half:]
                e.down_proj.weight.data = w2[i]
                if biased:
                    e.down_proj.bias.data = b2[i]
        m.w13, m.w2, m.b13, m.b2 = w13, w2, b13, b2
        m.supports_cuda_graphs = True
    return model


def use_router_kernel(model: nn.Module) -> nn.Module:
    """Every MoE router whose shape the kernel takes (`router_kernel.fits`; softmax routers without groups or a
    correction bias) selects its experts in one Triton kernel."""
    from ..layers.moe import NoAuxRouter, SoftmaxTopKRouter
    from ..layers.router_kernel import fits

    for m in model.modules():
        softmax_ok = isinstance(m, SoftmaxTopKRouter) and m.n_group == 1 and m.e_score_correction_bias is None
        if softmax_ok or (isinstance(m, NoAuxRouter) and fits(m.num_experts, m.n_group)):
            m.fused = True
    return model


def use_rope_store_kernel(model: nn.Module) -> nn.Module:
    """RoPE and the KV-cache writes of every fused GQA attention as one Triton kernel (layers/rope_kv_kernel.py)."""
    from ..layers.rope_kv_kernel import rope_store

    for m in model.modules():
        if isinstance(m, GQAAttention) and hasattr(m, "qkv_proj") and m.rope_store_ok:  # any even head_dim
            m.rope_store = rope_store
    return model


def use_short_attention_kernel(model: nn.Module) -> nn.Module:
    """Attention over the cache as the split-K Triton kernels (layers/short_attention_kernel.py) in every GQA
    attention that has the fused RoPE + KV-store kernel, for the steps they fit (few rows and query tokens)."""
    from ..layers.attention import AttentionKernel
    from ..layers.short_attention_kernel import fits, short_attention

    kernel = AttentionKernel(short_attention, fits)
    for m in model.modules():
        if isinstance(m, GQAAttention) and m.rope_store is not None:
            m.attn_kernel = kernel
    return model


# Weight sizes (elements) up to which the few-row kernels replace cuBLAS: they were measured on SmolLM2 (0.33-1.77M
# per projection: 0.7-3.5 MB in bf16), where cuBLAS is bound by its launch latency; larger weights (a 1B model's
# 2048 x 16384 gate/up, a MoE's experts) keep cuBLAS, which reads them at 3-4 TB/s, until the kernels are measured
# there. Counted in elements, so that float32 and bf16 engines of one model take the same path.
FEW_ROWS_MAX_WEIGHTS = 2 << 20


def use_mla_kernel(model: nn.Module) -> nn.Module:
    """Every MLA attention's absorbed steps over its cache as layers/mla_attention_kernel.py's kernels (where they
    fit)."""
    from ..layers.attention import AttentionKernel
    from ..layers.mla_attention_kernel import fits, mla_attention

    kernel = AttentionKernel(mla_attention, fits)
    for m in model.modules():
        if isinstance(m, MLAttention):
            m.attn_kernel = kernel
    return model


# An EAGLE-3 drafter's own head (draft vocabulary x hidden) up to this many elements takes the fused norm + projection
# kernel with its final norm, for steps of up to DRAFT_HEAD_ROWS rows: SmolLM2's shipped drafter has 12,288 x 576 =
# 7.1M (a target's full-vocabulary head, 28M and up, keeps cuBLAS). On the H200 (benchmarks/draft_head_check.py,
# session 14) it saved ~5 us per one-row chain step (draft graph 0.077 -> 0.072 ms) and lost at 4 rows and more (an
# 8-row chain step 0.93 -> 1.00 ms: cuBLAS reads the 14 MB head once for all rows).
DRAFT_HEAD_MAX_WEIGHTS = 8 << 20
DRAFT_HEAD_ROWS = 1


def _kernel_rows(model: nn.Module) -> int:
    """The default row limit of the add + norm + projection kernels for `model`'s weights' dtype
    (`norm_linear_kernel.max_rows`: MAX_ROWS; 8 in float32, whose longer steps run faster through cuBLAS)."""
    from ..layers.norm_linear_kernel import max_rows

    p = next(model.parameters(), None)
    return max_rows(p.dtype if p is not None else torch.bfloat16)


def _small(lin: nn.Linear) -> bool:
    return lin.weight.numel() <= FEW_ROWS_MAX_WEIGHTS


def use_norm_linear_kernel(model: nn.Module, max_rows: int | None = None) -> nn.Module:
    """Residual add + RMSNorm + projection (+ SiLU gating) as one Triton kernel in every pre-norm layer whose
    attention has a fused bias-free q/k/v projection and whose MLP is a fused bias-free SiLU gate/up MLP
    (layers/norm_linear_kernel.py), and for the MLP half of an EAGLE-3 drafter's layer, for steps of at most
    `max_rows` rows (default: `norm_linear_kernel.max_rows` of the weights' dtype: MAX_ROWS, 8 in float32); and for
    the drafter's final norm + its own draft head (of <= DRAFT_HEAD_MAX_WEIGHTS) in steps of at most DRAFT_HEAD_ROWS
    rows.
    Only models of width <= ONE_SHOT_K (SmolLM2's 576) and projections of <= FEW_ROWS_MAX_WEIGHTS weights: on the
    H200 the kernel beats the launches it saves there, while for 4096-wide layers a blocked version was 2x slower
    than cuBLAS (docs/benchmarks.md, "Session 5"). Layers of other shapes (MLA, MoE) keep their path."""
    from ..layers.norm_linear_kernel import ONE_SHOT_K, add_norm_linear
    from ..models.base import PreNormDecoderLayer
    from ..models.eagle3 import Eagle3MidLayer, LlamaForCausalLMEagle3

    rows = _kernel_rows(model) if max_rows is None else max_rows

    def mlp_half_fits(m: nn.Module) -> bool:  # residual add + post-attention RMSNorm + fused SiLU gate/up
        f = m.mlp
        return (isinstance(f, GatedMLP) and getattr(f, "gate_up_proj", None) is not None
                and f.gate_up_proj.bias is None and f.act_name == "silu" and f.gate_up_proj.in_features <= ONE_SHOT_K
                and _small(f.gate_up_proj) and isinstance(m.post_attention_layernorm, RMSNorm))

    for m in model.modules():
        if isinstance(m, PreNormDecoderLayer):  # both halves: the attention's too
            a = m.self_attn
            fits = (isinstance(a, GQAAttention) and getattr(a, "qkv_proj", None) is not None
                    and a.qkv_proj.bias is None and a.qkv_proj.in_features <= ONE_SHOT_K and _small(a.qkv_proj)
                    and isinstance(m.input_layernorm, RMSNorm) and mlp_half_fits(m))
        else:  # an EAGLE-3 drafter's layer: the MLP half only (its q/k/v input is two normed halves)
            fits = isinstance(m, Eagle3MidLayer) and mlp_half_fits(m)
        if fits:
            m.norm_linear, m.norm_linear_rows = add_norm_linear, rows
        if (isinstance(m, LlamaForCausalLMEagle3) and m.has_own_head and m.lm_head.bias is None
                and isinstance(m.norm, RMSNorm) and m.lm_head.in_features <= ONE_SHOT_K
                and m.lm_head.weight.numel() <= DRAFT_HEAD_MAX_WEIGHTS and m.lm_head.weight.is_contiguous()):
            m.norm_head, m.norm_head_rows = add_norm_linear, min(rows, DRAFT_HEAD_ROWS)  # final norm + draft head
    return model


def fold_norms(model: nn.Module) -> nn.Module:
    """In every pre-norm layer wired for the norm + projection kernel (`use_norm_linear_kernel`, hence a plain RMSNorm
    before a fused bias-free q/k/v and before a fused bias-free SiLU gate/up), fold each norm's weight g into the
    projection after it, W <- W diag(g) (the product in float32, rounded once to the weights' dtype), and set g to
    ones; then mark the layer `folded_norms`, so that steps of more rows than that kernel takes run
    `_forward_folded`. Every path computes the same function: the fused kernel and the module path now multiply by
    ones. Measured on the H200 for SmolLM2's 128-row verify (docs/benchmarks.md, "Session 18"). Idempotent."""
    from ..models.base import PreNormDecoderLayer

    for m in model.modules():
        if not (isinstance(m, PreNormDecoderLayer) and m.norm_linear is not None and not m.folded_norms):
            continue
        with torch.no_grad():
            for norm, lin in ((m.input_layernorm, m.self_attn.qkv_proj), (m.post_attention_layernorm,
                                                                          m.mlp.gate_up_proj)):
                w, g = lin.weight, norm.weight
                w.copy_((w.float() * g.float()).to(w.dtype))
                g.fill_(1.0)
        m.folded_norms = True
    return model


def use_linear_rows_kernel(model: nn.Module, max_rows: int | None = None,
                           names: tuple[str, ...] = ("o_proj", "down_proj", "fc", "qkv_proj")) -> nn.Module:
    """Every bias-free nn.Linear named in `names` whose input is at most ONE_SHOT_K wide and whose weight holds at
    most FEW_ROWS_MAX_WEIGHTS elements becomes a `FewRowsLinear` (layers/few_rows_linear.py) for steps of at most
    `max_rows` rows (default: as `use_norm_linear_kernel`'s). The kernel wins where cuBLAS is bound by its launch
    latency (3-5 us for SmolLM2's 0.7-2 MB on the H200). A fused qkv_proj is among them for the EAGLE-3 drafter,
    whose layer normalises its two input halves apart (so the fused norm + projection kernel does not serve it); in a
    target's layer steps within that kernel's rows never call qkv_proj, longer ones fall through to cuBLAS."""
    from ..layers.few_rows_linear import FewRowsLinear
    from ..layers.norm_linear_kernel import ONE_SHOT_K, linear_rows

    rows = _kernel_rows(model) if max_rows is None else max_rows
    for parent in list(model.modules()):
        for name in names:
            lin = parent._modules.get(name)
            if isinstance(lin, FewRowsLinear) and lin.kernel is linear_rows:  # wired before: a new row limit
                lin.max_rows = rows
            elif (type(lin) is nn.Linear and lin.bias is None and lin.in_features <= ONE_SHOT_K
                    and _small(lin) and lin.weight.is_contiguous()):
                setattr(parent, name, FewRowsLinear.wrap(lin, rows))
    return model


def use_draft_input_kernel(model: nn.Module) -> nn.Module:
    """The input of every EAGLE-3 drafter in `model` (embedding, both input norms, concatenation, cos/sin) as one
    Triton kernel (layers/draft_input_kernel.py), where its widths fit and both norms are plain RMSNorms. x's second
    half must stay hidden_norm(h) as the module computes it (no weight folded away): with norm_before_residual it is
    also the layer's residual (`Eagle3MidLayer.residual`)."""
    from ..layers.draft_input_kernel import draft_input, fits
    from ..models.eagle3 import LlamaForCausalLMEagle3

    for m in model.modules():
        if (isinstance(m, LlamaForCausalLMEagle3) and isinstance(m.midlayer.input_layernorm, RMSNorm)
                and isinstance(m.midlayer.hidden_norm, RMSNorm)
                and fits(m.config.hidden_size, m.rotary.inv_freq.shape[0])):
            m.draft_input = draft_input
    return model


CPU_WEIGHT_MAJOR = True  # prepare_for_inference applies use_cpu_linear on the CPU (False: F.linear, for A/B runs)
# the packed copies (layers/cpu_linear.py) are made only while they take at most this share of the host's available
# memory: they double the projections' weights (SmolLM2-135M in float32: ~540 MB more), which a large model on the
# CPU may not have room for; it then keeps the weight-major product at every row count
CPU_PACK_MAX_SHARE = 0.25


def use_cpu_linear(model: nn.Module) -> nn.Module:
    """Every plain nn.Linear (with or without bias) becomes a `CpuLinear` (layers/cpu_linear.py): the same
    Parameters, the product computed as W x^T with 1 and 3 rows padded to 2 and 4. On session 19's 2-core CPU a
    fused SmolLM2 forward of 3 tokens went from 1.87x to 1.03x one of 1 token (benchmarks/cpu_linear_check.py,
    docs/benchmarks.md). Then, where the weights' oneDNN copies (one per distinct weight) take at most
    CPU_PACK_MAX_SHARE of the host's available memory, each CpuLinear packs its weight (float32: for steps of 3 rows
    and more; bfloat16 where the CPU has native bf16: for every step), layers/cpu_linear.py. Session 61: SmolLM2's
    float32 forward of 4 tokens 1.30x -> 1.14-1.24x one of 1 token, of 8 tokens 1.94x -> 1.37-1.43x. Last, where
    the projections hold at least cpu_linear.MEASURE_MIN_BYTES, `cpu_linear.measure_direct_rows` times F.linear against
    the weight-major product on their weights, and where F.linear is faster every CpuLinear takes it wherever its
    packed copy does not serve (session 66's Intel CPU: SmolLM2's plain decoding 2.3x faster), and, for as many rows
    as it also beats the packed copy, there too (session 67, the same CPU: 3 rows; a 3-token forward 1.28x -> 1.15x
    one of 1 token). Idempotent."""
    from ..layers.cpu_linear import CpuLinear, measure_direct_rows, packable

    wrapped = 0
    for parent in list(model.modules()):
        for name, lin in list(parent._modules.items()):
            if type(lin) is nn.Linear:
                setattr(parent, name, CpuLinear.wrap(lin))
                wrapped += 1
    sharing: dict[int, list[CpuLinear]] = {}  # a weight's data pointer -> the projections without a copy of it
    for m in model.modules():
        if type(m) is CpuLinear and m.packed is None and packable(m.weight.dtype) and m.weight.device.type == "cpu":
            sharing.setdefault(m.weight.data_ptr(), []).append(m)
    need = sum(ms[0].weight.numel() * ms[0].weight.element_size() for ms in sharing.values())
    room = device_memory.host_available()
    if sharing and room is not None and need <= CPU_PACK_MAX_SHARE * room:
        for first, *rest in sharing.values():
            if first.pack():
                for m in rest:
                    m.pack(first.packed)
    if wrapped:  # (once: a second call wraps nothing and times nothing)
        measure_direct_rows([m for m in model.modules() if type(m) is CpuLinear])
    return model


GEMV_MIN_K = 1536  # inputs at least this wide: the widths measured (1,536-14,336)
GEMV_MAX_ROWS = 1  # decode steps: at 4 rows the kernel lost to cuBLAS on 7 of 9 projections (session 55)
# a MoE router's gate (E x H, E <= 384) at up to this many rows: on an H100 Qwen3's bf16 128 x 2048 1.5-2.3 us against
# cuBLAS's 4.9 at 1-4 rows, a noaux_tc router's float32 384 x 7168 5.9-7.6 against 7.9-24.2 (session 55)
ROUTER_GEMV_MAX_ROWS = 4
# the one-row projections the GEMV kernel serves: a GQA layer's fused q/k/v and o_proj, an MLP's (or shared expert's)
# down_proj, and MLA's projections from the hidden state and the q LoRA rank (kv_b_proj is absorbed, not called)
GEMV_NAMES = ("qkv_proj", "o_proj", "down_proj", "q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa")
# Of those, the ones wired when they carry a bias (session 60, H100, batch-1 decode steps): gpt-oss-20b's o_proj, which
# cuBLAS runs as a split-K GEMM plus a reduce (13.9 us a layer against the kernel's 9.5), 3.275 -> 3.190 ms a step;
# its biased q/k/v 3.190 -> 3.170 more, but Qwen2.5-7B's 5.257 -> 5.342 (cuBLAS's bias GEMM there is the faster in
# the step, though not alone): biased q/k/v keep cuBLAS
GEMV_BIASED_NAMES: tuple[str, ...] = ("o_proj",)


def use_gemv_kernel(model: nn.Module, names: tuple[str, ...] = GEMV_NAMES) -> nn.Module:
    """Every nn.Linear named in `names` whose input is at least GEMV_MIN_K wide, bias-free or (GEMV_BIASED_NAMES)
    biased, becomes a `FewRowsLinear` through `layers/gemv_kernel.gemv_rows` (the bias added in the kernel) for
    steps of GEMV_MAX_ROWS row(s), and every MoE router of such a width computes the logits of steps of up to
    ROUTER_GEMV_MAX_ROWS rows through it (`logits_rows`). One row, cold weights: on the H200 it read Llama-8B's
    q/k/v, o_proj and down_proj in 14.3 / 10.7 / 29.2 us against cuBLAS's 15.6 / 13.2 / 31.9 (session 11; cuBLAS
    splits o_proj's K and reduces in a second kernel); on an H100 (session 55) Qwen3-30B-A3B's q/k/v, o_proj and 128
    x 2048 router gate in 7.6 / 6.7 / 1.5 us against 9.5 / 10.7 / 4.9, and the MLA projections of DeepSeek-V3 /
    Kimi-K2.5 (q_a 1536 x 7168, kv_a 576 x 7168, q_b 12288 x 1536) in 9.0 / 5.4 / 13.4 against 12.6 / 8.3 / 15.5; on
    an H100 (session 60) gpt-oss-20b's biased q/k/v 5,120 x 2,880 and o_proj 2,880 x 4,096 (without their biases) in
    11.6 / 9.5 us against 12.3 / 13.7 (alone; in a step only o_proj's gain holds: GEMV_BIASED_NAMES). An MLP's
    gate/up (cuBLAS 4.1 TB/s on Llama-8B) keeps cuBLAS. Layers already wired to the few-row kernels (SmolLM2's) keep
    them."""
    from ..layers.few_rows_linear import FewRowsLinear
    from ..layers.gemv_kernel import gemv_rows
    from ..layers.moe import NoAuxRouter, SigmoidTopKRouter, SoftmaxTopKRouter

    for parent in list(model.modules()):
        if isinstance(parent, (NoAuxRouter, SigmoidTopKRouter, SoftmaxTopKRouter)):
            if parent.weight.shape[1] >= GEMV_MIN_K and parent.weight.is_contiguous():
                parent.logits_rows, parent.logits_max_rows = gemv_rows, ROUTER_GEMV_MAX_ROWS
            continue
        for name in names:
            lin = parent._modules.get(name)
            if (type(lin) is nn.Linear and lin.in_features >= GEMV_MIN_K and lin.weight.is_contiguous()
                    and (lin.bias is None or (name in GEMV_BIASED_NAMES and lin.bias.is_contiguous()))):
                setattr(parent, name, FewRowsLinear.wrap(lin, GEMV_MAX_ROWS, gemv_rows))
    return model


def prepare_for_inference(model: nn.Module, device: torch.device, fuse: bool | None,
                          compile: bool | None, int4: bool | None = False) -> nn.Module:
    """Apply the transforms an EngineConfig asks for. `fuse` None: on CUDA and the CPU (on CUDA fused projections come
    with the Triton kernels: RoPE + KV store, short-query attention, add + norm + projection; on session 19's 2-core
    CPU fusing made plain decoding 15% faster once the projections were weight-major: 11.7 -> 13.4 tok/s); on the CPU
    the weight-major projections (`use_cpu_linear`), after any fusion. `compile` None: on CUDA only. On the H200,
    compiling took SmolLM2-135M from 302 to 795 tok/s and a Llama-8B-shaped model from 172 to 209 tok/s, the two
    later kernels SmolLM2's MT-bench batch-1 decoding from 994 to 1,226 tok/s (docs/benchmarks.md); on the CPU
    compiling only adds compile time. Since session 33 the CUDA path (unless `fuse` is False) runs the norms, cos/sin
    and gating as Triton kernels (`use_elementwise_kernels`; MLA's RoPE too since session 56), which leaves the
    compiler GQA's RoPE outside the RoPE + KV-store kernel only: a model that never runs it (every GQA model with
    that kernel, every MLA model) never compiles anything on CUDA. `int4`: the 4-bit CPU path
    (engine/int4_weights.py): True required, None where the model allows it (`int4_weights.int4_mode`)."""
    if fuse or (fuse is None and device.type in ("cuda", "cpu")):
        fuse_projections(model)
        if device.type == "cuda":
            use_grouped_experts(model)
            use_router_kernel(model)
            use_rope_store_kernel(model)
            use_short_attention_kernel(model)
            use_mla_kernel(model)
            use_norm_linear_kernel(model)
            fold_norms(model)
            use_linear_rows_kernel(model)
            use_gemv_kernel(model)
            use_draft_input_kernel(model)
    if int4 is not False:  # the 4-bit CPU path (EngineConfig.cpu_weights), on a float32 model: no nn.Linear left
        from .int4_weights import use_int4_weights

        use_int4_weights(model, required=int4 is True)
    if device.type == "cpu" and CPU_WEIGHT_MAJOR:
        use_cpu_linear(model)
    if compile or (compile is None and device.type == "cuda"):
        compile_elementwise(model)
    if device.type == "cuda" and (fuse or fuse is None):
        use_elementwise_kernels(model)  # after compile_elementwise: the kernels replace its versions where they apply
    return model
