#!/usr/bin/env bash
# The 4-bit CPU path's load of a K-quant GGUF on 1-16 cores (the device machine's CPU): the working tree (src/)
# against the tree before session 76 (.base/src: `git archive 8bf024a src/eaglespec --prefix=.base/ | tar -x`, the
# drafter asset removed), alternating, each on as many cores as PyTorch threads (taskset). Session 76 ran it at
# e86d175, whose recovery searched over parts of the rows on PyTorch's thread count of threads: no faster at 2-4
# cores, 31.5 against 22.5 s at 16 (a single run each; docs/benchmarks.md "Session 76"), so 2e77b46 removed it. The
# file: an 850M-parameter Llama shape (hidden 2,048, 16 layers, feed-forward 5,632, vocabulary 32,000) in llama.cpp's
# Q4_K_M mix as tests/gguf_write.py quantizes it, written on the machine. Then the same file loaded onto the GPU (bf16).
#   run(carry=[".whl", ".base"], command="bash benchmarks/kquant_load_threads.sh")     (.whl: the gguf wheel)
# Logs under $OUT; a table last.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site NUMBA_CACHE_DIR=/tmp/numba EAGLESPEC_CACHE_DIR=/tmp/cache
F=/tmp/q4km850.gguf
lscpu | grep -E "Model name|^CPU\(s\)" > "$OUT/cpu.txt"
if [ ! -f $F ]; then
  PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site python3 - <<'PY' > "$OUT/write.log" 2>&1
from gguf import GGMLQuantizationType as Q
from test_loading_gguf import write_tiny_gguf
K_M = {"token_embd": Q.Q4_K, "output": Q.Q6_K, "attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_v": Q.Q6_K,
       "attn_output": Q.Q4_K, "ffn_gate": Q.Q4_K, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K}
write_tiny_gguf("/tmp/q4km850.gguf", types=K_M, hidden=2048, heads=16, kv_heads=4, ffn=5632, layers=16, vocab=32000)
PY
fi
load() {  # SIDE THREADS
  local cores=$(( $2 - 1 ))
  CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=$2 PYTHONPATH=$PWD/$1:/tmp/site taskset -c 0-$cores \
    python3 benchmarks/gguf_cpu_load.py $F auto 4 1 $2
}
for side in .base/src src; do load $side 16 > /dev/null 2>&1; done   # numba's caches compiled
for t in ${THREADS:-16 4 2 1}; do
  for side in .base/src src; do
    echo "$side $(load $side $t 2>>"$OUT/err.log")" | tee -a "$OUT/loads.txt"
  done
done
PYTHONPATH=$PWD/src:/tmp/site python3 - <<'PY' > "$OUT/gpu.txt" 2>&1
import time, torch
from eaglespec import api
from eaglespec.config import EngineConfig
t = time.perf_counter()
engine = api.load("/tmp/q4km850.gguf", draft=None, config=EngineConfig(device="cuda", max_batch_size=1))
torch.cuda.synchronize()
print(f"GPU load (bf16, CUDA graphs off until the first step): {time.perf_counter() - t:.1f} s")
PY
cat "$OUT/cpu.txt" "$OUT/gpu.txt"
echo "| side | threads | load s | tok/s |"
sed -E 's/^([^ ]+) .*"threads": ([0-9]+).*"load_s": ([0-9.]+).*"tok_s": ([0-9.]+).*/| \1 | \2 | \3 | \4 |/' \
  "$OUT/loads.txt"
