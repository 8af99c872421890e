#!/usr/bin/env bash
# Session 59's device checks in one call (sessions 57-59's changes were built on the CPU only):
# 1. families_check.py: gpt-oss now on the grouped MoE kernels (bias / clamp epilogues, CUDA graphs) and Llama 4
#    (chunked masks, the NoPE query temperature, weightless q/k norms in the fused kernel, routing weights on the
#    experts' inputs in the grouped GEMM), with a few session-58 families beside them;
# 2. moe_graphs_check.py --part check (session 56's pending float32 check of the MoE graph path);
# 3. moe_graphs_check.py --part model --shape gpt-oss-20b: gpt-oss-20b's shape (random bf16 weights, 42 GB), one
#    decode step on the eager per-expert loop against the grouped kernels on CUDA graphs, and the verify steps;
# 4. mla_kernel_check.py at BLOCK_Q 16 (shipped), 32 and 64 (session 56's slow 8-token verify: 512 query rows).
# Each step writes its log under $OUT; the tables are printed last.
set -uo pipefail
export PYTHONPATH=$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1 | cut -c1-60
timeout 150 python benchmarks/families_check.py --only "${FAMILIES:-gpt_oss,llama4,mixtral,gemma2,qwen3 (layers}" \
  > "$OUT/families.log" 2>&1; echo "families rc=$?"
timeout 150 python benchmarks/moe_graphs_check.py --part check > "$OUT/moe_check.log" 2>&1; echo "moe check rc=$?"
timeout 200 python benchmarks/moe_graphs_check.py --part model --shape gpt-oss-20b --new 32 > "$OUT/oss.log" 2>&1
echo "gpt-oss model rc=$?"
K=eaglespec.layers.mla_attention_kernel
for q in 16 32 64; do
  w=4; [ "$q" -gt 16 ] && w=8
  timeout 60 python benchmarks/with_setting.py $K.BLOCK_Q=$q $K.WARPS=$w -- benchmarks/mla_kernel_check.py \
    "$OUT/mla_q$q" > "$OUT/mla_q$q.log" 2>&1; echo "mla BLOCK_Q=$q rc=$?"
done
echo "== families"; grep -E "^\||Error" "$OUT/families.log"
echo "== moe check"; grep -E "^\||Error" "$OUT/moe_check.log" | tail -20
echo "== gpt-oss-20b"; grep -vi warn "$OUT/oss.log" | tail -9
for q in 16 32 64; do echo "== mla BLOCK_Q=$q"; grep -E "^\||Error" "$OUT/mla_q$q.log"; done
