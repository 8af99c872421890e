#!/usr/bin/env bash
# EAGLE-3 against EAGLE-3.1 drafters for the embedded SmolLM2, trained from scratch with the same data, seed, steps
# and schedule, then measured on MT-bench's 80 first turns (T = 0, bf16, one row).
#
#   bash benchmarks/eagle31_ab.sh train      # after device_parts.sh join; carry .device/data and .whl
#   bash benchmarks/eagle31_ab.sh bench      # the next call, while the machine stays warm
#
# "train" regenerates ShareGPT's first turns once (--first-turn-only, 1,024 rows, cached in /tmp/wA and linked into
# the other work dirs), then trains VARIANTS (default "A: B:--norm-before-fc --norm-output") for STEPS steps each
# (default 1200) of <= 8K tokens at lr 3e-4 with loop-masked loss, exporting to /tmp/ab/NAME; "bench" runs the
# MT-bench chain S3 K1 D4 and tree S6 K8 D48 for every exported drafter and prints a table. Logs go to $OUT.
set -euo pipefail
MODE=$1
STEPS=${STEPS:-1200}
VARIANTS=${VARIANTS:-"A: B:--norm-before-fc,--norm-output"}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$M" ] || bash benchmarks/device_parts.sh join
[ -f /root/m/sg-first.json ] || gunzip -c .device/data/sharegpt_first_turns.json.gz > /root/m/sg-first.json
mkdir -p /tmp/ab
if [ "$MODE" = train ]; then
  for v in $VARIANTS; do
    name=${v%%:*}
    flags=${v#*:}
    w=/tmp/w$name
    mkdir -p "$w"
    ls -d /tmp/wA/regen-* >/dev/null 2>&1 && for r in /tmp/wA/regen-*; do ln -sfn "$r" "$w/"; done
    t0=$(date +%s)
    # shellcheck disable=SC2046
    python3 -m eaglespec train --target "$M" --data /root/m/sg-first.json --out "/tmp/ab/$name" --work-dir "$w" \
      --first-turn-only --regen-max-new-tokens 512 --regen-batch 1024 --regen-shard 4096 --max-len 1024 \
      --draft-vocab 12288 --batch-tokens 8192 --max-steps "$STEPS" --lr 3e-4 --ttt-steps 7 --loop-keep 32 \
      --eval-every $((STEPS / 2)) --save-every 0 --no-progress --device cuda --dtype bfloat16 --max-shard-mb 30 \
      $(echo "$flags" | tr ',' ' ') > "$OUT/train_$name.txt" 2>&1
    echo "$name ($flags): $(( $(date +%s) - t0 )) s"
    grep -E "^step [0-9]+:|exporting|training |regenerated" "$OUT/train_$name.txt" | cut -c1-220
    cp "$w/train_log.jsonl" "$OUT/train_log_$name.jsonl" 2>/dev/null || true
  done
else
  args=()
  for v in $VARIANTS; do args+=(--draft "/tmp/ab/${v%%:*}"); done
  python3 -m eaglespec bench --model "$M" "${args[@]}" --spec 3,1,4 --spec 6,8,48 --batch-sizes 1 \
    --dtype bfloat16 --max-new-tokens 256 --no-spec --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
  grep -E "^\| (no-spec|draft)" "$OUT/bench/results.md" | head -n 8
fi
