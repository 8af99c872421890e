"""A linear layer over a GGUF's own 4-bit weights on the CPU, through PyTorch's groupwise 4-bit kernel.

`Int4Linear.from_weight(w, bias)`: w float32 [N, K] as the GGUF loader dequantized it (loading/gguf_quants.py). Where
every group of 32 weights along K is a Q4_1 group (w = d q + m, q in 0..15, d and m float16) or a Q4_0 one (w =
d (q - 8)), the layer holds the codes once, packed by `aten._convert_weight_to_int4pack_for_cpu`, and multiplies
through `aten._weight_int4pack_mm_for_cpu` (w = (q - 8) scale + zero per group, bf16 activations, reading 4.5 bits a
weight instead of float32's 32); a Q8_0 tensor (w = d q, q in -128..127: SmolLM2's tied embedding, its head) as two
such products, q = 16 hi + lo (hi in -8..7 with scale 16 d, lo in 0..15 with scale d and zero 8 d), summed in float32.
Other GGUF groups (Q4_K, Q5_0 / Q5_1 / Q5_K, Q6_K: llama.cpp's K-quant mixes) are recovered by
layers/kquant_groups.py as one, two or four such products a row, in runs of rows where a fused projection mixes them
(Q4_K_M's Q4_K q / k rows and Q6_K v rows). Anything else returns None (`from_weight`): the caller names the tensor
(engine/int4_weights.py).

`forward(x)`: x [..., K] bf16 -> [..., N]: bf16 for one product a row, float32 for more (the products' sum, a Q8_0
head's logits keep it) or for runs of rows. The kernel takes scale and zero as bf16, so a Q4_1 group's zero (m + 8 d)
and any scale rounded to bf16 differ from the file's by up to 2^-9 of the group's scale: the weights are the GGUF's to
that rounding, not bit for bit.

Why this kernel (docs/benchmarks.md, "Session 62" and "Session 69"): it is row-count invariant (each row of an M-row
product has the bits of the same row multiplied alone, measured for SmolLM2's shapes at 1-8 rows on an AVX-512 EPYC
and an AVX2 one, and end to end on an AMX Xeon; `tests/test_int4_weights.py` checks it on the machine that runs the
tests), which is what makes a speculative verify of D tokens give plain decoding's tokens in bf16; and with cold
weights it costs about one row's time up to 3 rows (SmolLM2's 30 layers of projections on the AVX2 EPYC: 11.8 / 12.2 /
14.7 / 28.2 ms at 1 / 3 / 4 / 6 rows), though it is compute-bound past one row once the weights are cached (gate/up
0.24 / 0.41 ms at 1 / 3 rows there).
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32  # weights per group along K: the GGUF block of Q4_0 / Q4_1 / Q8_0, and the kernel's group
_INNER_K_TILES = 1  # `_convert_weight_to_int4pack_for_cpu`'s tiling argument (its CPU layout ignores it)
N_MULTIPLE = 16  # the packing takes a multiple of 16 output rows
_CHUNK_ELEMENTS = 1 << 18  # weights a chunk of the recoveries here and in kquant_groups (as gguf_quants dequantizes)
_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu
_PACK = torch.ops.aten._convert_weight_to_int4pack_for_cpu
_PACK_ROWS = 64  # rows the CPU packing lays out together: packed apart in blocks of 64, rows pack as in one call


def _f16(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded through float16, as the GGUF stores a block's d and m."""
    return x.half().float()


def row_chunks(n_rows: int, k: int) -> list[slice]:
    """Slices of rows of about _CHUNK_ELEMENTS weights each (a chunk's intermediates stay in the cache)."""
    step = max(1, _CHUNK_ELEMENTS // k)
    return [slice(i, i + step) for i in range(0, n_rows, step)]


def _four_bit_chunk(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """g float32 [n, groups, GROUP] -> (codes float [n, groups, GROUP], scale [n, groups, 1], zero [n, groups, 1])
    or None (`four_bit_groups`)."""
    lo, hi = torch.aminmax(g, dim=-1, keepdim=True)
    # Q4_1: w = d q + m (the loader's float32 product and sum); a constant group has d = 0 and every q 0
    d1 = _f16((hi - lo) / 15)
    q1 = ((g - lo) / d1.clamp(min=1e-30)).round_().clamp_(0, 15)
    ok1 = ((d1 * q1 + lo) == g).all(-1, keepdim=True)
    if bool(ok1.all()):  # every group Q4_1's (the usual case: one type a tensor)
        return q1, d1, lo + 8 * d1
    # Q4_0: w = d (q - 8), the largest magnitude at q = 0
    e = torch.where(-lo > hi, lo, hi)
    d0 = _f16(-e / 8)
    q0 = torch.where(d0 != 0, g / torch.where(d0 != 0, d0, 1.0) + 8, torch.full_like(g, 8.0)).round_().clamp_(0, 15)
    ok0 = ((d0 * (q0 - 8)) == g).all(-1, keepdim=True)
    if not bool((ok1 | ok0).all()):
        return None
    # (q - 8) d + (m + 8 d) = d q + m
    return torch.where(ok1, q1, q0), torch.where(ok1, d1, d0), torch.where(ok1, lo + 8 * d1, torch.zeros_like(d0))


def four_bit_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """w float32 [N, K] (K a multiple of GROUP) -> (codes int32 [N, K] in 0..15, scale [N, K / GROUP], zero [N, K /
    GROUP]) in the kernel's form w = (codes - 8) scale + zero, or None where some group is neither a Q4_1 group (w = d
    q + m exactly as the loader computed it, d = (max - min) / 15 as float16, m the minimum: a Q4_1 block holds its
    minimum at code 0 and its maximum at 15; zero = m + 8 d) nor a Q4_0 one (w = d (q - 8) exactly, d = -e / 8 for the
    group's largest magnitude e, which Q4_0 puts at code 0 and no other element matches; zero = 0). Computed a chunk
    of rows at a time, stopping at the first chunk that fails (an 8-bit tensor's first)."""
    N, K = w.shape
    g = w.float().reshape(N, K // GROUP, GROUP)
    codes = torch.empty(N, K, dtype=torch.int32)
    scale, zero = torch.empty(N, K // GROUP), torch.empty(N, K // GROUP)
    for rows in row_chunks(N, K):
        part = _four_bit_chunk(g[rows])
        if part is None:
            return None
        codes[rows] = part[0].flatten(1)
        scale[rows], zero[rows] = part[1][..., 0], part[2][..., 0]
    return codes, scale, zero


def eight_bit_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w float32 [N, K] -> (q int32 [N, K] in -128..127, d [N, K / GROUP]) with w = d q exactly, where every group is
    a Q8_0 block (d = amax / 127 as float16: llama.cpp puts the largest magnitude at +-127), else None. A chunk of
    rows at a time."""
    N, K = w.shape
    g = w.float().reshape(N, K // GROUP, GROUP)
    q_all, d_all = torch.empty(N, K, dtype=torch.int32), torch.empty(N, K // GROUP)
    for rows in row_chunks(N, K):
        c = g[rows]
        d = _f16(c.abs().amax(-1, keepdim=True) / 127)
        q = (c / d.clamp(min=1e-30)).round_().clamp_(-128, 127)
        if not bool((d * q == c).all()):
            return None
        q_all[rows], d_all[rows] = q.flatten(1), d[..., 0]
    return q_all, d_all


def quantize_groups(w: torch.Tensor, refits: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w float [N, K] (K a multiple of GROUP), any values -> (codes int32 [N, K] in 0..15, scale [N, K / GROUP], zero
    [N, K / GROUP]) in the kernel's form w ~ (codes - 8) scale + zero: lossy (a drafter's weights, whose output only
    proposes tokens: engine/int4_drafter.py). Each group of 32 starts from its range (code 0 its minimum, 15 its
    maximum), then `refits` times takes the scale and zero that fit its codes least-squares and rounds the codes
    again; scale and zero are bf16 values (the kernel's type), the codes rounded against them."""
    N, K = w.shape
    g = w.float().reshape(N, K // GROUP, GROUP)
    lo, hi = torch.aminmax(g, dim=-1, keepdim=True)
    bf = (lambda t: t.to(torch.bfloat16).float())  # noqa: E731
    scale = bf((hi - lo) / 15)
    zero = bf(lo + 8 * scale)
    for i in range(refits + 1):
        codes = torch.where(scale != 0, (g - zero) / torch.where(scale != 0, scale, 1.0) + 8,
                            torch.full_like(g, 8.0)).round_().clamp_(0, 15)
        if i == refits:
            break
        c = codes - 8  # least squares of g on (c, 1) per group
        cm, gm = c.mean(-1, keepdim=True), g.mean(-1, keepdim=True)
        var = ((c - cm) ** 2).mean(-1, keepdim=True)
        s_ls = ((c - cm) * (g - gm)).mean(-1, keepdim=True) / torch.where(var > 0, var, 1.0)
        scale = torch.where(var > 0, bf(s_ls), scale)
        zero = bf(torch.where(var > 0, gm - s_ls * cm, zero))
    return codes.to(torch.int32).reshape(N, K), scale[..., 0], zero[..., 0]


class TermBuilder:
    """One 4-bit product built from its rows a piece at a time: `feed(codes, scale, zero)` with codes [n, K] (an
    integer type, 0..15) and scale, zero [n, K / GROUP], in row order; `finish()` -> the _Term of every row fed.

    The codes are packed a block of rows at a time through one int32 buffer (the packing takes int32): rows pack apart
    from each other in blocks of _PACK_ROWS rows (tested), so the blocks' packed rows, concatenated, are the whole
    tensor's. Why: a whole tensor's int32 copy, 4 bytes a weight, was new memory each time (a [11264, 2048] gate/up
    packed 1.8x faster in blocks, a [2048, 5632] down 2.5x; 2 cores), and a recovery that feeds each chunk of rows as
    it finds it (layers/kquant_groups.py) never holds a whole tensor's codes (a 128K-token Q6_K head's four terms:
    four [128K, K] uint8 arrays and their concatenations before; docs/benchmarks.md "Session 76")."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.block = max(_PACK_ROWS, (1 << 20) // max(k, 1) // _PACK_ROWS * _PACK_ROWS)  # rows: ~4 MB of int32
        self.buf = torch.empty(self.block, k, dtype=torch.int32)
        self.staged = 0  # rows in buf not yet packed
        self.n = 0  # rows fed
        self.packed: list[torch.Tensor] = []
        self.scales: list[torch.Tensor] = []
        self.zeros: list[torch.Tensor] = []
        self.codes: list[torch.Tensor] | None = None  # a build whose packing does not lay out rows: kept whole

    def feed(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> None:
        self.scales.append(scale)
        self.zeros.append(zero)
        self.n += codes.shape[0]
        if self.codes is not None:
            self.codes.append(codes)
            return
        i = 0
        while i < codes.shape[0]:
            take = min(codes.shape[0] - i, self.block - self.staged)
            self.buf[self.staged : self.staged + take].copy_(codes[i : i + take])
            self.staged += take
            i += take
            if self.staged == self.block:
                self._flush()
                if self.codes is not None:  # (the first block found the layout not of rows)
                    self.codes.append(codes[i:])
                    return

    def _flush(self) -> None:
        rows = self.staged + (-self.staged % N_MULTIPLE)  # a last block padded with code-0 rows (scale 0: nothing)
        self.buf[self.staged : rows].zero_()
        got = _PACK(self.buf[:rows], _INNER_K_TILES)
        self.staged = 0
        if not self.packed and got.shape[0] != rows:  # another build's layout: pack the whole tensor at the end
            self.codes = [self.buf[:rows].clone()]
            return
        self.packed.append(got)

    def finish(self) -> "_Term":
        if self.staged:
            self._flush()
        n_pad = self.n + (-self.n % N_MULTIPLE)
        scale, zero = (torch.cat(ts) for ts in (self.scales, self.zeros))
        pad = n_pad - self.n  # the padding rows' scale and zero 0
        scale, zero = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (scale, zero))
        if self.codes is not None:
            codes = torch.cat([c.to(torch.int32) for c in self.codes])
            codes = torch.cat([codes, codes.new_zeros(n_pad - codes.shape[0], self.k)])
            packed = _PACK(codes.contiguous(), _INNER_K_TILES)
        else:
            packed = self.packed[0] if len(self.packed) == 1 else torch.cat(self.packed)
        self.packed, self.codes = [], None
        return _Term(packed, torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(torch.bfloat16), self.n)


class _Term:
    """One packed 4-bit product: codes packed for the kernel and [K / GROUP, N', 2] bf16 (scale, zero), N' = n
    rounded up to a multiple of N_MULTIPLE (the kernel's requirement: the padding rows have scale and zero 0, and
    their outputs are dropped). Built by TermBuilder, or from a whole tensor's codes by `of`."""

    def __init__(self, packed: torch.Tensor, scale_zero: torch.Tensor, n: int) -> None:
        self.packed, self.scale_zero, self.n = packed, scale_zero, n

    @staticmethod
    def of(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> "_Term":
        """codes [N, K] (0..15), scale and zero [N, K / GROUP]."""
        b = TermBuilder(codes.shape[1])
        b.feed(codes, scale, zero)
        return b.finish()

    def __call__(self, x2: torch.Tensor) -> torch.Tensor:
        y = _INT4_MM(x2, self.packed, GROUP, self.scale_zero)
        return y if y.shape[1] == self.n else y[:, : self.n].contiguous()


def _summed(terms: list[_Term], x2: torch.Tensor) -> torch.Tensor:
    """x2 [M, K] bf16 -> the terms' products summed: bf16 for one term, else float32 (each row's bits whatever the
    rows beside it: each product is, and the sum is elementwise)."""
    if len(terms) == 1:
        return terms[0](x2)
    y = terms[0](x2).float()
    for t in terms[1:]:
        y += t(x2).float()
    return y


class Int4Linear(nn.Module):
    """nn.Linear's function over 4-bit groups (module docstring). `weight`: the module's original weight Parameter
    where callers need it (a tied head's embedding: `get_embed_and_head`), else None; the products never read it."""

    def __init__(self, terms: list[_Term], out_features: int, in_features: int, bias: torch.Tensor | None,
                 weight: nn.Parameter | None = None, runs: list[tuple[int, int, list[_Term]]] | None = None) -> None:
        super().__init__()
        self.terms = terms  # every product the layer runs (all runs' where `runs` is given)
        # None: every row of the output is the sum of `terms`; else runs of rows (start, end, their terms), each
        # summed, concatenated along the output (a fused projection whose rows take different counts of terms)
        self.runs = runs
        self.in_features, self.out_features = in_features, out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16), requires_grad=False)
        self.weight = weight

    @classmethod
    def from_weight(cls, w: torch.Tensor, bias: torch.Tensor | None = None, keep: nn.Parameter | None = None
                    ) -> "Int4Linear | None":
        """The layer for float32 weights `w` [N, K] of 4-bit or Q8_0 groups, or None (module docstring). `keep`: the
        Parameter to expose as `weight` (a tied head's embedding)."""
        N, K = w.shape
        if K % GROUP:
            return None
        four = four_bit_groups(w)
        if four is not None:
            return cls([_Term.of(*four)], N, K, bias, keep)
        eight = eight_bit_groups(w)
        if eight is not None:
            q, d = eight
            hi, lo = torch.div(q, 16, rounding_mode="floor"), q % 16  # q = 16 hi + lo
            # hi: ((hi + 8) - 8) 16 d; lo: (lo - 8) d + 8 d
            terms = [_Term.of(hi + 8, 16 * d, torch.zeros_like(d)), _Term.of(lo, d, 8 * d)]
            return cls(terms, N, K, bias, keep)
        from .kquant_groups import kquant_runs  # (it builds on this module: imported here, not at the top)

        def feed(builders: list[TermBuilder], terms: list) -> None:
            for b, t in zip(builders, terms):
                b.feed(*t)

        # K-quant and 5-bit groups: each chunk of rows packed as it is recovered
        runs = kquant_runs(w, lambda k: [TermBuilder(K) for _ in range(k)], feed)
        if runs is None:
            return None
        built = [(a, b, [t.finish() for t in ts]) for a, b, ts in runs]
        flat = [t for _, _, ts in built for t in ts]
        return cls(flat, N, K, bias, keep, runs=built if len(built) > 1 else None)

    @classmethod
    def quantize(cls, w: torch.Tensor, bias: torch.Tensor | None = None) -> "Int4Linear | None":
        """The layer for any float weights `w` [N, K] quantized to 4-bit groups (`quantize_groups`: lossy), or None
        where K is not a multiple of GROUP."""
        N, K = w.shape
        return cls([_Term.of(*quantize_groups(w))], N, K, bias) if K % GROUP == 0 else None

    def mm(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, K] bf16, contiguous -> [M, N], bias added: `forward` without its reshapes and module call (~10 us,
        half a small product's time; the 4-bit path's steps call it directly: engine/int4_step.py)."""
        if self.runs is None:
            y = _summed(self.terms, x2)
        else:  # each run's output rows, as float32 (a one-term run's bf16 widened: exact)
            y = torch.cat([_summed(ts, x2).float() for _, _, ts in self.runs], dim=1)
        return y if self.bias is None else y + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        return self.mm(x2).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kind = "4-bit" if len(self.terms) == 1 else f"{len(self.terms)} 4-bit products"
        if self.runs is not None:
            kind += f" in {len(self.runs)} runs of rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}, group={GROUP}"
