"""Soft, hard or mixed labels for a drafter? A CPU probe of which loss gives the higher top-1 agreement with the target.

Greedy speculative decoding accepts a draft token only when it equals the target's argmax, so what a drafter needs
is top-1 agreement; training uses the soft cross-entropy -sum_v p_v log q_v against the target's distribution
restricted to the draft vocabulary and renormalised (train/features.py, train/ttt.py). This probe trains the readout
of benchmarks/aux_layer_probe.py (copied, as that script runs on import) once per loss, on the same positions, with
the same initialisation and batch order per seed, and compares:
  soft      -sum_v p_v log q_v                       (what training uses now)
  hard      -log q_a, a = the target's argmax (draft id)
  mix0.5    0.5 soft + 0.5 hard
  sharp0.5  soft against p^(1/T) renormalised, T = 0.5
Readout: [RMSNorm(h_l(t)) for l in --layers] + [RMSNorm(emb(t+1))] -> linear to H -> one SiLU-gated MLP block
(residual) -> the target's final RMSNorm -> its frozen lm_head rows of the draft vocabulary; it predicts token t+2.
Labels come from the target's own forward: its full-vocabulary distribution at position t+1 (argmax, top probability)
and that distribution restricted to the draft vocabulary (the shipped drafter's `t2d`) and renormalised, recomputed
per batch from the normed final hidden state (exact: softmax of the kept rows of the logits).

Positions: SmolLM2's regenerated answers (REGEN_DIR/shard-*.jsonl, chat template, first 512 tokens), t+1 and t+2
assistant tokens outside deep repetition loops (`mask_loops`, keep 32), the target's argmax at t+1 inside the draft
vocabulary (as ttt.py counts them). The last N_EVAL positions are held out.

Reported per (loss, seed): held-out top-1 agreement with the target's argmax, split by the target's full-vocabulary
top probability (< 0.5, >= 0.5), top-1 on the first N_EVAL training positions (over/underfit), held-out soft CE (against
the T = 1 renormalised p) and hard CE; then a Markdown table of means over seeds with the across-seed std, and the
paired difference of each loss to soft (same seed) with its std.
No attention over earlier positions: it measures a capacity-limited predictor, not a drafter.

usage: python benchmarks/loss_probe.py REGEN_DIR [--n-train 60000] [--n-eval N_TRAIN/3] [--seeds 0,1,2]
       [--losses soft,hard,mix0.5,sharp0.5] [--layers 1,14,26] [--epochs 1] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from eaglespec.api import load_drafter
from eaglespec.assets import default_drafter_path
from eaglespec.layers.context import ForwardContext
from eaglespec.loading.checkpoint import load_model
from eaglespec.train.dataset import mask_loops, tokenize_conversation
from eaglespec.train.regenerate import read_cache

LOSSES = {"soft": (0.0, 1.0), "hard": (1.0, 1.0), "mix0.5": (0.5, 1.0), "sharp0.5": (0.0, 0.5)}  # (hard weight, T)


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


class Readout(torch.nn.Module):
    """aux_layer_probe's readout: linear -> SiLU-gated MLP (residual) -> final norm -> frozen draft-vocab head."""

    def __init__(self, n_in: int, H: int, norm_w: torch.Tensor, head: torch.Tensor) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(n_in * H, H, bias=False)
        self.gate_up = torch.nn.Linear(H, 2 * 1536, bias=False)
        self.down = torch.nn.Linear(1536, H, bias=False)
        self.norm_w, self.head = norm_w, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.inp(x)
        g, u = self.gate_up(rms(z)).chunk(2, -1)
        z = z + self.down(F.silu(g) * u)
        return F.linear(rms(z) * self.norm_w, self.head)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("regen", type=Path)
    ap.add_argument("--n-train", type=int, default=60000)
    ap.add_argument("--n-eval", type=int, default=None)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--losses", default="soft,hard,mix0.5,sharp0.5")
    ap.add_argument("--layers", default="1,14,26")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    n_eval = a.n_eval if a.n_eval is not None else a.n_train // 3
    seeds = [int(s) for s in a.seeds.split(",")]
    losses = a.losses.split(",")
    layers = [int(x) for x in a.layers.split(",")]
    torch.set_num_threads(2)
    t_start = time.perf_counter()

    loaded = load_model(None, device="cpu", dtype=torch.float32)  # the embedded SmolLM2
    target, tok = loaded.model, loaded.tokenizer
    H = target.config.hidden_size
    kept = load_drafter(default_drafter_path(), "cpu", torch.float32).t2d.nonzero().flatten()
    t2d = torch.full((target.config.vocab_size,), -1, dtype=torch.int64)
    t2d[kept] = torch.arange(kept.numel())

    # --- positions and the target's labels ----------------------------------------------------------------------------
    rows = read_cache(a.regen)
    random.Random(0).shuffle(rows)
    target.set_eagle3_layers_to_capture(layers)
    normed: list[torch.Tensor] = []
    hook = target.lm_head.register_forward_pre_hook(lambda _m, inp: normed.append(inp[0]))
    feats, nxt, fin, am, ptop = [], [], [], [], []
    n_pos, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for msgs in rows:
            try:
                ids, mask = tokenize_conversation(tok, msgs)
            except Exception:  # noqa: BLE001  (a template that drops a turn: skipped, as training does)
                continue
            ids, mask = ids[:512], mask[:512]
            if len(ids) <= 2:
                continue
            mask, _ = mask_loops(ids, mask, 32)
            ids_t, m = torch.tensor(ids), torch.tensor(mask)
            normed.clear()
            out = target(ids_t[None], ForwardContext.plain(1, ids_t.numel(), ids_t.device))
            logits = out.logits[0].float()  # [T, V]: position i predicts token i+1
            am_d = t2d[logits.argmax(-1)]  # draft id of the target's argmax, -1 outside
            ok = torch.zeros(len(ids), dtype=torch.bool)
            ok[:-2] = m[1:-1] & m[2:] & (am_d[1:-1] >= 0)
            pos = ok.nonzero().flatten()
            if pos.numel() == 0:
                continue
            aux = out.aux_hidden[0].view(ids_t.numel(), len(layers), H)
            feats.append(aux[pos].clone())
            nxt.append(ids_t[pos + 1])
            fin.append(normed[0][0, pos + 1].clone())  # target.model.norm(final residual) at t+1
            am.append(am_d[pos + 1])
            ptop.append(torch.softmax(logits[pos + 1], -1).max(-1).values)
            if n_pos == 0:  # the hook sees what lm_head sees
                assert torch.allclose(target.lm_head(normed[0][0]), out.logits[0], atol=1e-3)
            n_pos += pos.numel()
            if n_pos >= a.n_train + n_eval:
                break
    hook.remove()
    feats, nxt, fin, am, ptop = (torch.cat(v) for v in (feats, nxt, fin, am, ptop))
    t_feat = time.perf_counter() - t0
    print(f"{feats.shape[0]} positions, features in {t_feat:.0f} s", flush=True)
    with torch.no_grad():
        emb = target.embed(nxt[None])[0].float()
        head = target.lm_head.weight[kept].detach().clone()  # [Vd, H]
        norm_w = target.model.norm.weight.detach().clone()
    N = feats.shape[0]
    n_tr = N - n_eval
    x = torch.cat([rms(feats.float()).flatten(1), rms(emb)], 1)  # [N, (n+1) H]
    del feats, emb
    ev = torch.arange(n_tr, N)
    tr_ev = torch.arange(0, min(n_eval, n_tr))

    def target_logits(j: torch.Tensor) -> torch.Tensor:
        return F.linear(fin[j], head)  # the target's logits over the draft vocab

    def evaluate(model: Readout, j: torch.Tensor) -> dict:
        hit, soft_ce, hard_ce = [], 0.0, 0.0
        with torch.no_grad():
            for b in range(0, j.numel(), 2048):
                k = j[b: b + 2048]
                logq = torch.log_softmax(model(x[k]), -1)
                hit.append(logq.argmax(-1) == am[k])
                soft_ce += -(torch.softmax(target_logits(k), -1) * logq).sum().item()
                hard_ce += F.nll_loss(logq, am[k], reduction="sum").item()
        hit_t, conf = torch.cat(hit).float(), ptop[j] >= 0.5
        return {"top1": hit_t.mean().item(), "top1_lo": hit_t[~conf].mean().item(),
                "top1_hi": hit_t[conf].mean().item(), "soft_ce": soft_ce / j.numel(), "hard_ce": hard_ce / j.numel()}

    conf_ev = (ptop[ev] >= 0.5).float().mean().item()
    print(f"held-out: {n_eval} positions, {conf_ev:.3f} with target top probability >= 0.5", flush=True)
    results = []
    for seed in seeds:
        for name in losses:
            w_hard, T = LOSSES[name]
            torch.manual_seed(seed)  # same initialisation and batch order for every loss of a seed
            model = Readout(len(layers) + 1, H, norm_w, head)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
            t0 = time.perf_counter()
            for epoch in range(a.epochs):
                perm = torch.randperm(n_tr, generator=torch.Generator().manual_seed(1000 * seed + epoch))
                for b in range(0, n_tr, 512):
                    j = perm[b: b + 512]
                    logq = torch.log_softmax(model(x[j]), -1)
                    loss = torch.zeros(())
                    if w_hard < 1:
                        with torch.no_grad():
                            p = torch.softmax(target_logits(j) / T, -1)
                        loss = loss + (1 - w_hard) * -(p * logq).sum(-1).mean()
                    if w_hard > 0:
                        loss = loss + w_hard * F.nll_loss(logq, am[j])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            e, t = evaluate(model, ev), evaluate(model, tr_ev)
            row = {"loss": name, "seed": seed, **{f"eval_{k}": round(v, 4) for k, v in e.items()},
                   "train_top1": round(t["top1"], 4), "seconds": round(time.perf_counter() - t0, 1)}
            results.append(row)
            print(json.dumps(row), flush=True)

    # --- summary: mean (std over seeds), and paired difference to soft -------------------------------------------------
    def ms(vals: list[float], scale: float = 1.0, nd: int = 4) -> str:
        m = statistics.mean(vals) * scale
        return f"{m:.{nd}f}" + (f" ± {statistics.stdev(vals) * scale:.{nd}f}" if len(vals) > 1 else "")

    keys = ["eval_top1", "eval_top1_lo", "eval_top1_hi", "train_top1", "eval_soft_ce", "eval_hard_ce"]
    print(f"\nN_train {n_tr}, N_eval {n_eval} (held-out share with top probability >= 0.5: {conf_ev:.3f}), "
          f"seeds {seeds}, epochs {a.epochs}, layers {layers}; mean ± std over seeds")
    print("\n| loss | held-out top-1 | top-1, p_max < 0.5 | top-1, p_max >= 0.5 | train top-1 | held-out soft CE "
          "| held-out hard CE |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    by = {n: [r for r in results if r["loss"] == n] for n in losses}
    for n in losses:
        print(f"| {n} | " + " | ".join(ms([r[k] for r in by[n]], nd=3 if "ce" in k else 4) for k in keys) + " |")
    if "soft" in losses and len(losses) > 1:
        print("\npaired difference to soft (same seed), held-out top-1 in points: mean ± std over seeds\n"
              "| loss | overall | p_max < 0.5 | p_max >= 0.5 |\n| --- | ---: | ---: | ---: |")
        for n in losses:
            if n != "soft":
                d = {k: [r[k] - s[k] for r, s in zip(by[n], by["soft"])] for k in keys[:3]}
                print(f"| {n} - soft | " + " | ".join(ms(d[k], 100, 2) for k in keys[:3]) + " |")
    print(f"\nwall {time.perf_counter() - t_start:.0f} s (features {t_feat:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps({"n_train": n_tr, "n_eval": n_eval, "conf_share_eval": conf_ev,
                                      "results": results}, indent=1))


if __name__ == "__main__":
    main()
