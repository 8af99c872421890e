"""Expected depth-1 acceptance of a sampled chain under three drafting rules, on the target's own sampled answers.

For each assistant position of the embedded SmolLM2's answers to MT-bench 1-N sampled at (T, top-p, top-k) (CPU,
float32), with p the target's processed distribution (`target_probs`) for the next-but-one token and the drafter's
step-0 logits (through the TTT path, which equals inference; over the target vocabulary, 0 outside the draft one):
- deterministic draft (the drafter's argmax x, accepted with probability p(x)): E[p(argmax q)];
- sampled draft from q = softmax(logits / T) (accepted with probability min(1, p(x)/q(x))): E[sum(min(p, q))];
- sampled draft from q processed like p (T, top-k, top-p; what the engine does): E[sum(min(p, q'))];
and how often the argmaxes agree. The engine's measured depth-1 acceptance (`eaglespec bench --temperature T`) should
match the rule it runs (docs/training.md, "the third SmolLM2 run").

usage: python benchmarks/sampled_acceptance.py [DRAFTER_DIR=shipped] [N_PROMPTS=8] [T=1.0] [MAX_NEW=96] [TOP_P=1]
       [TOP_K=0]
"""

from __future__ import annotations

import sys

import torch

from eaglespec.api import load, load_drafter
from eaglespec.assets import default_drafter_path
from eaglespec.bench.datasets import load_prompt_set
from eaglespec.config import EngineConfig
from eaglespec.layers.context import ForwardContext
from eaglespec.layers.sampling import target_probs
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.dataset import tokenize_conversation
from eaglespec.train.ttt import ttt_hiddens

DRAFTER = sys.argv[1] if len(sys.argv) > 1 else str(default_drafter_path())
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8
T = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
MAX_NEW = int(sys.argv[4]) if len(sys.argv) > 4 else 96
TOP_P = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
TOP_K = int(sys.argv[6]) if len(sys.argv) > 6 else 0


def processed(logits: torch.Tensor) -> torch.Tensor:
    """[L, V] logits -> the distributions at (T, top-k, top-p), as the engine processes them."""
    n = logits.shape[0]
    return target_probs(logits.float(), torch.full((n,), T), torch.full((n,), TOP_K), torch.full((n,), TOP_P))


eng = load(None, draft=None, config=EngineConfig(device="cpu", dtype="float32", compile=False, max_batch_size=N))
target, tok = eng.target, eng.tokenizer
drafter = load_drafter(DRAFTER, "cpu", torch.float32)
drafter.set_embed_and_head(*target.get_embed_and_head())
target.set_eagle3_layers_to_capture(drafter.config.eagle.aux_layer_ids)
Vd = drafter.lm_head.weight.shape[0]
target_ids = drafter.to_target_ids(torch.arange(Vd))

prompts = [i.first for i in load_prompt_set("mt-bench")[:N]]
outs = eng.generate(prompts, SamplingParams(max_new_tokens=MAX_NEW, temperature=T, top_p=TOP_P, top_k=TOP_K))
det = samp = samp_proc = match = n = 0.0
with torch.inference_mode():
    for prompt, o in zip(prompts, outs):
        conv = [{"role": "user", "content": prompt}, {"role": "assistant", "content": o.text}]
        ids, mask = tokenize_conversation(tok, conv)
        t = torch.tensor([ids])
        out = target(t, ForwardContext.plain(1, t.shape[1]))
        p = processed(out.logits[0])  # [L, V]: row j+1 is the target's p for token j+2
        h = ttt_hiddens(drafter, t, out.aux_hidden, 1)[0][0]  # [L, H]: step 0 at j predicts token j+2
        logits_d = drafter.lm_head(drafter.norm(h)).float()  # [L, Vd]
        q = torch.zeros_like(p).index_copy_(1, target_ids, torch.softmax(logits_d / T, -1))
        q_proc = torch.zeros_like(p).index_copy_(1, target_ids, processed(logits_d))
        sel = torch.tensor(mask[2:], dtype=torch.bool)  # positions j whose token j+2 is an assistant token
        pj, qj = p[1:-1][sel], q[:-2][sel]
        x = qj.argmax(-1)
        det += pj.gather(1, x[:, None]).sum().item()
        samp += torch.minimum(pj, qj).sum().item()
        samp_proc += torch.minimum(pj, q_proc[:-2][sel]).sum().item()
        match += (x == pj.argmax(-1)).sum().item()
        n += int(sel.sum())
print(f"MT-bench 1-{N}, T={T} top-p {TOP_P} top-k {TOP_K}, {int(n)} positions, drafter {DRAFTER}")
print(f"deterministic draft E[p(argmax q)] = {det / n:.3f}; sampled draft E[sum min(p, q)] = {samp / n:.3f}; "
      f"processed like p: {samp_proc / n:.3f}; argmax agreement {match / n:.3f}")
