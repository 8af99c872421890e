#!/usr/bin/env bash
# One device call after staging (device_parts.sh): `eaglespec train` end to end on ShareGPT's first turns with the
# shipped drafter continued (regeneration, training, evaluation, export), then the step times from its log: the
# mean step after each batch shape's first use, the first uses' total, and the regeneration time the log gives.
# usage: STEPS=800 BUDGET=330 bash benchmarks/train_call.sh OUT
set -u
OUT=${1:?usage: train_call.sh OUT}
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
W=/root/w
mkdir -p "$OUT"
start=$(date +%s)
timeout "${BUDGET:-330}" python3 -m eaglespec train --target "$M" --data /root/m/sg-first.json --first-turn-only \
  --out /root/drafter --work-dir "$W" --init src/eaglespec/assets/smollm2-135m-eagle3 \
  --regen-max-new-tokens 512 --regen-stop-loop 32 --regen-batch 1024 --max-len 1024 --draft-vocab 12288 \
  --batch-tokens 8192 --max-steps "${STEPS:-800}" --lr 1e-4 --ttt-steps 7 --loop-keep 32 --save-every 100000 \
  --device cuda --dtype bfloat16 --no-progress > "$OUT/train.txt" 2>&1
echo "rc $? after $(( $(date +%s) - start )) s"
grep -v "^\s*$" "$OUT/train.txt" | tail -n 25
cp "$W/train_log.jsonl" "$OUT/" 2>/dev/null
python3 - "$W/train_log.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l and '"eval"' not in l]
sec = [s["seconds"] for s in steps]
if sec:
    srt = sorted(sec)
    med = srt[len(srt) // 2]
    slow = [s for s in sec if s > 4 * med]
    print(f"{len(sec)} steps: total {sum(sec):.1f} s, mean {sum(sec) / len(sec) * 1e3:.1f} ms, median {med * 1e3:.1f} ms; "
          f"{len(slow)} steps > 4x the median (first uses of a shape) took {sum(slow):.1f} s; "
          f"the rest mean {(sum(sec) - sum(slow)) / max(1, len(sec) - len(slow)) * 1e3:.1f} ms; "
          f"tokens/s {sum(s['tokens'] for s in steps) / sum(sec) / 1e3:.1f}K")
PY
