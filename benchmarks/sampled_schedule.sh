#!/usr/bin/env bash
# Session 51: a step's speculation shape follows whether it samples (`SpecSchedule.sampled`) and whether a row has a
# count penalty (`SpecSchedule.penalized`: auto decodes such steps plainly on CUDA, from session 50's extras_check);
# on the device machine in one call after staging the GGUF (not run in session 51: no device was lent):
#
#   run(carry=[".device/g1"]) bash benchmarks/device_parts.sh stage; run(carry=[".device/g2"]) ... stage
#   run(carry=[".device/g3", ".whl"]) bash benchmarks/device_parts.sh join && bash benchmarks/sampled_schedule.sh
#
# 1. extras_check.py: engines loaded for greedy requests (auto's schedule, temperature 0) running greedy, adjusted
#    (penalized: now plain decoding in the speculative engine too), sampled and seeded requests at 1 and 32 rows:
#    session 50 measured the sampled steps at 32 rows on the greedy tree S5 K2 D8 (8,558 tok/s against plain's
#    21,573); they now take the sampled chain of 3.
# 2. `eaglespec bench` at temperature 1, MT-bench's 80 first turns, 128 tokens, rows 1 / 8 / 32, continuous batching:
#    no-spec, auto (the sampled entries: the chain of 3), and auto's greedy schedule run on sampled steps (what every
#    sampled step of a greedy-built engine ran before this session); then greedy, no-spec against auto; then greedy
#    under frequency 0.5 + repetition 1.1, no-spec against two chains (auto is not run there: it decodes plainly),
#    to check the penalized policy at 8 rows and whether a chain pays anywhere under penalties.
# Logs under $OUT; the tables last.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
GREEDY=1:3,1,4/8:4,4,8/16:3,1,4/32:5,2,8   # assets._DEFAULT_SPEC["cuda"]
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python3 benchmarks/extras_check.py "$G" "$OUT" > "$OUT/extras.log" 2>&1
echo "extras rc=$?"
timeout 110 python3 -m eaglespec bench --model "$G" --max-new-tokens 128 --batch-sizes 1,8,32 --batching continuous \
  --temperature 1 --seed 0 --no-spec --spec auto --spec "$GREEDY" --out "$OUT/bench_t1" > "$OUT/bench_t1.log" 2>&1
echo "bench t1 rc=$?"
timeout 80 python3 -m eaglespec bench --model "$G" --max-new-tokens 128 --batch-sizes 1,8,32 --batching continuous \
  --no-spec --spec auto --out "$OUT/bench_t0" > "$OUT/bench_t0.log" 2>&1
echo "bench t0 rc=$?"
timeout 110 python3 -m eaglespec bench --model "$G" --max-new-tokens 128 --batch-sizes 1,8,32 --batching continuous \
  --frequency-penalty 0.5 --repetition-penalty 1.1 --no-spec --spec auto --spec 3,1,4 --spec 2,1,3 \
  --out "$OUT/bench_pen" > "$OUT/bench_pen.log" 2>&1
echo "bench penalties rc=$?"
echo "== extras"; grep -E "^\||float32|OK|FAILED|Error" "$OUT/extras.log" | tail -8
for f in bench_t1 bench_t0 bench_pen; do echo "== $f"; grep -E "^\||Error|error" "$OUT/$f.log" | tail -12; done
