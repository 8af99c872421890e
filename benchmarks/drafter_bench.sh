#!/usr/bin/env bash
# A drafter's MT-bench measurements on the H200 in one call (the GGUF already joined in /root/m by an earlier call of
# the same warm machine: benchmarks/device_parts.sh):  bash benchmarks/drafter_bench.sh DRAFTER_DIR [BASE_DIR]
# With BASE_DIR (e.g. the shipped drafter), the bf16 sections also run it, in the same runs (same no-spec baseline).
# BF16_SPECS overrides the bf16 T = 0 shapes (default "--spec 3,1,4 --spec 1,1,2").
#   fp32_T0  float32, T = 0, batch 1: acceptance of the chain S3 K1 D4 and the tree S6 K8 D48 (issue 5's goals) and
#            whether the answers equal plain decoding's
#   bf16_T0  bfloat16 (what CUDA users get), T = 0, batches 1 / 8 / 32: speedups over no speculation (issue 4's goals)
#   bf16_T1  bfloat16, T = 1, batch 1
# Each section has its own time limit and writes its results.json to $OUT/<section>.json.
set -uo pipefail
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
D=${1:?usage: drafter_bench.sh DRAFTER_DIR [BASE_DIR]}
BASE=(); [ -n "${2:-}" ] && BASE=(--draft "$2")
run() { local limit=$1 name=$2; shift 2; echo "== $name"
  timeout "$limit" python3 -m eaglespec bench --model "$M" --draft "$D" --max-new-tokens 256 --out "/tmp/$name" "$@" \
    > "$OUT/$name.log" 2>&1; echo "   rc=$? ($name)"; tail -n "${TAILN:-12}" "$OUT/$name.log"
  cp "/tmp/$name/results.json" "$OUT/$name.json" 2>/dev/null; }
run "${FP32_LIMIT:-170}" fp32_T0 --dtype float32 --spec 3,1,4 --spec 6,8,48 --batch-sizes 1
TAILN=20 run "${BF16_LIMIT:-200}" bf16_T0 "${BASE[@]}" --dtype bfloat16 ${BF16_SPECS:---spec 3,1,4 --spec 1,1,2} \
  --batch-sizes 1,8,32
run "${T1_LIMIT:-90}" bf16_T1 "${BASE[@]}" --dtype bfloat16 --temperature 1 --spec 3,1,4 --batch-sizes 1
