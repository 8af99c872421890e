#!/usr/bin/env bash
# Session 53 on the device machine, in the call after `eagle31_ab.sh train` made /tmp/ab/NAME (a drafter continued
# on answers regenerated at temperature 1) on the same warm machine:
#
#   NAME=W EAGLESPEC_GIT_REVISION=REV bash benchmarks/session53_check.sh
#
# 1. eagle31_ab.sh bench: NAME against the shipped drafter, MT-bench 80, T = 0, one row, chain S3 K1 D4 and tree
#    S6 K8 D48 (256 tokens, bf16, one plain run for both);
# 2. the same two at temperature 1 (seed 0), one row, the chain of 3 (auto's sampled shape on CUDA), and at 8 and 32
#    rows with `--spec auto` (continuous batching, 128 tokens);
# 3. greedy `--spec auto` at 8 and 32 rows (continuous, 256 tokens), both drafters: the issue-4 goals at this tree;
# 4. sampled_capture_probe.py: extras_check's 32-row sampled loss traced (graphs captured while timed?).
# Logs under $OUT; the tables last.
set -uo pipefail
NAME=${NAME:-W}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
S=src/eaglespec/assets/smollm2-135m-eagle3
D=/tmp/ab/$NAME
[ -f "$D/config.json" ] || D=.device/drafter_$NAME
nvidia-smi --query-gpu=name --format=csv,noheader
VARIANTS="$NAME:" timeout 200 bash benchmarks/eagle31_ab.sh bench > "$OUT/ab_bench.log" 2>&1
echo "ab bench rc=$?"
timeout 120 python3 -m eaglespec bench --model "$G" --draft "$S" --draft "$D" --spec 3,1,4 --no-spec \
  --batch-sizes 1 --temperature 1 --seed 0 --dtype bfloat16 --max-new-tokens 256 --out "$OUT/t1_row1" \
  > "$OUT/t1_row1.log" 2>&1
echo "t1 one row rc=$?"
timeout 150 python3 -m eaglespec bench --model "$G" --draft "$S" --draft "$D" --spec auto --no-spec \
  --batch-sizes 8,32 --batching continuous --temperature 1 --seed 0 --dtype bfloat16 --max-new-tokens 128 \
  --out "$OUT/t1_rows" > "$OUT/t1_rows.log" 2>&1
echo "t1 rows rc=$?"
timeout 150 python3 -m eaglespec bench --model "$G" --draft "$S" --draft "$D" --spec auto --no-spec \
  --batch-sizes 8,32 --batching continuous --dtype bfloat16 --max-new-tokens 256 --out "$OUT/t0_rows" \
  > "$OUT/t0_rows.log" 2>&1
echo "t0 rows rc=$?"
timeout 200 python3 benchmarks/sampled_capture_probe.py "$G" > "$OUT/capture_probe.log" 2>&1
echo "capture probe rc=$?"
echo "== T = 0, one row"; grep -E "^\| (no-spec|draft)" "$OUT/bench/results.md" 2>/dev/null | head -8
for f in t1_row1 t1_rows t0_rows; do echo "== $f"; grep -E "^\| (no-spec|draft)|Error|error" "$OUT/$f/results.md" \
  "$OUT/$f.log" 2>/dev/null | tail -10; done
echo "== capture probe"; grep -E "^\||speculative|Error" "$OUT/capture_probe.log"
