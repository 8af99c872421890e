#!/usr/bin/env bash
# Why a float32 one-row tree is slow on the H200: session 36 measured the shipped drafter's S6 K8 D48 at 141 tok/s in
# float32 (0.13x of plain decoding; session 7, before the tensor-core projection kernel and the prompt attention
# kernel, 851 tok/s, 0.76x), while the float32 chain and every bf16 shape ran as expected. Each run below changes one
# suspect, on MT-bench 1-10 with 128 new tokens, and the table gives tok/s, tau and where the time went:
#   base         as shipped
#   proj-cublas  norm_linear_kernel.FLOAT32_DOT=False: float32 steps of 9+ rows project through cuBLAS (PyTorch), not
#                the tensor-core kernel's IEEE float32 tl.dot
#   attn-sdpa    short_attention_kernel.MAX_PROMPT_TOKENS=0: the 48-token verify (144 query rows) attends through SDPA,
#                not the prompt kernel's IEEE float32 tl.dot (float32 prefills too)
#   both         the two together
#   no-graphs    --no-cuda-graphs: whether the step runs as graphs at all (an eager tree step is launch-bound)
#   no-compile   --no-compile: the elementwise chains eager (whether torch.compile recompiles per step shape)
#   bf16         the same in bf16, for scale
#   bash benchmarks/float32_tree_probe.sh     after device_parts.sh join (carry .whl); ~4 minutes (7 runs of at most
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
run proj-cublas $NLK.FLOAT32_DOT=False -- --dtype float32
run attn-sdpa $SAK.MAX_PROMPT_TOKENS=0 -- --dtype float32
run both $NLK.FLOAT32_DOT=False $SAK.MAX_PROMPT_TOKENS=0 -- --dtype float32
run no-graphs -- --dtype float32 --no-cuda-graphs
run no-compile -- --dtype float32 --no-compile
run bf16 -- --dtype bfloat16
echo "| run | config | tok/s | speedup | tau | draft % | verify % | rest % |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for name in base proj-cublas attn-sdpa both no-graphs no-compile bf16; do
  [ -f "$OUT/$name/results.md" ] || { echo "| $name | (no results) | | | | | | |"; continue; }
  # results.md's columns: config | batch | tok/s | speedup | accept len | identical | out tokens | seconds | steps |
  # draft % | verify % | rest % | ...
  grep -E "^\| (no-spec|draft)" "$OUT/$name/results.md" | grep -v " 1:" \
    | awk -F'|' -v n="$name" '{printf "| %s |%s|%s|%s|%s|%s|%s|%s|\n", n, $2, $4, $5, $6, $11, $12, $13}'
done
