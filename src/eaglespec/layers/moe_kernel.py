"""Routed experts as grouped GEMMs over expert-sorted blocks: a MoE dispatch with static shapes, no host sync.

The eager dispatch (`MoE._routed`) reads each expert's token count on the host and launches one MLP per expert with
tokens: one synchronisation per MoE layer and ~3 launches per routed expert, which no CUDA graph can hold. Here the
N tokens' P = N*k (token, expert) pairs are placed into blocks of BLOCK_M slots, every block holding pairs of one
expert only, and two Triton GEMMs walk the blocks; each block reads its expert's weights once, so a decode or verify
step reads each routed expert's weights about once (not once per pair) whatever its token count.

- `expert_blocks(ids, num_experts, block_m) -> (pairs, block_expert)`: ids [N, k] (any integer dtype); pairs
  [B * block_m] int32, the pair index p = token * k + slot in each used slot and P in the others; block_expert [B]
  int32, each block's expert, -1 past the used blocks. B = `max_blocks(P, E, block_m)` = ceil(P / block_m) +
  min(E, P): each expert with pairs wastes at most one partial block. Within an expert the pairs keep their order (a
  stable sort), so the layout is a function of ids alone. Up to ONE_PROGRAM_MAX_PAIRS pairs (every decode, verify
  and drafting step) one Triton program without a loop lays it out: a histogram of the experts, the keys
  expert * PP + p sorted in registers, each pair's slot gathered from the per-expert offsets; a used block's expert
  is written by the pair in its first slot. Longer prefills take a stable sort and a scatter in PyTorch (the same
  layout, ~15 launches).
- `grouped_experts(x, weights, ids, w13, w2, add=None) -> [N, H]`: x [N, H]; weights [N, k] float32; ids [N, k];
  w13 [E, 2I, H] (each expert's gate rows then up rows, nn.Linear's [out, in]); w2 [E, H, I]. The first GEMM
  computes both halves of a block's tile and writes silu(gate) * up [P, I] in x's dtype (the eager MLP's rounding
  points); the second
  writes float32 [P, H] scaled by each pair's weight; `sum_pairs` sums the k rows of a token in float32 and rounds
  once to x's dtype, as the eager path's float32 `index_add_`, then adds `add` (a MoE's shared experts' output, x's
  dtype) and rounds again, as the eager `routed + shared`. gpt-oss's experts (`ClampedSwiGLUMLP`): `b13` [E, 2I]
  and `b2` [E, H] added to each GEMM's float32 sums before the epilogue, and `clamp` = (limit, alpha) making the
  first epilogue min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1) in float32 from the
  rounded g and u (the eager module rounds each of its elementwise steps: bf16 differs by a rounding or two, float32
  agrees to float32's precision). `weight_inputs` (Llama 4): the pair weights scale the first GEMM's rows of x
  (rounded to x's dtype, as the eager product) and the second GEMM's output stays unweighted. float32 weights
  multiply in IEEE float32 (no TF32). The
  GEMMs' default tiles are fitted to the device's shared memory (`fit_shared`: float32 at DeepSeek-V3's width
  needs smaller ones than bf16).
  Memory per call: [P, I] in x's dtype and [P, H] float32 (a prefill window of 8,192 tokens of DeepSeek-V3, k = 8:
  0.25 + 1.9 GB; the eager loop held one [N, H] float32 accumulator).
All shapes depend on N, k, E and the weights only: one CUDA graph per step shape holds the whole layer. Every kernel
launches with programmatic dependent launch where the device has it (layers/pdl.py), waiting before its first load:
each reads only what the kernel before it wrote (the GEMMs learn their expert from the layout; `USE_PDL` False
launches them without, for the benchmarks' A/B). Kernels are built on first use, so that `TRITON_INTERPRET=1` (the
CPU tests) takes effect.
"""

from __future__ import annotations

import functools

import torch

from .block_size import pow2
from .norm_linear_dot_kernel import shared_limit
from .pdl import interpreted, launch_options

USE_PDL = True  # False: the kernels launch without PDL (the benchmarks' A/B through with_setting.py)


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """Blocks that any routing of `pairs` pairs over `num_experts` experts fills at most."""
    return -(-pairs // block_m) + min(num_experts, pairs)


def block_m_for(pairs: int, num_experts: int) -> int:
    """Slots per block: 16 (tl.dot's least) while experts get few pairs each (decode, verify), larger blocks for
    prefills, whose blocks are compute-bound and whose padding matters less."""
    per_expert = pairs / max(num_experts, 1)
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def align_kernel(ids, pairs, block_expert, P, blocks, BLOCK_M: tl.constexpr, EP: tl.constexpr,
                     PP: tl.constexpr, BP: tl.constexpr, SP: tl.constexpr, PDL: tl.constexpr = False):
        # one program, no loop: every pair at once (PP >= P lanes), sorted by (expert, pair) in registers
        if PDL:  # layers/pdl.py: the ids come from the router kernel, so the wait comes first
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        rp = tl.arange(0, PP)
        valid = rp < P
        e = tl.load(ids + rp, mask=valid, other=0).to(tl.int32)
        counts = tl.histogram(e, EP, mask=valid)  # [EP]
        nblk = (counts + BLOCK_M - 1) // BLOCK_M
        slot0 = (tl.cumsum(nblk, 0) - nblk) * BLOCK_M  # [EP] each expert's first slot
        first = tl.cumsum(counts, 0) - counts  # [EP] each expert's first place in the sorted order
        key = tl.sort(tl.where(valid, e * PP + rp, EP * PP + rp))  # [PP] stable by expert; the P valid ones first
        es = tl.minimum(key // PP, EP - 1)
        rank = rp - tl.gather(first, es, 0)  # place within its expert
        dest = tl.gather(slot0, es, 0) + rank
        tl.store(pairs + dest, key % PP, mask=valid)
        # a used block's expert is that of the pair in its first slot; the blocks past them take -1
        tl.store(block_expert + dest // BLOCK_M, es, mask=valid & (rank % BLOCK_M == 0))
        used = tl.sum(nblk, 0)
        rb = tl.arange(0, BP)
        tl.store(block_expert + rb, tl.full([BP], -1, tl.int32), mask=(rb >= used) & (rb < blocks))
        rs = tl.arange(0, SP)  # the slots of unused blocks hold P (never read: a layout that is a function of ids)
        tl.store(pairs + rs, tl.full([SP], 0, tl.int32) + P, mask=(rs >= used * BLOCK_M) & (rs < blocks * BLOCK_M))
        # padding: the slots of each expert's last block past its pairs hold P
        rm = tl.arange(0, BLOCK_M)
        tail = slot0[:, None] + counts[:, None] + rm[None, :]  # [EP, BM]
        tl.store(pairs + tail, tl.full([EP, BLOCK_M], 0, tl.int32) + P,
                 mask=rm[None, :] < (nblk * BLOCK_M - counts)[:, None])

    @triton.jit
    def gemm_kernel(a, w, c, pairs, block_expert, scale, bias, P, N, s_am, s_we, s_wn, s_cm, s_be, up_off, limit,
                    alpha, K: tl.constexpr, A_DIV: tl.constexpr, GATED: tl.constexpr, SCALE: tl.constexpr,
                    BIAS: tl.constexpr, CLAMP: tl.constexpr, A_SCALE: tl.constexpr, IEEE: tl.constexpr,
                    UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
        # one program: BLOCK_M slots of one expert x BLOCK_N output features; a's row of slot p is p // A_DIV
        if PDL:  # layers/pdl.py: which expert's weights to read is known only after the layout, so no early load
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid_m = tl.program_id(0)
        e = tl.load(block_expert + pid_m)
        if e >= 0:
            rows = tl.load(pairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM] pair ids, P in padding
            valid = rows < P
            arow = (rows // A_DIV).to(tl.int64)
            rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            nm = rn < N
            rk = tl.arange(0, BLOCK_K)
            wbase = w + e.to(tl.int64) * s_we
            if A_SCALE:  # Llama 4: each pair's routing weight scales its row of a, rounded to a's dtype
                sa = tl.load(scale + rows, mask=valid, other=0.0)[:, None]
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = k0 + rk
                km = kk < K
                at = tl.load(a + arow[:, None] * s_am + kk[None, :], mask=valid[:, None] & km[None, :], other=0.0)
                if A_SCALE:
                    at = (at.to(tl.float32) * sa).to(a.dtype.element_ty)
                wmask = nm[None, :] & km[:, None]
                wt = tl.load(wbase + rn[None, :] * s_wn + kk[:, None], mask=wmask, other=0.0)  # [BK, BN]
                if UPCAST:  # the interpreter's tl.dot misreads bf16 (NumPy has none); the products are exact in fp32
                    at = at.to(tl.float32)
                    wt = wt.to(tl.float32)
                if IEEE:
                    acc = tl.dot(at, wt, acc, input_precision="ieee")
                else:
                    acc = tl.dot(at, wt, acc)
                if GATED:  # the up rows of the same features, up_off rows below the gate rows
                    ut = tl.load(wbase + (rn[None, :] + up_off) * s_wn + kk[:, None], mask=wmask, other=0.0)
                    if UPCAST:
                        ut = ut.to(tl.float32)
                    if IEEE:
                        acc_up = tl.dot(at, ut, acc_up, input_precision="ieee")
                    else:
                        acc_up = tl.dot(at, ut, acc_up)
            if BIAS:  # the expert's bias rows (gpt-oss): [E, 2I] gate then up for the first GEMM, [E, H] the second
                bb = bias + e.to(tl.int64) * s_be
                acc += tl.load(bb + rn, mask=nm, other=0.0).to(tl.float32)
                if GATED:
                    acc_up += tl.load(bb + rn + up_off, mask=nm, other=0.0).to(tl.float32)
            if GATED:  # gate and up each rounded to the output dtype first, as the eager projections give them
                g = acc.to(c.dtype.element_ty).to(tl.float32)
                u = acc_up.to(c.dtype.element_ty).to(tl.float32)
                if CLAMP:  # gpt-oss: min(g, limit) * sigmoid(alpha min(g, limit)) * (clamp(u, +-limit) + 1)
                    g = tl.minimum(g, limit)
                    u = tl.minimum(tl.maximum(u, -limit), limit)
                    acc = g / (1.0 + tl.exp(-alpha * g)) * (u + 1.0)
                else:  # silu(gate) * up
                    acc = (g / (1.0 + tl.exp(-g))).to(c.dtype.element_ty).to(tl.float32) * u
            if SCALE:
                acc = acc * tl.load(scale + rows, mask=valid, other=0.0)[:, None]
            cptr = c + rows.to(tl.int64)[:, None] * s_cm + rn[None, :]
            tl.store(cptr, acc.to(c.dtype.element_ty), mask=valid[:, None] & nm[None, :])

    @triton.jit
    def sum_kernel(y, out, add, H, K_PAIRS: tl.constexpr, ADD: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr = False):
        # one program: BLOCK features of one token; its K_PAIRS float32 rows summed in order, rounded once
        if PDL:  # layers/pdl.py: nothing here is a weight, so the wait comes first
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        n = tl.program_id(0).to(tl.int64)
        rh = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = rh < H
        acc = tl.load(y + n * K_PAIRS * H + rh, mask=m, other=0.0)
        for j in tl.static_range(1, K_PAIRS):
            acc += tl.load(y + (n * K_PAIRS + j) * H + rh, mask=m, other=0.0)
        r = acc.to(out.dtype.element_ty)
        if ADD:  # + the shared experts' output, rounded again: the eager `routed + shared` of two x-dtype tensors
            r = (r.to(tl.float32) + tl.load(add + n * H + rh, mask=m, other=0.0).to(tl.float32)).to(r.dtype)
        tl.store(out + n * H + rh, r, mask=m)

    return align_kernel, gemm_kernel, sum_kernel


# Pairs up to which one Triton program lays out the blocks (one launch instead of `_blocks_by_sort`'s ~15): its
# registers hold every pair, sorted; a long prefill (8,192 tokens x 8 = 65,536 pairs) takes the sort in PyTorch
ONE_PROGRAM_MAX_PAIRS = 4096


def _blocks_by_sort(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same layout as the one-program kernel from PyTorch ops (a stable sort; static shapes, no host sync)."""
    flat = ids.reshape(-1).long()
    P, dev = flat.numel(), flat.device
    blocks = max_blocks(P, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    nblk = (counts + block_m - 1) // block_m
    blk_end = nblk.cumsum(0)  # [E]
    order = flat.argsort(stable=True)  # [P] pairs grouped by expert, in their order within each
    e_sorted = flat[order]
    rank = torch.arange(P, device=dev) - (counts.cumsum(0) - counts)[e_sorted]  # place within its expert
    pairs = torch.full((blocks * block_m,), P, dtype=torch.int32, device=dev)
    pairs[(blk_end - nblk)[e_sorted] * block_m + rank] = order.int()
    ex = torch.searchsorted(blk_end, torch.arange(blocks, device=dev), right=True)
    return pairs, torch.where(ex < num_experts, ex, -1).int()


def expert_blocks(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [N, k] -> (pairs [B * block_m] int32, block_expert [B] int32); see the module docstring."""
    P = ids.numel()
    if P > ONE_PROGRAM_MAX_PAIRS:
        return _blocks_by_sort(ids, num_experts, block_m)
    blocks = max_blocks(P, num_experts, block_m)
    pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=ids.device)
    if blocks:
        _kernels()[0][(1,)](ids.reshape(-1).contiguous(), pairs, block_expert, P, blocks, BLOCK_M=block_m,
                            EP=pow2(num_experts, 16), PP=pow2(P, 16), BP=pow2(blocks, 16),
                            SP=pow2(blocks * block_m, 16), num_warps=8, **launch_options(ids, USE_PDL))
    return pairs, block_expert


# (BLOCK_N, BLOCK_K, num_warps, num_stages) by the GEMM's input width: the best of session 54's sweep on an H100
# (bf16, routed experts of 1-256 tokens, k = 8, weights warm in L2; benchmarks/moe_graphs_check.py): Qwen3-30B-A3B's
# (K 2048 / 768) at (64, 128, 4), DeepSeek-V3's (K 7168 / 2048) at (128, 128, 8), 5-8% faster than (64, 64, 4)
GEMM_CFG: tuple[int, int, int, int] | None = None  # set: every GEMM takes it (the benchmarks' sweeps)
WIDE_CFG = (128, 128, 8, 3)  # layers of 4,096 and wider (DeepSeek-V3's)
COMMON_CFG = (64, 128, 4, 3)  # narrower layers, unless a narrow tile below takes the GEMM


# The gate/up GEMM of a layer under 4,096 wide in blocks of 16 slots (decode, verify: few pairs an expert), with the
# experts cold (session 60, H100, benchmarks/moe_cold_sweep.py): gpt-oss-20b's at 1 / 4 / 8 / 32 / 64 tokens 51.8 /
# 150.5 / 235.0 / 343.7 / 349.0 us at (64, 128, 4, 3) against 48.0 / 146.3 / 229.0 / 337.4 / 343.3 here, Qwen3-30B-A3B's
# 22.9 / 61.9 / 107.6 / 228.9 / 255.5 against 20.7 / 61.4 / 106.3 / 227.1 / 255.7: twice the programs of half the
# features, each reading K in longer steps. The down GEMM gains nothing from it (gpt-oss 26.9 -> 27.6 us at 1 token).
NARROW_GATED_CFG = (32, 256, 4, 3)
# The down GEMM of such a layer for at most DOWN_FEW_PAIRS (token, expert) pairs (a one-row decode step of k <= 8
# experts), experts cold (session 61, H100): five stages in flight instead of three, Qwen3-30B-A3B's 12.06 -> 10.45
# us at one token (k = 8), gpt-oss-20b's 26.8 -> 26.5 (k = 4); at 4 tokens (32 / 16 pairs) Qwen3's lost (33.4 ->
# 34.6 us), so more pairs keep (64, 128, 4, 3). Whole decode steps (host_gap.py, graph replay, alternating): Qwen3-
# 30B-A3B 3.520 -> 3.482 ms, gpt-oss-20b 3.197 -> 3.139 ms. None: the common tile for every down GEMM.
NARROW_DOWN_FEW_CFG: tuple[int, int, int, int] | None = (64, 128, 4, 5)
DOWN_FEW_PAIRS = 8


def _gemm_cfg(width: int, gated: bool = False, block_m: int = 64, pairs: int | None = None
              ) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for a layer of this width (the wider of a GEMM's K and N: the
    hidden size), a gated (gate/up) GEMM or not, in blocks of `block_m` slots, for `pairs` (token, expert) pairs
    (None: unknown, the common tile)."""
    if GEMM_CFG is not None:
        return GEMM_CFG
    if width >= 4096:
        return WIDE_CFG
    if gated:
        return NARROW_GATED_CFG if block_m == 16 else COMMON_CFG
    few = pairs is not None and pairs <= DOWN_FEW_PAIRS and NARROW_DOWN_FEW_CFG is not None
    return NARROW_DOWN_FEW_CFG if few else COMMON_CFG


def fit_shared(cfg: tuple[int, int, int, int], block_m: int, gated: bool, itemsize: int,
               limit: int | None) -> tuple[int, int, int, int]:
    """`cfg` with BLOCK_K, then BLOCK_N, halved (down to 16) until its pipelined tiles fit `limit` bytes of shared
    memory (None: no limit, as the interpreter): a stage holds block_m x BLOCK_K of x and BLOCK_N x BLOCK_K of each
    weight half (two when gated), and Triton 3's pipeline keeps num_stages - 1 stages in flight (a float32 gate/up
    GEMM of DeepSeek-V3's width at (128, 128, 8, 3) asked for 2 x 139,264 bytes of an H100's 232,448 and failed
    to launch). The bf16 tiles above fit an H100 as they are."""
    BN, BK, warps, stages = cfg

    def need(bn: int, bk: int) -> int:
        return max(stages - 1, 1) * (block_m + (2 if gated else 1) * bn) * bk * itemsize

    while limit is not None and need(BN, BK) > limit and max(BN, BK) > 16:
        if BK >= BN:
            BK //= 2
        else:
            BN //= 2
    return BN, BK, warps, stages


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, pairs: torch.Tensor, block_expert: torch.Tensor, block_m: int,
                  P: int, a_div: int, out: torch.Tensor, gated: bool, scale: torch.Tensor | None,
                  bias: torch.Tensor | None = None, clamp: tuple[float, float] | None = None,
                  a_scale: bool = False, cfg: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    N = out.shape[1]
    K = a.shape[1]
    if cfg is None and GEMM_CFG is None:  # the default tile, fitted to the device's shared memory
        cfg = fit_shared(_gemm_cfg(max(K, N), gated, block_m, P), block_m, gated, w.element_size(),
                         shared_limit(a.device))
    BN, BK, warps, stages = cfg or _gemm_cfg(max(K, N))  # the hidden size: K of the first GEMM, N of the second
    grid = (block_expert.shape[0], -(-N // BN))
    if grid[0] and N:
        limit, alpha = clamp or (0.0, 0.0)
        _kernels()[1][grid](a, w, out, pairs, block_expert, scale if scale is not None else out,
                            bias if bias is not None else out, P, N, a.stride(0), w.stride(0), w.stride(1),
                            out.stride(0), bias.stride(0) if bias is not None else 0, N if gated else 0, limit, alpha,
                            K=K, A_DIV=a_div, GATED=gated, SCALE=scale is not None and not a_scale,
                            BIAS=bias is not None, CLAMP=clamp is not None, A_SCALE=a_scale,
                            IEEE=w.dtype == torch.float32,
                            UPCAST=interpreted() and w.dtype != torch.float32, BLOCK_M=block_m,
                            BLOCK_N=BN, BLOCK_K=min(BK, pow2(K, 16)), num_warps=warps, num_stages=stages,
                            **launch_options(a, USE_PDL))
    return out


SUM_BLOCK = 256  # features per program of the pair sum (Qwen3-30B-A3B's 2,048: 8 programs a token)


def sum_pairs(y: torch.Tensor, n_tokens: int, k: int, dtype: torch.dtype,
              add: torch.Tensor | None = None) -> torch.Tensor:
    """y [N * k, H] float32 -> [N, H] in dtype: each token's k rows summed in float32 in slot order and rounded once
    (PyTorch's `y.view(N, k, H).sum(1).to(dtype)` in one kernel instead of two); `add` [N, H] in dtype, when given,
    is added after that rounding and the sum rounded again (`routed + shared` of two dtype tensors)."""
    H = y.shape[1]
    out = torch.empty(n_tokens, H, dtype=dtype, device=y.device)
    if n_tokens and H:
        _kernels()[2][(n_tokens, -(-H // SUM_BLOCK))](y, out, add.contiguous() if add is not None else out, H,
                                                      K_PAIRS=k, ADD=add is not None, BLOCK=SUM_BLOCK,
                                                      **launch_options(y, USE_PDL))
    return out


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                    w2: torch.Tensor, add: torch.Tensor | None = None, b13: torch.Tensor | None = None,
                    b2: torch.Tensor | None = None, clamp: tuple[float, float] | None = None,
                    weight_inputs: bool = False) -> torch.Tensor:
    """sum_k weights[:, k] * expert_{ids[:, k]}(x) for SwiGLU experts (+ `add`, the shared experts' output, after
    the sum is rounded): x [N, H] -> [N, H] in x's dtype. gpt-oss's experts: biases b13 [E, 2I] (gate then up) and
    b2 [E, H], and `clamp` = (limit, alpha), its clamped SwiGLU. `weight_inputs` (Llama 4): sum_k expert_{ids[:, k]}
    (x * weights[:, k]), the weights and the products rounded to x's dtype."""
    N, k = ids.shape
    E, I2, H = w13.shape
    P = N * k
    bm = block_m_for(P, E)
    pairs, block_expert = expert_blocks(ids, E, bm)
    x = x.contiguous()
    # [P] float32 pair weights: Llama 4's scale the first GEMM's rows (rounded as the eager x-dtype product), the
    # others the second GEMM's output
    w = (weights.to(x.dtype) if weight_inputs else weights).reshape(-1).float().contiguous()
    act = _grouped_gemm(x, w13, pairs, block_expert, bm, P, k, torch.empty(P, I2 // 2, dtype=x.dtype,
                                                                              device=x.device), True,
                        w if weight_inputs else None, b13, clamp, a_scale=weight_inputs)
    y = _grouped_gemm(act, w2, pairs, block_expert, bm, P, 1, torch.empty(P, H, dtype=torch.float32,
                                                                            device=x.device),
                      False, None if weight_inputs else w, b2)
    return sum_pairs(y, N, k, x.dtype, add)
