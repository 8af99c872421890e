"""How much of the target's MT-bench text a draft vocabulary holds, by size, and drafters moved onto larger ones.

A token outside the draft vocabulary can never be drafted: every such position of the target's answer ends a chain
there. Session 8 found 5.7% of SmolLM2's greedy MT-bench tokens outside the shipped drafter's 12,288 (a vocabulary
kept since the first run, built from ShareGPT's first turns). This script counts the assistant tokens of
regeneration caches (`eaglespec train --work-dir`'s `regen-*` folders: the answers a drafter trains on), ranks them as
`build_draft_vocab` does, and prints, for each size, the share of the training tokens kept and the share of the
target's MT-bench answers (greedy, float32 CPU) left out; with `--export N:DIR` it also writes DRAFTER moved onto the
top-N vocabulary (`revocab_drafter`: trained rows kept, new rows zero), untrained, to measure with `eaglespec
bench` (it should draft as DRAFTER does; session 8, CPU, S2 K1 D3: tau 1.84 for both at 16,384).

usage: python benchmarks/vocab_coverage.py DRAFTER REGEN_DIR [REGEN_DIR...] [--max-new 256] [--export N:DIR ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglespec.api import load, load_drafter
from eaglespec.bench.datasets import load_prompt_set
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams
from eaglespec.train.drafter import revocab_drafter
from eaglespec.train.export import export_drafter
from eaglespec.train.vocab import DraftVocab, build_draft_vocab

SIZES = (8192, 12288, 16384, 20480, 24576, 32768)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("regen", nargs="+")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--export", action="append", default=[], metavar="N:DIR")
    a = ap.parse_args()
    eng = load(None, draft=None, config=EngineConfig(device="cpu", dtype="float32", compile=False, max_batch_size=80))
    tok, V = eng.tokenizer, eng.target.config.vocab_size
    texts = [m["content"] for d in a.regen for f in sorted(Path(d).glob("shard-*.jsonl"))
             for line in f.open() for m in json.loads(line).get("messages") or [] if m["role"] == "assistant"]
    counts = torch.zeros(V, dtype=torch.int64)
    for i in range(0, len(texts), 4096):
        for ids in tok.encode_batch(texts[i : i + 4096]):
            counts += torch.bincount(torch.tensor(ids, dtype=torch.int64), minlength=V)[:V]
    outs = eng.generate([p.first for p in load_prompt_set("mt-bench")], SamplingParams(max_new_tokens=a.max_new))
    mt = torch.tensor([t for o in outs for t in o.token_ids])
    drafter = load_drafter(a.drafter, "cpu", torch.float32)
    shipped = DraftVocab(drafter.d2t.clone(), drafter.t2d.clone())
    print(f"{len(texts)} assistant texts, {int(counts.sum())} tokens; MT-bench 80 answers, {len(mt)} tokens")
    print("| draft vocabulary | training tokens kept | MT-bench tokens left out |\n| --- | ---: | ---: |")
    left_out = (~shipped.t2d[mt]).float().mean()
    print(f"| {a.drafter} ({shipped.size}) | {shipped.coverage(counts):.4f} | {left_out:.4f} |")
    for n in SIZES:
        v = build_draft_vocab(counts, n)
        print(f"| top {n} | {v.coverage(counts):.4f} | {(~v.t2d[mt]).float().mean():.4f} |")
    for spec in a.export:
        n, out = spec.split(":", 1)
        moved = revocab_drafter(drafter, build_draft_vocab(counts, int(n)))
        export_drafter(moved, out)
        print(f"wrote {out} (draft vocabulary {n})")


if __name__ == "__main__":
    main()
