#!/usr/bin/env bash
# The 4-bit CPU path against float32 on another CPU (the device machine's: 2 of its cores, as this project's CI
# machine has), with the GGUF staged at /root/m by benchmarks/device_parts.sh: `eaglespec bench` of each path's plain
# decoding and speculative shapes (`--spec auto`: the policy's timed choice), then `eaglespec generate` as a user runs
# it (benchmarks/cpu_generate.sh: the default against --no-spec, one process an answer) with --cpu-weights dense and
# with the default (auto: 4-bit where it applies). Logs under $OUT; a table last.
#   bash benchmarks/cpu_weights_device.sh          (BENCH="": the generate runs alone; ROUNDS=N of them)
# Session 70: the bench part took 68 s there; the generate part (24 processes, each importing the CUDA build of
# torch) did not finish within 7 minutes, twice, and brought nothing back: run it alone, with time to spare.
set -uo pipefail
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src OMP_NUM_THREADS=2 EAGLESPEC_CACHE_DIR=$OUT/cache CUDA_VISIBLE_DEVICES=""
run() { taskset -c 0,1 python3 -m eaglespec "$@"; }
{ lscpu | grep "Model name"; lscpu | grep -o "avx2\|avx512f\|avx512_bf16\|amx_[a-z0-9]*" | sort -u | tr '\n' ' '
  echo; } > "$OUT/cpu.txt"
python3 -c "import torch; print(torch.__version__)" >> "$OUT/cpu.txt"
for w in ${BENCH-dense q4}; do   # BENCH="": the generate runs alone
  if [ $w = dense ]; then shapes=(--spec 3,1,4 --spec 2,2,4 --spec 2,1,3 --spec auto); else
    shapes=(--spec 1,1,2 --spec 2,1,3 --spec 3,1,4 --spec auto); fi
  run bench --model "$M" --device cpu --cpu-weights $w --limit 4 --max-new-tokens 48 --no-spec "${shapes[@]}" \
    --out "$OUT/bench_$w" > "$OUT/bench_$w.log" 2>&1
done
# generate: eaglespec on PATH as cpu_generate.sh expects, pinned to the two cores
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/bin/python
printf '#!/bin/sh\nexec taskset -c 0,1 python3 -m eaglespec "$@"\n' > /tmp/bin/eaglespec
chmod +x /tmp/bin/eaglespec /tmp/bin/python
ln -sf "$M" /tmp/smollm2.gguf
for r in $(seq 1 "${ROUNDS:-1}"); do   # rounds alternate the two
  for w in dense auto; do
    ARGS="--model $M --device cpu --cpu-weights $w" PATH=/tmp/bin:$PATH \
      bash benchmarks/cpu_generate.sh "$OUT/gen_$w$r" > "$OUT/gen_$w$r.log" 2>&1
  done
done
cat "$OUT/cpu.txt"
for w in ${BENCH-dense q4}; do
  echo "== bench $w"; grep -E "^\| (no-spec|draft|auto)" "$OUT/bench_$w.log" | head -6 | cut -d'|' -f2,4,5,6,7,10,11,12
done
for f in "$OUT"/gen_*.log; do echo "== generate $f"; grep -E "differ|tok/s|speedup" "$f" | tail -4; done
