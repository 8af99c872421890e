"""Which target layers tell the most about the token after next? A CPU probe for choosing `--aux-layers`.

EAGLE-3's drafter sees, at position t, the target's hidden states after three layers (SGLang's default for a
30-layer SmolLM2: 1, 14, 26) and the embedding of token t+1, and predicts token t+2. This probe trains, for each
candidate set of layers, the same small readout on the same tokens and compares held-out accuracy: a linear map of
[RMSNorm(h_l(t)) for l in the set] + [RMSNorm(emb(t+1))] to the hidden size, one SiLU-gated MLP block (residual), the
target's final RMSNorm and its lm_head rows of a draft vocabulary (frozen). No attention over earlier positions:
it measures what one position's states carry, not what a drafter reaches, so only large differences mean much.

Data: SmolLM2's own answers (a regeneration cache of `eaglespec train`: REGEN_DIR/shard-*.jsonl), rendered with the
chat template; positions whose tokens t+1 and t+2 are assistant tokens, outside the deep repetition loops
(`mask_loops`, keep 32) and inside the draft vocabulary (the shipped drafter's `t2d`).

usage: python benchmarks/aux_layer_probe.py REGEN_DIR [N_TRAIN_TOKENS] [--sets "1,14,26;1,14,29;..."] [--epochs N]
       (one epoch by default: at 60K positions three epochs overfit, 0.81 training against 0.36 held-out accuracy)
"""

from __future__ import annotations

import json
import random
import sys
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

torch.manual_seed(0)
REGEN = Path(sys.argv[1])
N_TRAIN = int(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else 30000
N_EVAL = N_TRAIN // 3
SETS = [[int(x) for x in s.split(",")] for s in
        (sys.argv[sys.argv.index("--sets") + 1] if "--sets" in sys.argv else "1,14,26;1,14,29;14,26,29;26;29").split(";")]
EPOCHS = int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 1
torch.set_num_threads(2)

loaded = load_model(None, device="cpu", dtype=torch.float32)  # the embedded SmolLM2
target, tok = loaded.model, loaded.tokenizer
H = target.config.hidden_size
drafter = load_drafter(default_drafter_path(), "cpu", torch.float32)
kept = drafter.t2d.nonzero().flatten()  # target ids of the draft vocabulary
t2d = torch.full((target.config.vocab_size,), -1, dtype=torch.int64)
t2d[kept] = torch.arange(kept.numel())

# --- tokens: SmolLM2's regenerated answers --------------------------------------------------------------------------
rows = read_cache(REGEN)
random.Random(0).shuffle(rows)
samples, n_pos = [], 0
for msgs in rows:
    try:
        ids, mask = tokenize_conversation(tok, msgs)
    except Exception:  # noqa: BLE001  (a template that drops a turn: skipped, as training does)
        continue
    ids, mask = ids[:512], mask[:512]
    mask, _ = mask_loops(ids, mask, 32)
    ids_t = torch.tensor(ids)
    ok = torch.zeros(len(ids), dtype=torch.bool)  # position t usable: t+1 and t+2 assistant, t+2 drafted
    if len(ids) > 2:
        m = torch.tensor(mask)
        ok[:-2] = m[1:-1] & m[2:] & (t2d[ids_t[2:]] >= 0)
    samples.append((ids_t, ok))
    n_pos += int(ok.sum())
    if n_pos >= N_TRAIN + N_EVAL:
        break
print(f"{len(samples)} samples, {n_pos} positions", flush=True)

# --- features: every candidate layer's output at the usable positions ------------------------------------------------
layers = sorted({i for s in SETS for i in s})
target.set_eagle3_layers_to_capture(layers)
feats, nxt, label = [], [], []
t0 = time.perf_counter()
with torch.inference_mode():
    for ids, ok in samples:
        out = target(ids[None], ForwardContext.plain(1, ids.numel(), ids.device))
        aux = out.aux_hidden[0].view(ids.numel(), len(layers), H)  # [T, n_layers, H]
        pos = ok.nonzero().flatten()
        feats.append(aux[pos].clone())
        nxt.append(ids[pos + 1])
        label.append(t2d[ids[pos + 2]])
feats, nxt, label = torch.cat(feats), torch.cat(nxt), torch.cat(label)
print(f"features {tuple(feats.shape)} in {time.perf_counter() - t0:.0f} s", flush=True)
with torch.no_grad():
    emb = target.embed(nxt[None])[0].float()  # [N, H]
    head = target.lm_head.weight[kept].detach().clone()  # [Vd, H]
    final_norm = target.model.norm
N = feats.shape[0]
tr, ev = slice(0, N - N_EVAL), slice(N - N_EVAL, N)


def rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


class Readout(torch.nn.Module):
    def __init__(self, n_in: int) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(n_in * H, H, bias=False)
        self.gate_up = torch.nn.Linear(H, 2 * 1536, bias=False)
        self.down = torch.nn.Linear(1536, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.inp(x)
        g, u = self.gate_up(rms(z)).chunk(2, -1)
        z = z + self.down(F.silu(g) * u)
        with torch.no_grad():
            w = final_norm.weight
        return F.linear(rms(z) * w, head)


results = []
for s in SETS:
    idx = torch.tensor([layers.index(i) for i in s])
    x = torch.cat([rms(feats[:, idx].float()).flatten(1), rms(emb)], 1)  # [N, (n+1) H]
    model = Readout(len(s) + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    t0 = time.perf_counter()
    n_tr = N - N_EVAL
    for epoch in range(EPOCHS):
        perm = torch.randperm(n_tr, generator=torch.Generator().manual_seed(epoch))
        for b in range(0, n_tr, 512):
            j = perm[b: b + 512]
            loss = F.cross_entropy(model(x[j]), label[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc_tr = (model(x[tr][:N_EVAL]).argmax(-1) == label[tr][:N_EVAL]).float().mean().item()
        logits = model(x[ev])
        acc = (logits.argmax(-1) == label[ev]).float().mean().item()
        ce = F.cross_entropy(logits, label[ev]).item()
    row = {"layers": s, "eval_acc": round(acc, 4), "eval_ce": round(ce, 4), "train_acc": round(acc_tr, 4),
           "seconds": round(time.perf_counter() - t0, 1)}
    results.append(row)
    print(json.dumps(row), flush=True)
print("\n| layers | held-out accuracy (token t+2) | held-out CE | train accuracy |\n| --- | ---: | ---: | ---: |")
for r in results:
    print(f"| {r['layers']} | {r['eval_acc']:.4f} | {r['eval_ce']:.3f} | {r['train_acc']:.4f} |")
