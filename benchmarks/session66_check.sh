#!/usr/bin/env bash
# Session 66's device checks of the committed one-row default (session 65 measured the chain of 4 under
# with_setting only) and of where the chain of 4 was never measured, in one call after the GGUF is staged
# (device_parts.sh join). Each bench runs twice, logs under $OUT, each run's table printed as it ends:
# 1. `--spec auto` at one row (the committed schedule: greedy S4 K1 D5) beside --no-spec and the chain of 3;
# 2. 12 and 16 rows, continuous batching: the chain of 3 (the schedule's choice at 9-16 rows) against the chain of 4;
# 3. one row sampled at T = 1 (seed 0): the chain of 3 (the schedule's sampled choice) against the chain of 4;
# 4. one row in float32 (the chain of 3 is the float32 default too) against the chain of 4.
# PARTS selects a subset (default "1 2 3 4").
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name --format=csv,noheader
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
D=src/eaglespec/assets/smollm2-135m-eagle3
B="python3 -m eaglespec bench --model $G --draft $D --max-new-tokens 256 --prompts mt-bench"
run() {   # name, args...
  local name=$1; shift
  for r in 1 2; do
    timeout 280 $B "$@" --out "$OUT/$name$r" > "$OUT/$name$r.log" 2>&1; echo "$name run $r rc=$?"
    grep -E "^\| (no-spec|draft)|Error" "$OUT/$name$r.log" | head -12   # each table as it comes (a call may end early)
  done
}
for p in ${PARTS:-1 2 3 4}; do
  case $p in
    1) run auto1 --no-spec --spec auto --spec 3,1,4 --batch-sizes 1 ;;
    2) run rows --no-spec --spec 3,1,4 --spec 4,1,5 --batch-sizes 12,16 --batching continuous ;;
    3) run t1 --no-spec --spec 3,1,4 --spec 4,1,5 --batch-sizes 1 --temperature 1 --seed 0 ;;
    4) run f32 --no-spec --spec 3,1,4 --spec 4,1,5 --batch-sizes 1 --dtype float32 ;;
  esac
done
