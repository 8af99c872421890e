#!/usr/bin/env bash
# Static against continuous batching on MT-bench (80 first turns, 256 new tokens), SmolLM2-135M bf16 with a drafter,
# in one device call after the GGUF is staged (benchmarks/device_parts.sh; this call carries .device/g3 and .whl):
#   bash benchmarks/batching_bench.sh [DRAFTER_DIR]
# 1. static batches at 1 / 8 / 32 rows (the bench's default: each batch runs to its slowest row);
# 2. continuous batching at 8 / 32 rows (all 80 prompts queued, a freed row refilled at once);
# 3. a continuous tune over chains and K = 4 trees at 8 / 32 rows (MT-bench 1-40);
# 4. (only when named in SECTIONS) "sampled": continuous batching at temperature 1, 1 / 8 / 32 rows, chains of 3 and 1.
# SECTIONS (default "static continuous tune"), SPECS, STATIC_BATCHES, CONT_BATCHES, DTYPE (default bfloat16; float32
# is the GPU's losslessness check: answers identical to plain decoding) and *_LIMIT (seconds) override the defaults. Logs and results.json land in $OUT, named after the section and TAG (default empty). SRC (default src)
# runs another tree's package, e.g. SRC=.device/old/src TAG=_old for an A/B against an older commit's src/eaglespec
# (`git archive OLD src/eaglespec ':!src/eaglespec/assets/smollm2-135m-eagle3' | tar -x -C .device/old`, carried).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:${SRC:-src} PYTHONUNBUFFERED=1
TAG=${TAG:-}
bash benchmarks/device_parts.sh join || exit 1
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
D=${1:-src/eaglespec/assets/smollm2-135m-eagle3}
SPECS=${SPECS:---spec 3,1,4 --spec 4,4,16}
bench() {  # name limit args...
  local name=$1$TAG limit=$2; shift 2
  echo "== $name"
  timeout "$limit" python3 -m eaglespec "$@" --model "$M" --draft "$D" --dtype "${DTYPE:-bfloat16}" --max-new-tokens 256 \
    --out "/tmp/$name" > "$OUT/$name.md" 2> "$OUT/$name.log"
  echo "   rc=$? ($name)"
  cp "/tmp/$name/results.json" "$OUT/$name.json" 2>/dev/null
}
SECTIONS=${SECTIONS:-static continuous tune}
for sec in $SECTIONS; do case $sec in
  static) bench static "${STATIC_LIMIT:-210}" bench $SPECS --batch-sizes "${STATIC_BATCHES:-1,8,32}" \
    --batching static ;;
  continuous) bench continuous "${CONT_LIMIT:-150}" bench $SPECS --batch-sizes "${CONT_BATCHES:-8,32}" \
    --batching continuous ;;
  tune) bench tune_continuous "${TUNE_LIMIT:-170}" tune --batch-sizes 8,32 --batching continuous --limit 40 \
    --steps 2,3,4 --topk 1,4 ;;
  sampled) bench sampled "${SAMPLED_LIMIT:-150}" bench --spec 3,1,4 --spec 1,1,2 --temperature 1 \
    --batch-sizes 1,8,32 --batching continuous ;;
esac; done
for f in static continuous tune_continuous sampled; do
  [ -f "$OUT/$f$TAG.md" ] && { echo "## $f$TAG"; grep '^|' "$OUT/$f$TAG.md" | head -40; }
done
