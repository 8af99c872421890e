#!/usr/bin/env bash
# A/B engine settings (or source trees) on MT-bench in alternating order, in one device call.
#
# Each setting is NAME:FLAGS (extra `eaglespec bench` flags) or NAME@SRC:FLAGS (run with PYTHONPATH=/tmp/site:SRC, e.g.
# an older tree's src carried as .device/old/src). The settings run forward, then backward (A B B A for two), each
# run a `bench --batching continuous --no-spec --spec auto --repeats $REPEATS` over $ROWS; logs go to $OUT (or ./ab)
# and the medians of every run are printed last, one line per (run, config, rows). Session 30 ran the same loop inline, e.g.:
#   bash benchmarks/device_parts.sh join && bash benchmarks/ab_settings.sh /root/m/SmolLM2-135M-Instruct.Q4_1.gguf \
#       "off:--prefill-ahead 0" "on:"
# Environment: ROWS (default 8,32), REPEATS (3), TOKENS (256), DRAFT (the shipped drafter).
set -euo pipefail
gguf=${1:?usage: ab_settings.sh GGUF NAME[@SRC]:FLAGS ...}
shift
[ $# -ge 2 ] || { echo "ab_settings.sh: give at least two settings" >&2; exit 2; }
out=${OUT:-ab}
mkdir -p "$out"
order=("$@")
for ((i = $# - 1; i >= 0; i--)); do order+=("${order[$i]}"); done
n=0
for setting in "${order[@]}"; do
  n=$((n + 1))
  head=${setting%%:*}
  flags=${setting#*:}
  name=${head%%@*}
  src=src
  [ "$head" != "$name" ] && src=${head#*@}
  start=$(date +%s)
  # shellcheck disable=SC2086  # the flags are words
  PYTHONPATH=/tmp/site:$src python3 -m eaglespec bench --model "$gguf" \
    --draft "${DRAFT:-src/eaglespec/assets/smollm2-135m-eagle3}" --batching continuous --dtype bfloat16 \
    --max-new-tokens "${TOKENS:-256}" --batch-sizes "${ROWS:-8,32}" --no-spec --spec auto --repeats "${REPEATS:-3}" \
    --out "/tmp/ab/$n-$name" $flags > "$out/$n-$name.log" 2>&1 || echo "run $n ($name) failed: $out/$n-$name.log"
  echo "run $n: $name ($src, flags: ${flags:-none}) $(( $(date +%s) - start )) s"
done
echo "run name | config | rows | tok/s median | speedup median (range) | tau"
n=0
for setting in "${order[@]}"; do
  n=$((n + 1))
  name=${setting%%:*}
  name=${name%%@*}
  sed -n '/^Medians/,/accept length histogram/p' "$out/$n-$name.log" | grep -E '^\| (no-spec|draft)' |
    awk -F'|' -v r="$n $name" '{c = ($2 ~ /no-spec/) ? "plain" : "auto"; print r, "|", c, "|", $3, "|", $5, "|", $7, "(" $8 ")", "|", $9}'
done
