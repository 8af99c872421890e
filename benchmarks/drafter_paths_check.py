"""Every EAGLE-3 drafter variant through the CUDA inference transforms against its eager module, on the GPU.

    python benchmarks/drafter_paths_check.py            # exits 1 on a mismatch

For each variant (plain EAGLE-3; `norm_before_residual`, vLLM speculators' flag; EAGLE-3.1's norm_before_fc +
norm_output and fc_norm; two and three decoder layers) and two widths (64, and SmolLM2's 576 with 9 heads of 64 over 3 KV heads), a random drafter
on a random target in float32 on CUDA: a plain copy, and one prepared as engines prepare it
(`engine.transforms.prepare_for_inference`: fused projections, the draft-input kernel, add + norm + gate/up,
few-row linears, short-query attention, elementwise kernels). Both run a catch-up of 4 tokens on 2 rows (fc over the
target's aux states; logits of each row's last token) and a 1-token draft step from their own hidden; logits and
hidden states must agree to 1e-4 of the largest value (float32, kernels summing in other orders; a wrong residual or
norm differs by tens of percent). The CPU tests run these kernels in Triton's interpreter; this runs them compiled.
"""

from __future__ import annotations

import sys
from copy import deepcopy
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny import tiny_drafter, tiny_llama  # noqa: E402

from eaglespec.engine.kv_cache import KVCache  # noqa: E402
from eaglespec.engine.transforms import fuse_projections, prepare_for_inference  # noqa: E402
from eaglespec.layers.context import ForwardContext  # noqa: E402

VARIANTS = {
    "eagle3": {},
    "norm_before_residual": dict(norm_before_residual=True),
    "norm_before_fc+norm_output": dict(norm_before_fc=True, norm_output=True),
    "fc_norm": dict(fc_norm=True),
    "norm_before_residual+norm_output": dict(norm_before_residual=True, norm_output=True),
    # multi-layer EAGLE-3 (vLLM's and speculators'): later layers are plain decoder layers with their own caches
    "two layers": dict(num_hidden_layers=2),
    "three layers+norm_output": dict(num_hidden_layers=3, norm_output=True),
}
WIDTHS = {64: dict(), 576: dict(num_attention_heads=9, num_key_value_heads=3, head_dim=64, intermediate_size=1536)}


def run(d, dev: torch.device, H: int, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 97, (2, 4), generator=g).to(dev)
    aux = (torch.randn(2, 4, 3 * H, generator=g) * 2).to(dev)
    kv = KVCache(d.num_layers, d.kv_cache_shapes(), 2, 16, torch.float32, dev)
    pos = (torch.arange(4)[None].expand(2, 4) + torch.tensor([[0], [2]])).to(dev)
    mask = torch.ones(4, 16, dtype=torch.bool).tril()[None].expand(2, 4, 16).to(dev)
    ctx = ForwardContext(positions=pos, write_index=pos, attn_mask=mask, kv=kv.layers(),
                         logits_index=torch.tensor([[3], [1]], device=dev))
    logits, h = d(toks, aux, ctx, from_target=True)
    at = torch.tensor([[4], [6]], device=dev)
    m2 = torch.zeros(2, 1, 16, dtype=torch.bool)
    m2[0, 0, :5] = True
    m2[1, 0, :7] = True
    ctx = ForwardContext(positions=at, write_index=at, attn_mask=m2.to(dev), kv=kv.layers())
    logits2, h2 = d(torch.tensor([[5], [7]], device=dev), h[:, -1:], ctx, from_target=False)
    return [logits, h, logits2, h2]


def main() -> int:
    dev = torch.device("cpu" if "--cpu" in sys.argv else "cuda")  # --cpu: a smoke run of this script itself
    bad = 0
    print("| variant | width | logits (catch-up / step) max rel. diff | hidden (catch-up / step) | ok |")
    print("| --- | ---: | --- | --- | --- |")
    for H, shape in WIDTHS.items():
        target = fuse_projections(tiny_llama(seed=0, hidden=H, **shape)).to(dev)
        for name, flags in VARIANTS.items():
            plain = tiny_drafter(target, seed=1, draft_vocab=50, std=0.05, hidden=H, **shape, **flags).to(dev)
            wired = prepare_for_inference(deepcopy(plain), dev, None, None)
            for d in (plain, wired):
                d.set_embed_and_head(*target.get_embed_and_head())
            with torch.inference_mode():
                a, b = run(plain, dev, H), run(wired, dev, H)
            rel = [((x - y).abs().max() / y.abs().max()).item() for x, y in zip(b, a)]
            ok = all(r <= 1e-4 for r in rel) and (wired.draft_input is not None or dev.type == "cpu")
            bad += not ok
            print(f"| {name} | {H} | {rel[0]:.1e} / {rel[2]:.1e} | {rel[1]:.1e} / {rel[3]:.1e} | "
                  f"{'yes' if ok else '**NO**'} |")
            if name == "norm_before_residual":  # a control: the wired copy with the flag flipped must be caught
                wired.midlayer.norm_before_residual = False
                with torch.inference_mode():
                    c = run(wired, dev, H)
                crel = [((x - y).abs().max() / y.abs().max()).item() for x, y in zip(c, a)]
                caught = min(crel[0], crel[1]) > 1e-2
                bad += not caught
                print(f"| control: {name} flipped in the wired copy | {H} | {crel[0]:.1e} / {crel[2]:.1e} | "
                      f"{crel[1]:.1e} / {crel[3]:.1e} | {'caught' if caught else '**NOT CAUGHT**'} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
