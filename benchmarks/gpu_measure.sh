#!/usr/bin/env bash
# The H200 measurements of issues 4 and 6 in two device calls, back to back while the machine stays warm.
#   1. benchmarks/gpu_measure.sh random    carry .device/m1   (copies the GGUF's first half to /root/m, then runs what
#      needs no checkpoint: the Triton kernel check, the Kimi-K2.5 slice, the Llama-3.1-8B shape decode and verify,
#      the regeneration throughput; KIMI_LIMIT=1 skips the slice once it is measured)
#   2. benchmarks/gpu_measure.sh smollm2   carry .device/m2 .whl   (joins the GGUF; SmolLM2 bf16 step costs and
#      profiles, bench with the oracle and random drafters at batch 1/8/32, transformers as the peer)
# Every section has its own time limit, so one slow section cannot take the others' results with it.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
run() { local limit=$1 name=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "   rc=$? ($name)"; tail -n "${TAILN:-14}" "$OUT/$name.log"; }
if [ "$1" = random ]; then
  mkdir -p /root/m && cp .device/m1/part1 /root/m/
  run 60 kernel_check python3 benchmarks/kernel_check.py
  run "${KIMI_LIMIT:-150}" kimi_slice python3 benchmarks/kimi_slice.py "$OUT"
  run "${L8B_LIMIT:-90}" llama8b python3 benchmarks/gpu_smoke.py none "$OUT" 8b
  # regeneration throughput, immediate vs batched admission (one process each)
  for k in 1 32; do KS=$k run "${REGEN_LIMIT:-90}" "regen_k$k" python3 benchmarks/regen_throughput.py "/tmp/rt$k" 1024 256; done
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:src
  [ -f "$M" ] || cat /root/m/part1 .device/m2/part2 > "$M"
  run "${SMOKE_LIMIT:-120}" smoke_bf16 python3 benchmarks/gpu_smoke.py "$M" "$OUT" bf16fast
  TAILN=30 run "${BENCH_LIMIT:-170}" bench_oracle python3 -m eaglespec bench --model "$M" --dtype float32 --compile --draft oracle \
    --draft random --spec 3,1,4 --spec 5,4,16 --batch-sizes 1,8,32 --limit 32 --max-new-tokens 128 --out /tmp/bo
  cp /tmp/bo/results.json "$OUT/bench_oracle.json" 2>/dev/null
  run "${PEER_LIMIT:-60}" peer python3 -m eaglespec bench --model "$M" --no-spec --peer hf --limit 4 --max-new-tokens 128 --out /tmp/bp
  cp /tmp/bp/results.json "$OUT/bench_peer.json" 2>/dev/null
fi
