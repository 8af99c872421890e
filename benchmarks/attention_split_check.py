"""How should the short-query attention split the cache (layers/short_attention_kernel.py)? Per step shape, the
time of 30 layers' attention in one CUDA graph under each plan, and its largest difference from SDPA.

Each case is (rows, query tokens per row, key-length bucket K) as the engine's graphs run them: SmolLM2's heads (9
query, 3 kv, 64 wide), bf16, 30 layers with caches of their own (so that no layer finds another's keys in L2), rows of
random lengths between K / 4 and K - T (continuous batching: most rows shorter than their bucket), each row's last T
positions a causal block. Plans (module settings, set per plan; each compiles its own kernels):
  old      blocks of 64 positions, hidden blocks skipped at every size, the combine's loop not unrolled (until
           session 25; session 25's first calls also timed programs that took several blocks: slower everywhere)
  new      the module's settings
  kv64 / kv256   new with blocks of 64 / 256 positions
  noskip / skip  new, hidden blocks read beside their mask at every size / skipped at every size
  loop     new with the combine's loop not unrolled

usage: python benchmarks/attention_split_check.py OUT_DIR [--plans=old,new,...] [--cases=32:8:512,...]
"""

from __future__ import annotations

from probe_script import CPU, DEV, DT, Emitter, option, per_call_us  # noqa: E402

import torch  # noqa: E402

from eaglespec.layers import short_attention_kernel as sak  # noqa: E402
from eaglespec.layers.attention import sdpa  # noqa: E402

LAYERS = 30 if not CPU else 2
H, HKV, D = (9, 3, 64) if not CPU else (4, 2, 16)
PLANS = {
    "old": {"BLOCK_KV": 64, "SKIP_MIN_ROWS": 1, "UNROLL_MAX_SPLITS": 0},  # the kernels until session 25
    "new": {},  # the module's settings
    "kv64": {"BLOCK_KV": 64}, "kv256": {"BLOCK_KV": 256}, "noskip": {"SKIP_MIN_ROWS": 1 << 20},
    "skip": {"SKIP_MIN_ROWS": 1}, "loop": {"UNROLL_MAX_SPLITS": 0},
}
DEFAULTS = {k: getattr(sak, k) for k in ("BLOCK_KV", "SKIP_MIN_ROWS", "UNROLL_MAX_SPLITS")}
CASES = "1:1:512,1:4:512,8:1:512,8:8:512,32:1:512,32:4:512,32:8:512,32:8:1024" if not CPU else "2:3:128"
plans = option("plans", ",".join(PLANS)).split(",")
cases = [tuple(int(x) for x in c.split(":")) for c in option("cases", CASES).split(",")]
emit = Emitter("attention_split_check.json")


def make_case(B: int, T: int, K: int, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    lens = torch.randint(K // 4, K - T + 1, (B,), generator=g)
    mask = torch.zeros(B, T, K, dtype=torch.bool)
    for b in range(B):
        mask[b, :, : lens[b]] = True
        mask[b, :, lens[b]: lens[b] + T] = torch.ones(T, T, dtype=torch.bool).tril()
    gd = torch.Generator(device=DEV).manual_seed(seed)
    layers = [tuple(torch.randn(*shape, generator=gd, device=DEV).to(DT)
                    for shape in ((B, T, H, D), (B, K + 64, HKV, D), (B, K + 64, HKV, D))) for _ in range(LAYERS)]
    return layers, torch.arange(B, device=DEV), mask.to(DEV)


for B, T, K in cases:
    layers, rows, mask = make_case(B, T, K, seed=B * 1000 + T + K)
    q0, k0, v0 = layers[0]
    ref = sdpa(q0.float(), k0[:, :K].float(), v0[:, :K].float(), mask, None)
    row = {"rows": B, "T": T, "K": K}
    for name in plans:
        for key, value in {**DEFAULTS, **PLANS[name]}.items():
            setattr(sak, key, value)
        nsplit = -(-K // sak.BLOCK_KV)
        out = sak.short_attention(q0, k0, v0, rows, mask)
        err = (out.float() - ref).abs().max().item()

        def step() -> None:
            for q, kc, vc in layers:
                sak.short_attention(q, kc, vc, rows, mask)

        us = per_call_us(step, calls=10) / LAYERS
        row[name] = round(us, 2)
        emit({"rows": B, "T": T, "K": K, "plan": name, "splits": nsplit,
              "us_per_layer": round(us, 2), "max_abs_diff": round(err, 4)})
    print("TABLE", " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
for key, value in DEFAULTS.items():
    setattr(sak, key, value)
