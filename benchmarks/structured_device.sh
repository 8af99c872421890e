#!/usr/bin/env bash
# Structured outputs on the device machine in one call: what a constrained request costs with speculation on CUDA
# (constrained steps replay graphs keyed `constrained`, unoverlapped, their masks loaded between phases), one row
# and batched.
#
#   run(carry=[".device/g1"]) bash benchmarks/device_parts.sh stage; run(carry=[".device/g2"]) ... stage
#   run(carry=[".device/g3", ".whl"]) bash benchmarks/device_parts.sh join && bash benchmarks/structured_device.sh
#
# .whl must hold gguf and llguidance for the device's Python 3.12 (installed here into /tmp/site). Runs:
# 1. structured_cost.py --device cuda in auto's shape (a chain S3 K1 D4 at one row) and as the tree S2 K2 D4 (one
#    row, 8 JSON tasks x 96 tokens: answers vs plain constrained decoding, tau, tok/s, host grammar time per token);
# 2. `eaglespec bench` on MT-bench's first LIMIT (default 32) prompts, 128 tokens, rows 1 / 8 / 32, each of
#    --json-object and free: what the eager constrained path costs a batch against the graph path.
# Logs under $OUT; the tables last.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
LIMIT=${LIMIT:-32}
timeout 150 python3 benchmarks/structured_cost.py --device cuda --model "$G" --profile json_schema \
  > "$OUT/cost_auto.log" 2>&1
echo "cost auto rc=$?"
timeout 120 python3 benchmarks/structured_cost.py --device cuda --model "$G" --spec 2,2,4 > "$OUT/cost_tree.log" 2>&1
echo "cost tree rc=$?"
for mode in json-object free; do
  extra=(); [ "$mode" = json-object ] && extra=(--json-object)
  timeout 140 python3 -m eaglespec bench --model "$G" --limit "$LIMIT" --max-new-tokens 128 --batch-sizes 1,8,32 \
    --batching continuous "${extra[@]}" --out "$OUT/bench_$mode" > "$OUT/bench_$mode.log" 2>&1
  echo "bench $mode rc=$?"
done
for f in cost_auto cost_tree; do echo "== $f"; grep -E "^\||speculating|Error|error" "$OUT/$f.log" | tail -12; done
grep -A 40 "under cProfile" "$OUT/cost_auto.log" | head -45
for f in bench_json-object bench_free; do echo "== $f"; grep -E "^\||Error|error" "$OUT/$f.log" | tail -14; done
