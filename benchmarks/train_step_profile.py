"""Where a training step's time goes (`eaglespec train` on the GPU): the target's features forward, the drafter's
unrolled TTT forward, its loss, the backward and the optimiser, on random weights of SmolLM2-135M's shape with the
shipped drafter (its shape, vocabulary and weights) wired to it, and synthetic samples of the real runs' lengths
(mean ~270 tokens, 69% of them loss tokens), batches of <= 8,192 tokens padded to 64 as the trainer pads them.

Variants (`VARIANTS`, comma-separated; names joined by "+" combine; `base` is the code as it is): `old-loss` (the
TTT loss before session 41: a nonzero per step, the eager soft cross-entropy), `eager-ce` (the eager soft
cross-entropy), `cudnn` (TTT attention with cuDNN's SDPA allowed, as before session 41), `eager-features` (the
target's features forward eagerly instead of CUDA graphs per batch shape), `chain-attn` (the TTT attention of steps
>= 1 in the causal + diagonal form, `chain_step_attention`). Each variant gets its own
trainer; each first meets every batch shape once (timed: the first use of a shape pays cuDNN's plans, the
allocator; a variant's first uses are cold only when it runs first in its process), then N_STEPS steps per variant
in ROUNDS alternating rounds (wall time of `Trainer.train_step`, which ends on its one read of device values),
then 20 steps with a synchronisation after each phase (features / TTT forward / loss / backward / optimiser), and a
profiler table of one variant (PROFILE=name).

usage: python benchmarks/train_step_profile.py [N_STEPS]
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time

import torch

from eaglespec.bench.random_model import random_model
from eaglespec.engine.transforms import prepare_for_inference
from eaglespec.train import ttt
from eaglespec.train.dataset import TokenDataset, gather_batch
from eaglespec.train.drafter import drafter_from_checkpoint
from eaglespec.train.features import target_features
from eaglespec.train import soft_ce
from eaglespec.train import trainer as trainer_mod
from eaglespec.train.trainer import TrainConfig, Trainer

N_STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 60
VARIANTS = os.environ.get("VARIANTS", "base").split(",")
ROUNDS = int(os.environ.get("ROUNDS", 4))
PROFILE = os.environ.get("PROFILE", VARIANTS[0])
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU: a smoke test only
N_SAMPLES = int(os.environ.get("N_SAMPLES", 6000))


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


torch.manual_seed(0)

target = random_model("smollm2-135m", dev, torch.bfloat16, 0).model
prepare_for_inference(target, dev, None, None)


def synthetic_dataset(n: int, seed: int) -> TokenDataset:
    """n samples, lengths log-normal around 270 tokens (40..1024), the first ~31% of each a prompt (no loss)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.exp(torch.randn(n, generator=g) * 0.75 + 5.3).clamp(40, 1024).long()
    tokens = torch.randint(3, target.config.vocab_size, (int(lens.sum()),), generator=g)
    mask = torch.zeros(len(tokens), dtype=torch.bool)
    offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lens.cumsum(0)))
    for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        mask[s + int(0.31 * (e - s)):e] = True
    return TokenDataset(tokens, mask, offsets)


def old_ttt_loss(drafter, hiddens, feats, loss_mask, decay=0.8):
    """`ttt_loss` before session 41: a `nonzero` (a synchronisation) per step."""
    S = len(hiddens)
    d = loss_mask.device
    total, step_loss, correct, count = torch.zeros((), device=d), *(torch.zeros(S, device=d) for _ in range(3))
    for k, r in enumerate(hiddens):
        valid, am = ttt.step_targets(feats, loss_mask, k)
        b, j = valid.nonzero(as_tuple=True)
        logits = drafter.lm_head(drafter.norm(r[b, j]))
        logp = torch.log_softmax(logits.float(), dim=-1)
        p = feats.probs[b, j + 1 + k]
        n = torch.tensor(float(len(b)), device=d)
        ce = -(p * logp).sum(-1).sum() / n.clamp(min=1)
        total = total + decay**k * ce
        step_loss[k], correct[k], count[k] = ce.detach(), (logits.argmax(-1) == am[b, j]).sum().float(), n
    return ttt.TTTResult(total, step_loss, correct, count)


def _cudnn_sdpa(q, k, v, **kw):
    """TTT attention as before session 41: F.scaled_dot_product_attention with every backend, cuDNN's included."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


_step_attention = ttt.step_attention


def chain_step_attention(qh, keys, values):
    """TTT step k's attention in the causal + diagonal form: the [T, T] scores over step 0's keys (materialised, a
    GEMM) and k per-position dot products with steps 1..k's keys, one softmax over both, instead of one SDPA over
    (k+1)T keys under a mask that hides almost all of them (the memory-efficient kernel reads them all)."""
    k = len(keys) - 1
    if k == 0:
        return _step_attention(qh, keys, values)
    B, nh, T, D = qh.shape
    nkv = keys[0].shape[2]
    g = nh // nkv
    qg = qh.view(B, nkv, g, T, D)  # query head h reads KV head h // g
    k0 = keys[0].permute(0, 2, 1, 3)[:, :, None]  # [B, nkv, 1, T, D]
    v0 = values[0].permute(0, 2, 1, 3)[:, :, None]
    s0 = (qg @ k0.transpose(-1, -2)) * D**-0.5  # [B, nkv, g, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=qh.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    kd = torch.stack(keys[1:], 3).permute(0, 2, 1, 3, 4)[:, :, None]  # [B, nkv, 1, T, k, D]
    vd = torch.stack(values[1:], 3).permute(0, 2, 1, 3, 4)[:, :, None]
    sd = (qg[..., None, :] * kd).sum(-1) * D**-0.5  # [B, nkv, g, T, k]
    p = torch.softmax(torch.cat([s0, sd.to(s0.dtype)], -1).float(), -1).to(vd.dtype)
    o = p[..., :T] @ v0.to(p.dtype) + (p[..., T:, None] * vd).sum(-2)  # [B, nkv, g, T, D]
    return o.reshape(B, nh, T, D)


# what a variant changes (names joined by "+"): (module, attribute, value) patches, applied around its steps
PATCHES = {
    "base": [],
    "old-loss": [(trainer_mod, "ttt_loss", old_ttt_loss)],  # a nonzero per step, the eager soft CE
    "eager-ce": [(soft_ce, "_use_kernel", lambda x: False)],  # one nonzero, the eager soft CE
    "cudnn": [(ttt, "scaled_dot_product_attention", _cudnn_sdpa)],
    "chain-attn": [(ttt, "step_attention", chain_step_attention)],
    "eager-features": [],  # the target's features forward eagerly, not as CUDA graphs (set on the trainer: build)
}


@contextlib.contextmanager
def patched(variant: str):
    saved = []
    for name in variant.split("+"):
        for mod, attr, value in PATCHES[name]:
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, value)
    try:
        yield
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)


def build(variant: str) -> Trainer:
    drafter, vocab = drafter_from_checkpoint(target, "src/eaglespec/assets/smollm2-135m-eagle3")
    cfg = TrainConfig(work_dir=tempfile.mkdtemp(), aux_layers=(1, 14, 26),
                      batch_tokens=int(os.environ.get("BATCH_TOKENS", 8192)), max_steps=10_000, lr=1e-4,
                      progress=False, catch_signals=False)
    tr = Trainer(target, drafter, synthetic_dataset(N_SAMPLES, 0), None, vocab, cfg)
    if "eager-features" in variant.split("+"):
        tr.features.mode = "eager"
    return tr


def phases(tr: Trainer, ids: torch.Tensor) -> dict[str, float]:
    """One training step with a synchronisation after each phase: ms per phase."""
    out: dict[str, float] = {}
    t = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t
        sync()
        now = time.perf_counter()
        out[name] = (now - t) * 1e3
        t = now

    batch = gather_batch(tr.train_ds, ids, tr.pad_to)
    feats = tr.features(batch.tokens)
    mark("features")
    with tr._autocast():
        hiddens = ttt.ttt_hiddens(tr.drafter, batch.tokens, feats.aux, tr.cfg.ttt_steps)
        mark("ttt fwd")
        res = trainer_mod.ttt_loss(tr.drafter, hiddens, feats, batch.mask, tr.cfg.step_decay)
    mark("loss fwd")
    tr.opt.zero_grad(set_to_none=True)
    res.loss.backward()
    mark("backward")
    torch.nn.utils.clip_grad_norm_(list(tr.params.values()), tr.cfg.grad_clip)
    tr.opt.step()
    tr.sched.step()
    (res.correct / res.count.clamp(min=1)).tolist()
    mark("optimiser")
    return out


# one trainer per variant (the same target, drafter weights and data); each first meets every batch shape once
trainers, warm, n_shapes = {}, {}, {}
for variant in VARIANTS:
    tr = trainers[variant] = build(variant)
    t0 = time.perf_counter()
    seen: set[tuple[int, ...]] = set()
    with patched(variant):
        for ids in tr.batches:
            shape = tuple(gather_batch(tr.train_ds, ids, tr.pad_to).tokens.shape)
            if shape not in seen:
                seen.add(shape)
                tr.train_step(ids)
        sync()
    warm[variant], n_shapes[variant] = time.perf_counter() - t0, len(seen)
    print(f"{variant}: {len(seen)} shapes met first in {warm[variant]:.1f} s", flush=True)

# the graphs' features against the eager forward's, on a few batch shapes
tr = trainers[VARIANTS[0]]
for ids in tr.batches[:: max(1, len(tr.batches) // 4)]:
    tokens = gather_batch(tr.train_ds, ids, tr.pad_to).tokens
    f = tr.features(tokens)
    got = (f.aux.clone(), f.probs.clone(), f.argmax.clone())
    ref = target_features(tr.target, tokens, tr.vocab, tr.t2d_map)
    print(f"features {tuple(tokens.shape)} ({tr.features.mode}): aux max diff "
          f"{(got[0].float() - ref.aux.float()).abs().max().item():.3g}, probs max diff "
          f"{(got[1] - ref.probs).abs().max().item():.3g}, argmax equal {torch.equal(got[2], ref.argmax)}")

order = torch.randperm(len(trainers[VARIANTS[0]].batches), generator=torch.Generator().manual_seed(1)).tolist()
steps = order[:N_STEPS]
wall = {v: [] for v in VARIANTS}
toks = {v: 0 for v in VARIANTS}
for rnd in range(ROUNDS):  # alternating rounds: the host's speed drifts within a call
    for variant in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
        tr = trainers[variant]
        with patched(variant):
            sync()
            t0 = time.perf_counter()
            for i in steps:
                toks[variant] += tr.train_step(tr.batches[i]).tokens
            sync()
        wall[variant].append((time.perf_counter() - t0) / len(steps) * 1e3)

rows = []
for variant in VARIANTS:
    tr = trainers[variant]
    ph: dict[str, float] = {}
    with patched(variant):
        for i in steps[:20]:
            for k, v in phases(tr, tr.batches[i]).items():
                ph[k] = ph.get(k, 0.0) + v / 20
        if variant == PROFILE:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for i in steps[:10]:
                    tr.train_step(tr.batches[i])
                sync()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=70))
            cuda_us = sum(e.self_device_time_total for e in prof.key_averages())
            print(f"{variant}, profiled 10 steps: self CUDA time {cuda_us / 1e3 / 10:.1f} ms a step")
    ms = statistics.median(wall[variant])
    rows.append((variant, ms, toks[variant] / (sum(wall[variant]) / 1e3 * len(steps)), ph))
    print(f"{variant}: rounds " + " ".join(f"{w:.1f}" for w in wall[variant]) + " ms a step", flush=True)

print("\n| variant | ms a step (median of rounds) | K tokens/s | " + " | ".join(rows[0][3])
      + " | shapes | first uses s |")
print("|---|---:|---:|" + "---:|" * len(rows[0][3]) + "---:|---:|")
for v, ms, tps, ph in rows:
    print(f"| {v} | {ms:.1f} | {tps / 1e3:.1f} | " + " | ".join(f"{x:.1f}" for x in ph.values())
          + f" | {n_shapes[v]} | {warm[v]:.1f} |")
