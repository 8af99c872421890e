"""Which inference transforms an EngineConfig applies where (engine/transforms.py): the defaults (None) mean CUDA
only, so CPU runs keep the plain, uncompiled layers unless asked."""

from __future__ import annotations

import torch
from tiny import tiny_llama

from eaglespec.config import EngineConfig
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.layers.norm import RMSNorm, rms_norm


def _norm_impls(model):
    return {m.impl for m in model.modules() if isinstance(m, RMSNorm)}


def test_defaults_are_cuda_only():
    cfg = EngineConfig()
    assert cfg.fuse_projections is None and cfg.compile is None
    m = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), cfg.fuse_projections, cfg.compile)
    attn = m.model.layers[0].self_attn
    assert hasattr(attn, "q_proj") and not hasattr(attn, "qkv_proj")  # not fused
    assert _norm_impls(m) == {rms_norm}  # not compiled


def test_explicit_fuse_on_the_cpu_keeps_the_outputs():
    from eaglespec.layers.context import ForwardContext

    ids = torch.tensor([[1, 2, 3, 4, 5]])
    plain = tiny_llama(seed=0)
    ref = plain(ids, ForwardContext.plain(1, 5, ids.device)).logits
    fused = prepare_for_inference(tiny_llama(seed=0), torch.device("cpu"), True, False)
    assert hasattr(fused.model.layers[0].self_attn, "qkv_proj")
    assert torch.allclose(fused(ids, ForwardContext.plain(1, 5, ids.device)).logits, ref, atol=1e-5)
