#!/usr/bin/env bash
# Session 52's engine changes, built and tested on the CPU only (no device was lent), checked on the device machine
# in one call after staging the GGUF (run(carry=[".device/g1"]) / g2: `bash benchmarks/device_parts.sh stage`; then
# run(carry=[".device/g3", ".whl"]) `bash benchmarks/device_parts.sh join && bash benchmarks/session52_check.sh`):
# 1. long_prefill_check.py: a 6,000-token prompt prefilled whole and in windows of 1,024 (EngineConfig.prefill_chunk)
#    in bf16 through the graph engine (eager: longer than a prefill graph), and a 3,000-token conversation's second
#    turn through an eager engine with and without prefix reuse;
# 2. qwen_device_check.py: random Qwen2 and Qwen3 models through eaglespec.load on CUDA (graphs, fused projections,
#    Triton kernels) against transformers' generate, float32 and bf16 (on the CPU: float32 48/48 in every answer);
# 3. the same bench as session 50's baseline at one row (MT-bench 80, 128 tokens, greedy, no-spec and auto), to see
#    that nothing moved on the graph path (prefix reuse is off there; is_causal was already CUDA's).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 benchmarks/long_prefill_check.py "$G" --device cuda --tokens 6000 --chunk 1024 --new 32 \
  > "$OUT/long_prefill.log" 2>&1
echo "long prefill rc=$?"
timeout 120 python3 benchmarks/qwen_device_check.py --device cuda --new 48 > "$OUT/qwen.log" 2>&1
echo "qwen rc=$?"
timeout 200 python3 -m eaglespec bench --model "$G" --max-new-tokens 128 --batch-sizes 1 --no-spec --spec auto \
  --out "$OUT/bench_t0" > "$OUT/bench_t0.log" 2>&1
echo "bench rc=$?"
echo "== long prefill"; grep -E "^\||agreeing|identical|tokens on|Error" "$OUT/long_prefill.log"
echo "== qwen"; grep -E "^\||Error" "$OUT/qwen.log"
echo "== bench"; grep -E "^\||Error|error" "$OUT/bench_t0.log" | tail -6
