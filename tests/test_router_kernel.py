"""The MoE routers' selection as one Triton kernel (layers/router_kernel.py, under Triton's interpreter) against the
routers' PyTorch path: the softmax top-k router (Qwen3-MoE) and the sigmoid noaux_tc router with and without group
limits (DeepSeek-V3), float32 and bf16 logits; and `engine.transforms.use_router_kernel`."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are built (they are built on first use)

import pytest  # noqa: E402
import torch  # noqa: E402

from eaglespec.config import MoEConfig  # noqa: E402
from eaglespec.engine.transforms import use_router_kernel  # noqa: E402
from eaglespec.layers.moe import MoE, NoAuxRouter, SoftmaxTopKRouter  # noqa: E402
from eaglespec.layers.router_kernel import fits  # noqa: E402


def _cfg(E: int, k: int, scoring: str, n_group: int = 1, topk_group: int = 1, norm: bool = True,
         scale: float = 1.0) -> MoEConfig:
    return MoEConfig(n_routed_experts=E, num_experts_per_tok=k, n_shared_experts=0, moe_intermediate_size=8,
                     n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale, norm_topk_prob=norm,
                     scoring_func=scoring, topk_method="noaux_tc" if scoring == "sigmoid" else "greedy")


def _both(router: torch.nn.Module, x: torch.Tensor) -> tuple[tuple, tuple]:
    with torch.no_grad():
        router.fused = False
        ref = router(x)
        router.fused = True
        got = router(x)
    return ref, got


CASES = [  # (E, k, scoring, n_group, topk_group, norm, scale)
    (6, 2, "softmax", 1, 1, False, 1.0), (8, 1, "softmax", 1, 1, True, 1.0), (128, 8, "softmax", 1, 1, True, 1.0),
    (8, 3, "sigmoid", 4, 2, True, 2.5), (8, 2, "sigmoid", 1, 1, False, 1.0), (256, 8, "sigmoid", 8, 4, True, 2.5),
    (384, 8, "sigmoid", 1, 1, True, 2.827), (16, 3, "sigmoid", 16, 3, True, 1.0),  # groups of one
]


@pytest.mark.parametrize("E,k,scoring,n_group,topk_group,norm,scale", CASES)
def test_the_kernel_selects_what_the_router_selects(E, k, scoring, n_group, topk_group, norm, scale):
    cfg = _cfg(E, k, scoring, n_group, topk_group, norm, scale)
    torch.manual_seed(E + k)
    router = (NoAuxRouter if scoring == "sigmoid" else SoftmaxTopKRouter)(32, cfg)
    with torch.no_grad():
        router.weight.normal_(0, 0.5)
        if scoring == "sigmoid":
            router.e_score_correction_bias.normal_(0, 0.3)  # moves choices away from the unbiased order
    x = torch.randn(37, 32)
    (w_ref, i_ref), (w, i) = _both(router, x)
    assert i.dtype == torch.int64 and w.dtype == torch.float32 and i.shape == w.shape == (37, k)
    assert torch.equal(i, i_ref)
    assert torch.allclose(w, w_ref, rtol=1e-5, atol=1e-7)
    if n_group > 1:  # the group limit held: every chosen expert lies in one of topk_group groups
        assert all(len(set((row // (E // n_group)).tolist())) <= topk_group for row in i)


def test_bf16_logits_pick_experts_of_the_same_scores():
    """bf16 logits tie now and then; the kernel takes the lower id where torch.topk may take another: the chosen
    weights, largest first, agree."""
    router = SoftmaxTopKRouter(64, _cfg(128, 8, "softmax")).to(torch.bfloat16)
    x = torch.randn(50, 64, dtype=torch.bfloat16)
    (w_ref, _), (w, i) = _both(router, x)
    assert torch.allclose(w, w_ref, rtol=1e-5) and (i.sort(1).values.diff(1) > 0).all()


def test_shapes_the_kernel_takes():
    assert fits(256, 8) and fits(384, 1) and fits(8, 4) and not fits(384, 8) and not fits(96, 3)


def test_use_router_kernel_marks_the_routers_it_fits():
    moes = [MoE(16, _cfg(8, 2, "softmax")), MoE(16, _cfg(256, 8, "sigmoid", 8, 4)),
            MoE(16, _cfg(96, 2, "sigmoid", 3, 2))]
    use_router_kernel(torch.nn.ModuleList(moes))
    assert [m.gate.fused for m in moes] == [True, True, False]
