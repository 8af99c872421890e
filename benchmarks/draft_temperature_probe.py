"""Would sampled speculation accept more if the drafter's logits were scaled before its drafts are drawn?

A sampled chain draws each draft from q = target_probs(drafter logits, T, top-k, top-p) and accepts it with
probability min(1, p/q): depth k+1 accepts with probability sum_v min(p_v, q_v) given the depths before it. Any q keeps
the output distribution the target's (the rejection step corrects it), so q may be chosen to maximise that overlap;
a drafter trained on soft labels may be over- or under-confident against the target's distribution at temperature T.
This probe scales the drafter's logits by 1/c (c < 1 sharpens) and measures the overlap on the target's own sampled
answers (float32, CPU), through the training-time-test path (which equals the inference path: tested), with the true
previous tokens, for the first STEPS depths.

For MT-bench prompts 1..N the target answers at temperature T (top-p P; seeded), then per position and step k:
p = target_probs(target logits, T, P) over the full vocabulary for the token after the k-th draft, q_c =
target_probs(drafter logits / c, T, P) over the draft vocabulary; overlap_k(c) = mean sum_v min(p_v, q_c,v) over
positions whose previous tokens are assistant tokens. tau_est = 1 + a0 + a0 a1 + a0 a1 a2 (a chain of 3, depths
taken as independent: a ranking, not the engine's tau).

usage: python benchmarks/draft_temperature_probe.py DRAFTER_DIR [N=20] [MAX_NEW=128] [T=1.0] [TOP_P=1.0] [C1,C2,...]
"""

from __future__ import annotations

import json
import sys

import torch

from eaglespec.api import load, load_drafter
from eaglespec.bench.datasets import load_prompt_set
from eaglespec.config import EngineConfig
from eaglespec.layers.context import ForwardContext
from eaglespec.layers.sampling import target_probs
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.dataset import tokenize_conversation
from eaglespec.train.ttt import shift_left, ttt_hiddens

DRAFTER = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20
MAX_NEW = int(sys.argv[3]) if len(sys.argv) > 3 else 128
T = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
TOP_P = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
SCALES = [float(c) for c in sys.argv[6].split(",")] if len(sys.argv) > 6 else [0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25]
STEPS = 3

torch.manual_seed(0)
eng = load(None, draft=None, config=EngineConfig(device="cpu", dtype="float32", compile=False, max_batch_size=N))
target, tok = eng.target, eng.tokenizer
drafter = load_drafter(DRAFTER, "cpu", torch.float32)
drafter.set_embed_and_head(*target.get_embed_and_head())
target.set_eagle3_layers_to_capture(drafter.config.eagle.aux_layer_ids)
kept = drafter.d2t + torch.arange(drafter.d2t.numel())  # [Vd] target ids of the draft vocabulary

prompts = [i.first for i in load_prompt_set("mt-bench")[:N]]
outs = eng.generate(prompts, SamplingParams(max_new_tokens=MAX_NEW, temperature=T, top_p=TOP_P))
overlap = torch.zeros(STEPS, len(SCALES), dtype=torch.float64)
count = torch.zeros(STEPS, dtype=torch.float64)


def probs(logits: torch.Tensor) -> torch.Tensor:
    n = logits.shape[0]
    return target_probs(logits, torch.full((n,), T), torch.zeros(n, dtype=torch.long), torch.full((n,), TOP_P))


with torch.inference_mode():
    for p, o in zip(prompts, outs):
        conv = [{"role": "user", "content": p}, {"role": "assistant", "content": o.text}]
        ids, mask = tokenize_conversation(tok, conv)
        t = torch.tensor([ids])
        out = target(t, ForwardContext.plain(1, t.shape[1], t.device))
        hs = ttt_hiddens(drafter, t, out.aux_hidden, STEPS)
        m = torch.tensor([mask])
        for k, r in enumerate(hs):
            # step k at position j drafts token j + 2 + k; the target's distribution for it is at position j + 1 + k
            valid = shift_left(m, 2 + k, False)[0]  # [T] that token is an assistant token
            j = valid.nonzero()[:, 0]
            p_t = probs(out.logits[0, j + 1 + k].float())[:, kept]  # [n, Vd] the target's mass on draftable ids
            d_logits = drafter.lm_head(drafter.norm(r[0, j])).float()  # [n, Vd]
            count[k] += len(j)
            for i, c in enumerate(SCALES):
                overlap[k, i] += torch.minimum(p_t, probs(d_logits / c)).sum(-1).double().sum()
alpha = overlap / count[:, None]
print(f"MT-bench 1-{N}, {MAX_NEW} new tokens sampled at T {T}, top-p {TOP_P}, float32 CPU, drafter {DRAFTER}")
print("| logit scale 1/c: c | " + " | ".join(f"overlap step {k}" for k in range(STEPS)) + " | tau_est (chain of 3) |")
print("|---:|" + "---:|" * (STEPS + 1))
rows = []
for i, c in enumerate(SCALES):
    a = alpha[:, i].tolist()
    tau = 1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2]
    rows.append({"c": c, "overlap": a, "tau_est": tau})
    print(f"| {c} | " + " | ".join(f"{x:.4f}" for x in a) + f" | {tau:.4f} |")
print(json.dumps({"T": T, "top_p": TOP_P, "n": N, "max_new": MAX_NEW, "positions": count.tolist(), "rows": rows}))
