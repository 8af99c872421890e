"""Token sampling as tensor functions (no host synchronisation, CUDA-graph friendly).

`target_probs(logits, temperature, top_k, top_p)` turns logits [N, V] into the distribution a request samples from,
per row: temperature 0 gives the one-hot of the argmax (so greedy is the degenerate case of sampling and every
verification rule treats both alike), otherwise softmax(logits / T) restricted to the top-k tokens (k = 0: off) and
then to the smallest top-p nucleus (p = 1: off; the most likely token always stays), renormalised. On CUDA Triton
kernels compute it (layers/sampling_kernel.py: no sort unless the row uses top-k or top-p).

`sample(probs, generator)` draws one token per row with the exponential-race trick (argmax of p / Exp(1)), which
needs no cumulative sums and no sync. `sample_probs(logits, ..., generator, table)` is `target_probs` plus that draw,
on CUDA inside the probability kernels (layers/sampling_kernel.py): the engine's sampled decode steps and sampled
draft levels take it. On the CPU (no graphs: the host may branch) rows without top-k and top-p skip
the sort, and the Exp(1) draws come from uniform ones (both several times cheaper there).

`greedy_ids(logits)`: logits [..., V] -> the argmax ids [...] int64, torch.argmax's rule (the first index among
equal maxima). On CUDA the two-stage Triton kernel (layers/argmax_kernel.py: PyTorch's one-block reduction cost
34.5 us per 128K-entry row on the H200), elsewhere torch.argmax. Every greedy choice of the engine (decode, the
verify's predictions, a chain's drafts) goes through it, so speculation and plain decoding choose alike.
"""

from __future__ import annotations

from typing import Union

import torch

from . import argmax_kernel, sampling_kernel
from .row_draws import RowDraws

# where random draws come from: a generator (None: the device's default), or a step's `RowDraws` (seeded rows)
Draws = Union[torch.Generator, RowDraws, None]


def greedy_ids(logits: torch.Tensor, table: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """logits [..., V] -> the argmax [...] (int64), or table[argmax] with a [V] int64 `table` (a drafter's draft id ->
    target id map); written into `out` ([...] int64, a column of a larger tensor) when given. On CUDA the argmax
    kernel, which does the lookup in its last stage and writes `out` itself."""
    if logits.is_cuda and argmax_kernel.fits(logits.shape[-1]):
        return argmax_kernel.argmax_rows(logits, table, out)
    ids = logits.argmax(-1)
    ids = ids if table is None else table[ids]
    return ids if out is None else out.copy_(ids)


def target_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """logits [N, V]; temperature/top_p [N] float; top_k [N] int -> probs [N, V] float32. On CUDA Triton kernels
    (layers/sampling_kernel.py), which sort nothing unless the row asks for top-k or top-p."""
    if logits.is_cuda and sampling_kernel.fits(logits.shape[-1]):
        return sampling_kernel.target_probs(logits, temperature, top_k, top_p)
    # on the CPU (no graphs: the host may branch) a batch whose rows use neither top-k nor top-p skips the sort
    filtered = logits.device.type != "cpu" or _filtered(top_k, top_p, logits.shape[-1])
    return target_probs_reference(logits, temperature, top_k, top_p, filtered)


def _filtered(top_k: torch.Tensor, top_p: torch.Tensor, V: int) -> bool:
    """Whether any row restricts its distribution (top-k below V, or top-p below 1): a host read, so the CPU's only
    (CUDA steps are graphs, which cannot branch on it)."""
    return bool(((top_k > 0) & (top_k < V)).any() or (top_p < 1).any())


# On the CPU a filtering row looks at its CPU_CANDIDATES largest entries (torch.topk) before it sorts the whole row:
# top-k's k-th value and top-p's nucleus usually lie among them (see `_filter`)
CPU_CANDIDATES = 1024


def target_probs_reference(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                           top_p: torch.Tensor, filtered: bool = True,
                           candidates: int | None = None) -> torch.Tensor:
    """`target_probs` in PyTorch operations on any device (the CPU's path; the kernel's reference): the row in
    descending order for top-k's k-th value and top-p's nucleus. `filtered=False` (the caller knows that no row uses
    top-k or top-p) skips both, and the sort: on the CPU it cost 6.7 ms of 8.7 per 49,152-entry row, the softmax 0.2
    ms. `candidates` (default: CPU_CANDIDATES on the CPU, none elsewhere, where a step may be a CUDA graph that
    cannot branch on values) orders only the largest entries first, with the same result (`_filter`)."""
    logits = logits.float()
    N, V = logits.shape
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / t[:, None]
    if not filtered:
        probs = torch.softmax(scaled, dim=-1)
    else:
        # top-k: keep logits >= the k-th largest (k = 0 or k >= V: keep all)
        k = torch.where((top_k <= 0) | (top_k >= V), torch.full_like(top_k, V), top_k).clamp(min=1)
        c = (CPU_CANDIDATES if logits.device.type == "cpu" else V) if candidates is None else candidates
        probs = None
        if c < V and bool(((k <= c) | (k == V)).all()):  # every k-th value among the candidates
            probs = _filter(scaled, k, top_p, *scaled.topk(c, dim=-1))
        if probs is None:  # the whole row in order
            probs = _filter(scaled, k, top_p, *scaled.sort(dim=-1, descending=True))
    onehot = torch.zeros_like(probs).scatter_(1, greedy_ids(logits)[:, None], 1.0)
    return torch.where(greedy[:, None], onehot, probs)


def _filter(scaled: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor, head: torch.Tensor,
            head_idx: torch.Tensor) -> torch.Tensor | None:
    """Top-k and top-p over rows whose C largest entries are `head` [N, C] (descending) at `head_idx` (C = V: the
    whole row sorted): the renormalised probabilities [N, V], or None when C < V and some row's nucleus may reach
    past its head. A token is dropped when the mass before it in the descending order already reaches p; past the
    head of a row with p < 1 that holds for every token when the head's own mass reaches p (a running sum of
    non-negative terms never decreases), so the result is the whole row's order's, up to the last bit of the running
    sum (a scan over C entries may round a prefix differently from one over V: a token whose preceding mass lies
    within that of p could change sides; none did in the tests) and the order of tied entries. On the CPU, 4 rows of
    49,152 at T 0.7, top-p 0.9: 16.7 -> 4.6 ms with peaked rows (session 24; MT-bench, S2 K1 D3 at that setting
    13.0 -> 15.8 tok/s)."""
    N, C = head.shape
    V = scaled.shape[1]
    kth = head.gather(1, (k.clamp(max=C) - 1)[:, None])
    kth = torch.where((k == V)[:, None], torch.full_like(kth, float("-inf")), kth)  # k = V: top-k is off, keep all
    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    head_probs = probs.gather(1, head_idx)
    mass = head_probs.cumsum(-1)
    before = mass - head_probs
    cut = (top_p < 1)[:, None]
    if C < V and not bool(((mass[:, -1:] >= top_p.float()[:, None]) | ~cut).all()):
        return None
    # (top_p = 1 keeps every token: the float32 running sum can reach 1 before the tail of tiny probabilities)
    drop_head = (before >= top_p.float()[:, None]) & cut
    drop_head[:, 0] = False
    drop = cut.expand(N, V) if C < V else torch.zeros_like(probs, dtype=torch.bool)
    drop = drop.scatter(1, head_idx, drop_head)
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(-1, keepdim=True)


def sample_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 generator: Draws = None, table: torch.Tensor | None = None,
                 kernels: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`target_probs` and one token per row drawn from it: logits [N, V] -> (ids [N] int64, probs [N, V] float32); with
    a [V] int64 `table` the ids are table[id] (a drafter's draft id -> target id). The draw is `sample`'s exponential
    race; with `kernels` (default: on CUDA) it runs inside the probability kernels (`sampling_kernel.sample_probs`),
    elsewhere as `sample(target_probs(...))`. Both take the same Exp(1) draws from `generator`, so they draw the same
    tokens from the same probabilities."""
    use = logits.is_cuda if kernels is None else kernels
    if use and sampling_kernel.fits(logits.shape[-1]):
        noise = _exponential(logits.shape, logits.device, generator)  # clamped inside the kernel
        return sampling_kernel.sample_probs(logits, temperature, top_k, top_p, noise, table)
    probs = target_probs(logits, temperature, top_k, top_p)
    return sample(probs, generator, table), probs


def sample(probs: torch.Tensor, generator: Draws = None,
           table: torch.Tensor | None = None) -> torch.Tensor:
    """probs [N, V] -> token ids [N] (int64; table[id] with a [V] int64 table, as `greedy_ids`). One-hot rows return
    their token exactly. The Exp(1) draws: on the CPU -log(1 - U) from uniform U (exponential_ cost 3.1 ms per 49,152
    entries there, rand + log1p 0.8 ms), elsewhere exponential_; a draw of 0 is raised to 1e-30 either way."""
    return greedy_ids(probs / exponential_noise(probs.shape, probs.dtype, probs.device, generator), table)


def exponential_noise(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, device: torch.device,
                      generator: Draws = None) -> torch.Tensor:
    """Exp(1) draws of `shape`, raised to >= 1e-30 (a draw of 0 would divide by zero in the race): on the CPU
    -log(1 - U) from uniform U, elsewhere exponential_ (see `sample`)."""
    return _exponential(shape, device, generator, dtype).clamp_min_(1e-30)


def _exponential(shape: tuple[int, ...] | torch.Size, device: torch.device, generator: Draws,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exp(1) draws, not clamped: on the CPU -log(1 - U) from uniform U, elsewhere exponential_ (seeded rows of a
    `RowDraws`: their own streams)."""
    gen = generator.generator if isinstance(generator, RowDraws) else generator
    if device.type == "cpu":
        base = torch.rand(shape, generator=gen, dtype=dtype).neg_().log1p_().neg_()
    else:
        base = torch.empty(shape, dtype=dtype, device=device).exponential_(generator=gen)
    return generator.exponential(tuple(shape), device, dtype, base) if isinstance(generator, RowDraws) else base


def uniform(shape: tuple[int, ...], device: torch.device, generator: Draws = None) -> torch.Tensor:
    """U[0, 1) float32 draws of `shape` (rows first): `torch.rand`, or a `RowDraws`' (seeded rows: their own)."""
    if isinstance(generator, RowDraws):
        return generator.uniform(shape, device)
    return torch.rand(shape, generator=generator, device=device)


def validate_sampling(temperature: float, top_p: float, top_k: int) -> None:
    """Raise RequestError for out-of-range sampling parameters."""
    from ..errors import RequestError

    if not temperature >= 0:
        raise RequestError(f"temperature must be >= 0 (got {temperature}); use 0 for greedy decoding")
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1] (got {top_p})")
    if top_k < 0:
        raise RequestError(f"top_k must be >= 0 (got {top_k}); 0 turns it off")
