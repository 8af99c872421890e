"""Block sizes of our Triton kernels: `tl.arange` spans a power of two, so every launcher rounds its extents up.

`pow2(n, least=1) -> int`: the smallest power of two >= max(n, least) (n <= 0 counts as 1); `least` is the kernel's
floor, e.g. 16 where the block feeds `tl.dot`.
"""

from __future__ import annotations


def pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << (max(n, 1) - 1).bit_length())
