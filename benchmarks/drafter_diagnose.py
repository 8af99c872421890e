"""Where an EAGLE-3 drafter of the embedded SmolLM2 misses: its per-step accuracy on the target's own greedy answers,
bucketed by how sure the target is of the token being predicted (the top probability of its next-token distribution).

The drafter runs through the training-time-test path (`train/ttt.py`, which equals the inference path: tested), the
target in float32 on the CPU. A greedy chain accepts a drafted token when the drafter's argmax equals the target's, so
step k's accuracy is what depth k+1 of a chain accepts (given the earlier depths). The buckets show whether misses
come from tokens the target itself barely prefers (near-ties, hard for any drafter) or from confident ones. For
MT-bench it also prints the accuracy per category (its prompts come in blocks of 10: writing, roleplay, reasoning,
math, coding, extraction, STEM, humanities), which says where training data is missing, and for every source the
step-0 accuracy by where the predicted token lies in the answer (its first 16 tokens, 16-63, 64-127, later): whether
the drafter misses the openings of answers more than their bodies.

usage: python benchmarks/drafter_diagnose.py DRAFTER_DIR [N_PROMPTS=20] [MAX_NEW=128] [PROMPTS=mt-bench|self[:W1,W2]]
       (self: N prompts written by the target itself, train/self_prompts.py, instead of MT-bench's; after the colon
       the words they start with, cycled)
"""

from __future__ import annotations

import json
import sys

import torch

from eaglespec.api import load, load_drafter
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.dataset import tokenize_conversation
from eaglespec.train.features import target_features
from eaglespec.train.ttt import shift_left, step_targets, ttt_hiddens
from eaglespec.train.vocab import DraftVocab

DRAFTER = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20
MAX_NEW = int(sys.argv[3]) if len(sys.argv) > 3 else 128
SOURCE = sys.argv[4] if len(sys.argv) > 4 else "mt-bench"
STEPS = 3
CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)  # buckets of the target's top probability
SPANS = (0, 16, 64, 128, 1 << 30)  # buckets of the predicted token's index in the answer

eng = load(None, draft=None, config=EngineConfig(device="cpu", dtype="float32", compile=False, max_batch_size=N))
target, tok = eng.target, eng.tokenizer
drafter = load_drafter(DRAFTER, "cpu", torch.float32)
drafter.set_embed_and_head(*target.get_embed_and_head())
target.set_eagle3_layers_to_capture(drafter.config.eagle.aux_layer_ids)
vocab = DraftVocab(drafter.d2t.clone(), drafter.t2d.clone())

from eaglespec.bench.datasets import load_prompt_set  # noqa: E402

if SOURCE.startswith("self"):
    import tempfile

    from eaglespec.train.self_prompts import SelfPromptConfig, self_prompts

    with tempfile.TemporaryDirectory() as tmp:
        openers = tuple(w for w in SOURCE.partition(":")[2].split(",") if w)
        convs = self_prompts(target, tok, SelfPromptConfig(n=N, batch_size=2 * N, openers=openers), tmp,
                             progress=False)
    prompts = [c[0]["content"] for c in convs]
else:
    prompts = [i.first for i in load_prompt_set("mt-bench")[:N]]
outs = eng.generate(prompts, SamplingParams(max_new_tokens=MAX_NEW))
hits = torch.zeros(STEPS, len(EDGES) - 1)
count = torch.zeros(STEPS, len(EDGES) - 1)
per_prompt: list[tuple[float, float]] = []  # (step-0 hits, counted positions) of each prompt
span_hits = torch.zeros(len(SPANS) - 1)
span_count = torch.zeros(len(SPANS) - 1)
span_sure = torch.zeros(2, len(SPANS) - 1)  # [hits, count] where the target's top probability is >= 0.9
span_unsure = torch.zeros(len(SPANS) - 1)  # positions where it is < 0.5
with torch.inference_mode():
    for p, o in zip(prompts, outs):
        conv = [{"role": "user", "content": p}, {"role": "assistant", "content": o.text}]
        ids, mask = tokenize_conversation(tok, conv)
        t = torch.tensor([ids])
        feats = target_features(target, t, vocab)
        pmax = feats.probs.amax(-1)  # [1, T] the target's top probability (over the draft vocabulary, renormalised)
        hs = ttt_hiddens(drafter, t, feats.aux, STEPS)
        m = torch.tensor([mask])
        for k, r in enumerate(hs):
            valid, am = step_targets(feats, m, k)  # counted positions, the target's argmax for t_{j+2+k}
            conf = shift_left(pmax, 1 + k, 0.0)  # its top probability there
            pred = drafter.lm_head(drafter.norm(r)).argmax(-1)
            ok = (pred == am) & valid
            b = torch.bucketize(conf, torch.tensor(EDGES[1:-1]), right=True)
            for i in range(len(EDGES) - 1):
                sel = valid & (b == i)
                count[k, i] += sel.sum()
                hits[k, i] += (ok & sel).sum()
            if k == 0:
                per_prompt.append((float(ok.sum()), float(valid.sum())))
                start = mask.index(True)  # the answer's first token
                at = torch.arange(t.shape[1])[None, :] + 2 - start  # position j predicts token j + 2 (step 0)
                sb = torch.bucketize(at, torch.tensor(SPANS[1:-1]), right=True)
                for i in range(len(SPANS) - 1):
                    sel = valid & (sb == i)
                    span_count[i] += sel.sum()
                    span_hits[i] += (ok & sel).sum()
                    sure = sel & (conf >= 0.9)
                    span_sure[0, i] += (ok & sure).sum()
                    span_sure[1, i] += sure.sum()
                    span_unsure[i] += (sel & (conf < 0.5)).sum()
total = count[0].sum()
print(f"{SOURCE} prompts 1-{len(prompts)}, {MAX_NEW} new tokens, float32 CPU, drafter {DRAFTER}")
print("| target top prob | share of positions | " + " | ".join(f"step {k} acc" for k in range(STEPS)) + " |")
print("|---|---:|" + "---:|" * STEPS)
for i in range(len(EDGES) - 1):
    accs = " | ".join(f"{hits[k, i] / max(count[k, i], 1):.3f}" for k in range(STEPS))
    print(f"| {EDGES[i]:.1f}-{min(EDGES[i + 1], 1):.1f} | {count[0, i] / total:.3f} | {accs} |")
accs = " | ".join(f"{hits[k].sum() / count[k].sum():.3f}" for k in range(STEPS))
print(f"| all | 1.000 | {accs} |")
if SOURCE == "mt-bench" and len(prompts) > 10:
    print("| category | prompts | step 0 acc |\n|---|---|---:|")
    for c in range(0, len(prompts), 10):
        h, n = map(sum, zip(*per_prompt[c : c + 10]))
        print(f"| {CATEGORIES[c // 10]} | {c + 1}-{min(c + 10, len(prompts))} | {h / max(n, 1):.3f} |")
print("| answer tokens | share of positions | step 0 acc | target top prob < 0.5 | step 0 acc where >= 0.9 |\n"
      "|---|---:|---:|---:|---:|")
for i in range(len(SPANS) - 1):
    hi = f"{SPANS[i + 1] - 1}" if SPANS[i + 1] < 1 << 30 else ""
    n = max(span_count[i], 1)
    print(f"| {SPANS[i]}-{hi} | {span_count[i] / max(span_count.sum(), 1):.3f} | {span_hits[i] / n:.3f} | "
          f"{span_unsure[i] / n:.3f} | {span_sure[0, i] / max(span_sure[1, i], 1):.3f} |")
print(json.dumps({"hits": hits.tolist(), "count": count.tolist(), "edges": EDGES, "span_hits": span_hits.tolist(),
                  "span_count": span_count.tolist(), "spans": SPANS}))
