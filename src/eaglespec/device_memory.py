"""How much memory a device can still give, for the checks that refuse work before an allocation would fail.

- `free_memory(device) -> (free, total)`: a CUDA device's free and total bytes (the driver's view);
- `room(device) -> int | None`: bytes this process can still allocate on a CUDA device: the driver's free memory plus
  what PyTorch's caching allocator holds unused; None off CUDA (the host's: `host_available`);
- `host_available() -> int | None`: the host's available memory (Linux's MemAvailable), None where it cannot be
  read;
- `gib(nbytes) -> str`: "12.3 GiB", for the messages.
Used by `loading.checkpoint.check_device_room` (weights; on the CPU through `host_available`), `ModelRunner.allocate`
(KV caches) and `engine.transforms.use_grouped_experts` (stacking a MoE layer's experts), `host_available` also by
`engine.transforms.use_cpu_linear` (the CPU's packed weight copies); tests replace `room`, `free_memory` and
`host_available`.
"""

from __future__ import annotations

import torch


def free_memory(device: torch.device) -> tuple[int, int]:
    return torch.cuda.mem_get_info(device)


def room(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free_memory(device)[0] + cached


def host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # "MemAvailable:   123456 kB"
    except (OSError, ValueError, IndexError):
        return None
    return None


def gib(nbytes: int) -> str:
    return f"{nbytes / 2.0**30:.1f} GiB"
