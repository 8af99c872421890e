#!/usr/bin/env bash
# EAGLE-3 against EAGLE-3.1 drafters for the embedded SmolLM2, trained with the same data, seed, steps and schedule,
# then measured on MT-bench's 80 first turns (T = 0, bf16, one row).
#
#   bash benchmarks/eagle31_ab.sh train      # after device_parts.sh join; carry .device/data (or the all-turns file)
#   bash benchmarks/eagle31_ab.sh bench      # the next call, while the machine stays warm
#
# "train" regenerates the data once (cached in the first variant's work dir and linked into the others'; resumed
# when a call ran out), then trains VARIANTS (default "A: B:--norm-before-fc,--norm-output") for STEPS steps each
# (default 1200) of <= 8K tokens at lr 3e-4 with loop-masked loss, exporting to /tmp/ab/NAME. A variant already
# exported is skipped; the call stops training TRAIN_BUDGET seconds (default 560) after it started, and a variant cut
# short resumes in the next call from the checkpoint its `timeout` (SIGTERM) made it write at the step it reached
# (since session 39; before, from the last of every 250 steps). PACK=1 packs the regeneration caches into
# $OUT/regen.tar.gz.* (15 MB pieces); on a later machine of the same session (.device/ does not outlive a session: a
# new session's checkout holds only git) `bash benchmarks/eagle31_ab.sh unpack` (carry .device/regen, in a call of its
# own: ~13 MB for every ShareGPT turn and both self-prompt sets; same VARIANTS) puts them back and saves the
# regeneration (~14 minutes).
#   DATA=first (default): ShareGPT's first turns (.device/data/sharegpt_first_turns.json.gz, --first-turn-only);
#   DATA=all: every turn, regenerated turn by turn (/root/m/sg-all.json, unpacked by an earlier call from
#             .device/data_all/sharegpt_all_turns.json.xz, which fits beside a GGUF part where the .gz does not).
#   SELF_PROMPTS, SELF_PROMPT_OPENERS: prompt sets the target writes and answers (benchmarks/self_prompt_args.sh).
#   SEED: --seed (default 0): the self-written prompts' draws (another seed, other prompts) and shuffling (the held-out
#         split has its own --eval-seed, 0, since session 44; before, the seed drew it too).
#   REGEN_STOP_LOOP: --regen-stop-loop (default 32, as --loop-keep: an answer ends where its tokens would carry no
#             loss; 0 regenerates whole answers, as runs before session 38 did).
#   INIT_DIR: continue every variant from this exported drafter (e.g. src/eaglespec/assets/smollm2-135m-eagle3, which
#             travels with the tree); the variants' flags then add EAGLE-3.1's norms to it (calibrated aux norm), and
#             the held-out evaluation runs at step 0 too.
# KEEP=1 (default) brings each export back under $OUT as drafter_NAME.tar.* (15 MB pieces; `cat drafter_N.tar.* | tar x
# -C .device` gives .device/drafter_N), so that a machine given back before "bench" costs the measurement,
# not the drafter (session 42 lost one so); "bench" takes .device/drafter_NAME when /tmp/ab/NAME is gone. To bench
# it on a fresh machine, send it in pieces beside the GGUF's (device_parts.sh split-drafter: they land in /tmp/ab).
# "bench" runs the MT-bench chain S3 K1 D4 and tree S6 K8 D48 for every exported drafter (and the shipped one, unless
# SHIPPED=0) and prints a table. Logs go to $OUT.
set -euo pipefail
MODE=$1
STEPS=${STEPS:-1200}
VARIANTS=${VARIANTS:-"A: B:--norm-before-fc,--norm-output"}
DATA=${DATA:-first}
first=$(echo "$VARIANTS" | awk '{print $1}'); first=/tmp/w${first%%:*}   # the regeneration cache lives there
if [ "$MODE" = unpack ]; then   # caches packed by an earlier PACK=1, carried as .device/regen (a call of its own)
  mkdir -p "$first" && cat .device/regen/regen.tar.gz.* | tar xz -C "$first" && ls "$first"
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$M" ] || bash benchmarks/device_parts.sh join
if [ "$MODE" = bench ]; then   # MT-bench ships in the package: no training data needed
  TURNS=()
elif [ "$DATA" = all ]; then
  [ -f /root/m/sg-all.json ] || python3 -c "import lzma, shutil, sys; \
shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .device/data_all/sharegpt_all_turns.json.xz \
    /root/m/sg-all.json
  TURNS=()
else
  [ -f /root/m/sg-first.json ] || gunzip -c .device/data/sharegpt_first_turns.json.gz > /root/m/sg-first.json
  TURNS=(--first-turn-only)
fi
INIT=()
[ -n "${INIT_DIR:-}" ] && INIT=(--init "$INIT_DIR")
EXTRA=()
source benchmarks/self_prompt_args.sh   # SELF_PROMPTS / SELF_PROMPT_OPENERS: written and answered once, like the data
mkdir -p /tmp/ab
if [ "$MODE" = train ]; then
  deadline=$(( $(date +%s) + ${TRAIN_BUDGET:-560} ))
  for v in $VARIANTS; do
    name=${v%%:*}
    flags=${v#*:}
    w=/tmp/w$name
    if [ -f "/tmp/ab/$name/config.json" ]; then echo "$name: exported already"; continue; fi
    left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt 40 ]; then echo "$name: no time left in this call"; continue; fi
    mkdir -p "$w"
    if [ "$w" != "$first" ]; then   # the regenerated answers and the self-written prompts, shared
      for r in "$first"/regen-* "$first"/prompts-*.jsonl; do if [ -e "$r" ]; then ln -sfn "$r" "$w/"; fi; done
    fi
    t0=$(date +%s)
    # shellcheck disable=SC2046
    timeout "$left" python3 -m eaglespec train --target "$M" --data "/root/m/sg-$DATA.json" \
      --out "/tmp/ab/$name" --work-dir "$w" "${TURNS[@]}" "${INIT[@]}" --resume \
      --regen-max-new-tokens 512 --regen-batch 1024 --regen-shard 4096 --max-len 1024 \
      --draft-vocab 12288 --batch-tokens 8192 --max-steps "$STEPS" --lr 3e-4 --ttt-steps 7 --loop-keep 32 \
      --seed "${SEED:-0}" --regen-stop-loop "${REGEN_STOP_LOOP:-32}" --eval-every $((STEPS / 2)) --eval-prompts mt-bench --save-every 250 --no-progress \
      --device cuda --dtype bfloat16 --max-shard-mb 15 \
      "${EXTRA[@]}" $(echo "$flags" | tr ',' ' ') >> "$OUT/train_$name.txt" 2>&1 \
      || echo "$name: cut short (resume in the next call)"
    echo "$name ($flags): $(( $(date +%s) - t0 )) s"
    grep -E "^step [0-9]+:|exporting|training |trained |regenerated|self prompts|calibrated|added|eval prompts" \
      "$OUT/train_$name.txt" | cut -c1-220 || true   # a run that died before its first line: go on with the next
    cp "$w/train_log.jsonl" "$OUT/train_log_$name.jsonl" 2>/dev/null || true
    if [ "${KEEP:-1}" = 1 ] && [ -f "/tmp/ab/$name/config.json" ]; then   # the export comes back with the call,
      tar cf - -C /tmp/ab --transform "s,^$name,drafter_$name," "$name" \
        | split -b 15M - "$OUT/drafter_$name.tar."   # in pieces: files come back <= 16 MiB each
    fi
  done
  if [ "${PACK:-0}" = 1 ]; then   # the regenerated answers and self-written prompts, for a later machine
    (cd "$first" && tar czf - regen-* $(ls prompts-*.jsonl 2>/dev/null)) | split -b 15M - "$OUT/regen.tar.gz."
    ls -l "$OUT"/regen.tar.gz.*
  fi
else
  args=()
  [ "${SHIPPED:-1}" = 1 ] && args+=(--draft src/eaglespec/assets/smollm2-135m-eagle3)
  for v in $VARIANTS; do   # this machine's export, else one brought back by KEEP and carried as .device/drafter_NAME
    n=${v%%:*}
    if [ -f "/tmp/ab/$n/config.json" ]; then args+=(--draft "/tmp/ab/$n")
    elif [ -f ".device/drafter_$n/config.json" ]; then args+=(--draft ".device/drafter_$n"); fi
  done
  python3 -m eaglespec bench --model "$M" "${args[@]}" --spec 3,1,4 --spec 6,8,48 --batch-sizes 1 \
    --dtype bfloat16 --max-new-tokens 256 --no-spec --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
  grep -E "^\| (no-spec|draft)" "$OUT/bench/results.md" | head -n 12
fi
