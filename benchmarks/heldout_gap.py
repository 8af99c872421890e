"""Why does the trainer's held-out evaluation promise more than MT-bench delivers? (third drafter: held-out step-0
accuracy 0.75, MT-bench answers 0.53, `drafter_diagnose.py`.)

Rebuilds the training run's dataset and split from a regeneration cache (the same `build_dataset` and `split` as
`eaglespec train`, max length 1024, `--loop-keep 32`, seed 0, eval fraction as the pipeline's default) and measures the
drafter's step-0 accuracy (the TTT path, float32 on the CPU; the argmax of the target's distribution over the draft
vocabulary, as the trainer scores it) on the first N held-out samples, split by:
- assistant turn: the first answer of a conversation vs the later ones (which see the model's own earlier answers);
- loop tokens: all assistant tokens vs those the loop mask keeps (the trainer's number);
then on fresh float32 greedy answers of the engine to those samples' first prompts (as MT-bench is measured), also
by the target's top probability (the buckets of drafter_diagnose.py).

usage: python benchmarks/heldout_gap.py REGEN_DIR DRAFTER_DIR [N=40] [MAX_NEW=128]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from eaglespec.api import load, load_drafter
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.dataset import build_dataset, mask_loops, split
from eaglespec.train.features import target_features
from eaglespec.train.pipeline import PipelineOptions
from eaglespec.train.ttt import shift_left, step_targets, ttt_hiddens
from eaglespec.train.vocab import DraftVocab

REGEN, DRAFTER = Path(sys.argv[1]), sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 40
MAX_NEW = int(sys.argv[4]) if len(sys.argv) > 4 else 128
torch.manual_seed(0)

convs = []
for shard in sorted(REGEN.glob("shard-*.jsonl")):
    convs += [json.loads(line)["messages"] for line in shard.read_text(encoding="utf-8").split("\n") if line]
convs = [c for c in convs if c is not None]  # conversations the regeneration dropped (as `regenerate` does)
eng = load(None, draft=None, config=EngineConfig(device="cpu", dtype="float32", compile=False, max_batch_size=N))
target, tok = eng.target, eng.tokenizer
ds = build_dataset(tok, convs, 1024, "truncate", loop_keep=None)
# the loop mask does not touch the tokens before a sample's first answer, so the split (by prompt) is the trained run's
_, eval_idx = split(len(ds), PipelineOptions.__dataclass_fields__["eval_frac"].default, 0, groups=ds.prompt_keys())
print(f"{len(convs)} conversations, {len(ds)} samples, {len(eval_idx)} held out; measuring the first {N}", flush=True)

drafter = load_drafter(DRAFTER, "cpu", torch.float32)
drafter.set_embed_and_head(*target.get_embed_and_head())
target.set_eagle3_layers_to_capture(drafter.config.eagle.aux_layer_ids)
vocab = DraftVocab(drafter.d2t.clone(), drafter.t2d.clone())


EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)  # buckets of the target's top probability, as drafter_diagnose.py
conf_hits = torch.zeros(len(EDGES) - 1)
conf_count = torch.zeros(len(EDGES) - 1)


def step0(ids: torch.Tensor, mask: torch.Tensor, buckets: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(hit [T] bool, valid [T] bool) of step 0 at each position: valid where the token two ahead is a loss token.
    With `buckets`, also counts hits by the target's top probability there (conf_hits / conf_count)."""
    with torch.inference_mode():
        feats = target_features(target, ids[None], vocab)
        r = ttt_hiddens(drafter, ids[None], feats.aux, 1)[0]
        pred = drafter.lm_head(drafter.norm(r)).argmax(-1)[0]
    valid, am = (x[0] for x in step_targets(feats, mask[None], 0))
    hit = (pred == am) & valid
    if buckets:
        conf = shift_left(feats.probs.amax(-1), 1, 0.0)[0]
        b = torch.bucketize(conf, torch.tensor(EDGES[1:-1]), right=True)
        for i in range(len(EDGES) - 1):
            conf_count[i] += (valid & (b == i)).sum()
            conf_hits[i] += (hit & (b == i)).sum()
    return hit, valid


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """[T] 0-based index of the assistant answer each loss position belongs to (-1 elsewhere)."""
    starts = mask & ~torch.cat([torch.zeros(1, dtype=torch.bool), mask[:-1]])
    idx = torch.cumsum(starts.long(), 0) - 1
    return torch.where(mask, idx, torch.full_like(idx, -1))


acc = {k: [0, 0] for k in ("all", "first answer", "later answers", "loop-masked (trainer)",
                           "loop-masked, first answer")}
first_prompts = []
for i in eval_idx[:N].tolist():
    s, e = int(ds.offsets[i]), int(ds.offsets[i + 1])
    ids, mask = ds.tokens[s:e], ds.mask[s:e]
    keep = torch.tensor(mask_loops(ids.tolist(), mask.tolist(), 32)[0])  # --loop-keep 32, as the run trained
    hit, valid = step0(ids, mask)
    turn = shift_left(turn_index(mask)[None], 2, -1)[0]
    kept = shift_left(keep[None], 2, False)[0]
    for name, sel in (("all", valid), ("first answer", valid & (turn == 0)), ("later answers", valid & (turn > 0)),
                      ("loop-masked (trainer)", valid & kept), ("loop-masked, first answer", valid & kept & (turn == 0))):
        acc[name][0] += int((hit & sel).sum())
        acc[name][1] += int(sel.sum())
    first_prompts.append(ids[: int(mask.nonzero()[0])].tolist())  # the rendered prompt up to the first answer

fresh = [0, 0]
outs = eng.generate(first_prompts, SamplingParams(max_new_tokens=MAX_NEW), chat=False)
for p, o in zip(first_prompts, outs):
    ids = torch.tensor(p + list(o.token_ids))
    mask = torch.zeros(len(ids), dtype=torch.bool)
    mask[len(p):] = True
    hit, valid = step0(ids, mask, buckets=True)
    fresh[0] += int(hit.sum())
    fresh[1] += int(valid.sum())
print(f"\nstep-0 accuracy of {DRAFTER} (float32, CPU), held-out samples 1-{N}:")
print("| text | positions | step-0 accuracy |\n|---|---:|---:|")
for name, (h, n) in acc.items():
    print(f"| regenerated held-out, {name} | {n} | {h / max(n, 1):.3f} |")
print(f"| fresh float32 greedy answers to the same first prompts ({MAX_NEW} tokens) | {fresh[1]} | "
      f"{fresh[0] / max(fresh[1], 1):.3f} |")
print("\nfresh answers by the target's top probability (compare drafter_diagnose.py on MT-bench):")
print("| target top prob | share of positions | step-0 accuracy |\n|---|---:|---:|")
for i in range(len(EDGES) - 1):
    print(f"| {EDGES[i]:.1f}-{min(EDGES[i + 1], 1):.1f} | {conf_count[i] / conf_count.sum():.3f} | "
          f"{conf_hits[i] / max(conf_count[i], 1):.3f} |")
