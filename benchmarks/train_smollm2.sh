#!/usr/bin/env bash
# Train the embedded SmolLM2's EAGLE-3 drafter on the H200 in steps that fit 10-minute device calls.
#
# Carried with the calls (all under .device/, ignored by git):
#   .device/g1/part1 .. .device/g3/part3 the GGUF in three parts (benchmarks/device_parts.sh split)
#   .device/data/sharegpt_first_turns.json.gz   benchmarks/make_first_turns.py (DATA=first, the default)
#   .device/data/sharegpt_all_turns.json.gz     benchmarks/make_first_turns.py --all-turns (DATA=all: every turn,
#                                               regenerated turn by turn; about 3.5x the tokens)
#   .device/regen/regen.tar.gz.*         optional: a regeneration cache from an earlier session ($OUT of "regen")
#   .device/drafter/                     optional: a drafter exported earlier, to continue from (--init)
#   .whl/gguf-*.whl                      the gguf package (not on the device image)
# Calls, back to back while the machine stays warm (files under /root/m and /tmp/work survive between them):
#   1. bash benchmarks/device_parts.sh stage && gunzip -c .device/data/sharegpt_all_turns.json.gz \
#        > /root/m/sg-all.json                                        (carry .device/g1 .device/data)
#   2. bash benchmarks/device_parts.sh stage && mkdir -p /tmp/work && cat .device/regen/regen.tar.gz.* \
#        | tar xz -C /tmp/work                                        (carry .device/g2 [.device/regen])
#   3. benchmarks/train_smollm2.sh regen                              (carry .device/g3 .whl)
#      (a call carries at most 64 MiB, the 25 MB tree included: one GGUF part and one data file per call)
#   4. benchmarks/train_smollm2.sh train                              ([.device/drafter])
# "regen" regenerates the answers with the target (cached), trains until REGEN_BUDGET seconds have passed (checkpoints
# every 100 steps) and packs the cache into $OUT; "train" resumes and finishes training, exports the drafter to
# $OUT/drafter and measures it on MT-bench's 80 first turns in float32 (T = 0; TEMPS="0 1" adds T = 1).
# With SELF_PROMPTS=N (and SELF_PROMPT_OPENERS="Write,Imagine you are,Solve,..."), "regen" also has the target write
# N prompts and answers them (their own caches, packed into $OUT with the rest). Measured (session 6, 16K prompts,
# REGEN_BATCH=512): 158 s to write them, 76 s to answer them (60K new tokens/s), then training in the same call;
# session 7 (a second set of 20K, REGEN_BATCH=1024): about 175 s to write, 92 s to answer (83.7K new tokens/s).
# The packed caches of that run (ShareGPT + self prompts, 13 MB) do not fit beside a GGUF part in one call: carry
# them in a call of their own.
set -euo pipefail
MODE=$1
EPOCHS=${EPOCHS:-8}
REGEN_BUDGET=${REGEN_BUDGET:-540}
DATA=${DATA:-first}   # first: first turns only (the 2026-11-29 run); all: every turn
MAX_LEN=${MAX_LEN:-1024}
REGEN_NEW=${REGEN_NEW:-512}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
bash benchmarks/device_parts.sh join
if [ "$DATA" = all ]; then SRC=.device/data/sharegpt_all_turns.json.gz; TURNS=(); else
  SRC=.device/data/sharegpt_first_turns.json.gz; TURNS=(--first-turn-only); fi
[ -f "/root/m/sg-$DATA.json" ] || gunzip -c "$SRC" > "/root/m/sg-$DATA.json"
mkdir -p /tmp/work
if [ -d .device/regen ] && ! ls /tmp/work/regen-* >/dev/null 2>&1; then cat .device/regen/regen.tar.gz.* | tar xz -C /tmp/work; fi
INIT=()   # INIT_DIR: an exported drafter to continue from (e.g. src/eaglespec/assets/smollm2-135m-eagle3, which
          # travels with the tree); default .device/drafter when present
[ -f .device/drafter/config.json ] && INIT=(--init .device/drafter)
[ -n "${INIT_DIR:-}" ] && INIT=(--init "$INIT_DIR")
EXTRA=()   # DRAFTER_FFN / DRAFTER_HEADS widen the drafter layer (default: the target layer's 1536 / 9)
[ -n "${DRAFTER_FFN:-}" ] && EXTRA+=(--drafter-intermediate-size "$DRAFTER_FFN")
[ -n "${DRAFTER_HEADS:-}" ] && EXTRA+=(--drafter-heads "$DRAFTER_HEADS")
[ -n "${REBUILD_VOCAB:-}" ] && EXTRA+=(--rebuild-vocab)   # with an --init drafter: a DRAFT_VOCAB-token vocabulary
                                                         # from this run's data (benchmarks/vocab_coverage.py)
[ -n "${LOOP_KEEP:-}" ] && EXTRA+=(--loop-keep "$LOOP_KEEP")   # no loss deep inside SmolLM2's greedy loops
[ -n "${REGEN_STOP_LOOP:-}" ] && EXTRA+=(--regen-stop-loop "$REGEN_STOP_LOOP")   # nor regenerated (e.g. as LOOP_KEEP)
[ -n "${MAX_STEPS:-}" ] && EXTRA+=(--max-steps "$MAX_STEPS")   # a schedule of this many steps instead of EPOCHS
# SELF_PROMPTS / SELF_PROMPT_OPENERS: prompts the target writes (cached in /tmp/work), see self_prompt_args.sh
source benchmarks/self_prompt_args.sh
eaglespec() { python3 -m eaglespec "$@"; }
ARGS=(train --target "$M" --data "/root/m/sg-$DATA.json" --out "$OUT/drafter" --work-dir /tmp/work "${TURNS[@]}"
      --regen-max-new-tokens "$REGEN_NEW" --regen-batch "${REGEN_BATCH:-512}" --regen-shard 4096
      --draft-vocab "${DRAFT_VOCAB:-12288}" --epochs "$EPOCHS" --batch-tokens "${BATCH_TOKENS:-32768}"
      --max-len "$MAX_LEN" --max-shard-mb "${MAX_SHARD_MB:-15}"
      --lr "${LR:-3e-4}" --ttt-steps "${TTT:-7}" --save-every 100
      --eval-every "${EVAL_EVERY:-200}" --eval-prompts mt-bench --no-progress --device cuda --dtype bfloat16
      "${INIT[@]}" "${EXTRA[@]}")
if [ "$MODE" = regen ]; then
  python3 benchmarks/kernel_check.py 2>&1 | tail -n 3   # the engine regenerates the data: stop now if its kernel is wrong
  timeout "$REGEN_BUDGET" python3 -m eaglespec "${ARGS[@]}" --resume 2>&1 | tee "$OUT/regen_log.txt" || true
  (cd /tmp/work && tar czf - regen-* $(ls prompts-*.jsonl 2>/dev/null)) | split -b 15M - "$OUT/regen.tar.gz."
else
  eaglespec "${ARGS[@]}" --resume 2>&1 | tee "$OUT/train_log.txt"
  cp /tmp/work/train_log.jsonl "$OUT/" || true
  for T in ${TEMPS-0}; do   # TEMPS="" skips the measurement (export only)
    eaglespec bench --model "$M" --draft "$OUT/drafter" ${SPECS:---spec 3,1,4 --spec 6,8,48} \
      --max-new-tokens 256 --dtype float32 --temperature $T --batch-sizes 1 --out /tmp/bench$T 2>&1 \
      | tail -n 16 | tee "$OUT/bench_T$T.txt"
    cp /tmp/bench$T/results.json "$OUT/bench_T$T.json" || true
  done
fi
