"""GGUF dequantization speed: our torch paths (loading/gguf_quants.py) against gguf.quants' numpy, per type.

    python3 benchmarks/gguf_dequant_speed.py [--rows 4096] [--cols 4096] [--threads N]

One [rows, cols] tensor per type, best of 7 each: Gaussian weights quantized by gguf where it can (Q8_0, Q4_x, Q5_x),
random blocks with their f16 scales set to a normal 1e-3 for the K-quants (gguf cannot write them; random scale bytes
would be NaNs, infinities and subnormals, whose slow float paths would be what is timed). Prints a Markdown table of
million elements a second and whether the two agree bit for bit.
"""

from __future__ import annotations

import argparse
import time

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from eaglespec.loading.gguf_quants import dequantize

TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)


# where a K-quant block keeps its f16 scales (d, and dmin for Q4_K / Q5_K)
SCALE_AT = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def blocks(rng: np.random.Generator, q: Q, rows: int, cols: int) -> np.ndarray:
    """uint8 [rows, bytes per row] of type `q` holding ordinary weights (see the module docstring)."""
    block, size = gguf.GGML_QUANT_SIZES[q]
    if q not in SCALE_AT:
        raw = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.02, q)
        return raw.view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in SCALE_AT[q]:
        raw[..., at : at + 2] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def best(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"torch threads {torch.get_num_threads()}, tensor [{args.rows}, {args.cols}]")
    print("| type | gguf.quants (numpy) M/s | ours (torch) M/s | ours / numpy | bit-exact |")
    print("| --- | ---: | ---: | ---: | --- |")
    n = args.rows * args.cols
    for q in TYPES:
        block, size = gguf.GGML_QUANT_SIZES[q]
        raw = blocks(rng, q, args.rows, args.cols)
        ref = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, q), dtype=np.float32))
        ours = dequantize(raw, q)
        exact = torch.equal(ours, ref)
        t_np = best(lambda: gguf.quants.dequantize(raw, q))
        t_ours = best(lambda: dequantize(raw, q))
        print(f"| {q.name} | {n / t_np / 1e6:.0f} | {n / t_ours / 1e6:.0f} | {t_np / t_ours:.2f}x | {exact} |")


if __name__ == "__main__":
    main()
