#!/usr/bin/env bash
# Where a float32 one-row tree's time goes on the H200, setting by setting. Session 36 measured the shipped drafter's
# S6 K8 D48 at 141 tok/s in float32 (0.13x of plain decoding); session 37 found two kernels tuned in bf16 slow in
# float32 (their IEEE float32 tl.dot runs as FMAs and the tiles spill) and took float32 off them, and off the fused
# kernels' PyTorch fallback: 1,021 tok/s, 0.86x (docs/benchmarks.md, "Session 37"). Each run below switches one of
# those decisions back, on MT-bench 1-10 with 128 new tokens, and the table gives tok/s, tau and where the time went:
#   base         as shipped
#   dot          norm_linear_kernel.FLOAT32_DOT=True: float32 steps of 5-64 rows on the tensor-core kernel again
#                (and the fused kernels' float32 row limit back at 64: `max_rows`)
#   attn         short_attention_kernel.FLOAT32_MAX_QUERY_ROWS=None: float32 attention of 17+ query rows through the
#                split-K and prompt kernels again, not SDPA (a tree's 8-token drafter steps, its 48-token verify)
#   no-graphs    --no-cuda-graphs: whether the step runs as graphs at all (an eager tree step is launch-bound)
#   no-compile   --no-compile: the elementwise chains eager (whether torch.compile recompiles per step shape)
#   bf16         the same in bf16, for scale
#   bash benchmarks/float32_tree_probe.sh     after device_parts.sh join (carry .whl); ~4 minutes (6 runs of at most
#                                             RUN_LIMIT=75 s each: under a call's 10); logs in $OUT
set -uo pipefail
[ -n "${GGUF:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
M=${GGUF:-/root/m/SmolLM2-135M-Instruct.Q4_1.gguf}   # GGUF, LIMIT, MAX_NEW: a dry run on the CPU
[ -f "$M" ] || bash benchmarks/device_parts.sh join
ARGS=(--model "$M" --draft src/eaglespec/assets/smollm2-135m-eagle3 --spec 6,8,48 --spec 3,1,4 --batch-sizes 1
      --limit "${LIMIT:-10}" --max-new-tokens "${MAX_NEW:-128}")
run() {  # NAME SETTINGS... -- BENCH ARGS...
  local name=$1; shift
  local settings=()
  while [ "$1" != -- ]; do settings+=("$1"); shift; done; shift
  timeout "${RUN_LIMIT:-75}" python3 benchmarks/with_setting.py "${settings[@]}" -- -m eaglespec bench "${ARGS[@]}" \
    "$@" --out "$OUT/$name" > "$OUT/$name.txt" 2>&1 || echo "$name: stopped (rc $?), see $OUT/$name.txt"
}
NLK=eaglespec.layers.norm_linear_kernel
SAK=eaglespec.layers.short_attention_kernel
run base -- --dtype float32 --no-spec
run dot $NLK.FLOAT32_DOT=True -- --dtype float32
run attn $SAK.FLOAT32_MAX_QUERY_ROWS=None -- --dtype float32
run no-graphs -- --dtype float32 --no-cuda-graphs
run no-compile -- --dtype float32 --no-compile
run bf16 -- --dtype bfloat16
echo "| run | config | tok/s | speedup | tau | draft % | verify % | rest % |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for name in base dot attn no-graphs no-compile bf16; do
  [ -f "$OUT/$name/results.md" ] || { echo "| $name | (no results) | | | | | | |"; continue; }
  # results.md's columns: config | batch | tok/s | speedup | accept len | identical | out tokens | seconds | steps |
  # draft % | verify % | rest % | ...
  grep -E "^\| (no-spec|draft)" "$OUT/$name/results.md" | grep -v " 1:" \
    | awk -F'|' -v n="$name" '{printf "| %s |%s|%s|%s|%s|%s|%s|%s|\n", n, $2, $4, $5, $6, $11, $12, $13}'
done
