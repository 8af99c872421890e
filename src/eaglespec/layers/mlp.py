"""SwiGLU feed-forward: down(act(gate(x)) * up(x)), checkpoint names gate_proj / up_proj / down_proj; gpt-oss's
clamped variant (`ClampedSwiGLUMLP`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .fused_linear import fused_linear

_ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def split_gate_up(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """A checkpoint's fused `mlp.gate_up_proj.weight` (gate rows, then up rows: Phi-3's, GLM-4's) as the gate_proj /
    up_proj this module keeps; None for any other name."""
    if not name.endswith("mlp.gate_up_proj.weight"):
        return None
    base = name[: -len("gate_up_proj.weight")]
    gate, up = tensor.chunk(2)
    return [(f"{base}gate_proj.weight", gate), (f"{base}up_proj.weight", up)]


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[.., 2I] (gate then up) -> silu(gate) * up [.., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = _ACTS[act]
        self.act_name = act
        self.gated_act = silu_mul  # fused path; engine.transforms may swap in a compiled version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "gate_up_proj"):  # fused by engine.transforms
            if self.act_name == "silu":
                return self.down_proj(self.gated_act(self.gate_up_proj(x)))
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self.act(gate) * up)
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    def fuse_gate_up(self) -> None:
        """Replace gate/up_proj by one `gate_up_proj` (one GEMM). Checkpoint names are lost: inference only."""
        fused = fused_linear(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj
        self.gate_up_proj = fused


class ClampedSwiGLUMLP(nn.Module):
    """gpt-oss's expert: g = clamp(gate(x), max=limit), u = clamp(up(x), -limit, limit),
    down(g * sigmoid(alpha * g) * (u + 1)); every projection with a bias. Not a GatedMLP, so that no SiLU kernel or
    grouped-expert stacking written for the plain SwiGLU takes it."""

    def __init__(self, hidden_size: int, intermediate_size: int, limit: float, alpha: float) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size)
        self.up_proj = nn.Linear(hidden_size, intermediate_size)
        self.down_proj = nn.Linear(intermediate_size, hidden_size)
        self.limit, self.alpha = limit, alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate_proj(x).clamp(max=self.limit)
        u = self.up_proj(x).clamp(-self.limit, self.limit)
        return self.down_proj(g * torch.sigmoid(g * self.alpha) * (u + 1))
