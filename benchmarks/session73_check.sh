#!/usr/bin/env bash
# Session 73's GPU probe: trees of at most 48 tokens that draft deeper than 7 steps (issue 5's tree goal, tau >= 5.0),
# against plain decoding and the one-row default, MT-bench 80 first turns, 256 new tokens, bf16, one row.
# Run after `bash benchmarks/device_parts.sh join` (the GGUF in /root/m) with gguf installed (.whl).
set -euo pipefail
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
D=src/eaglespec/assets/smollm2-135m-eagle3
SPECS=${SPECS:-"4,1,5 7,8,48 8,8,48 10,8,48 12,10,48 10,16,48"}
args=()
for s in $SPECS; do args+=(--spec "$s"); done
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1 || true
python3 -m eaglespec bench --model "$G" --draft "$D" --no-spec "${args[@]}" --batch-sizes 1 --max-new-tokens 256 \
  --prompts mt-bench --out "$OUT/bench" > "$OUT/bench.txt" 2>&1 || { tail -30 "$OUT/bench.txt"; exit 1; }
grep -E "^\|" "$OUT/bench/results.md" | head -n 20
