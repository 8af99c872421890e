#!/usr/bin/env bash
# The H200 measurements of issues 4 and 6 in device calls back to back while the machine stays warm (the GGUF travels
# in three parts: benchmarks/device_parts.sh).
#   1. benchmarks/gpu_measure.sh random    carry .device/g1   (stages the GGUF's first part in /root/m, then runs what
#      needs no checkpoint: the Triton kernel check, the decode-step kernels (benchmarks/step_kernels_check.py),
#      the Kimi-K2.5 slice, the Llama-3.1-8B shape decode and verify, the regeneration throughput; a section's
#      *_LIMIT=1 skips it, e.g. KIMI_LIMIT=1 once the slice is measured)
#   then bash benchmarks/device_parts.sh stage              carry .device/g2
#   2. benchmarks/gpu_measure.sh smollm2   carry .device/g3 .whl   (joins the GGUF; SmolLM2 bf16 step costs and
#      profiles, the step anatomy (host vs graphs), the shipped drafter in bf16, bf16 no-spec with and without
#      overlapped decoding, bench with the oracle and random drafters at batch 1/8/32, transformers as the peer;
#      BENCH_LIMIT=1 / PEER_LIMIT=1 skip the last two)
#   benchmarks/gpu_measure.sh probes      (no carry, no checkpoint: random weights) the step probes of session 10 in one
#      call, ~6 minutes: where a decode step goes (decode_profile.py, Llama-8B and SmolLM2 shapes), the small kernels
#      against PyTorch (small_kernels_check.py), the speculative phases per shape (tree_draft_probe.py --quick), the
#      SmolLM2 engine's decode / verify ratios and the batch sizes 1-32 with the attention kernel's row limit raised
#      (step_kernels_check.py --only=smollm2-135m / batches)
# Every section has its own time limit, so one slow section cannot take the others' results with it.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
run() { local limit=$1 name=$2; shift 2; echo "== $name"; timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "   rc=$? ($name)"; tail -n "${TAILN:-14}" "$OUT/$name.log"; }
if [ "$1" = probes ]; then
  for shape in llama-3.1-8b smollm2-135m; do
    TAILN=30 run "${PROFILE_LIMIT:-150}" "decode_profile_$shape" python3 benchmarks/decode_profile.py "$OUT/dp" "$shape"
  done
  rm -f "$OUT"/dp/trace_*.json   # 3-5 MB each: kept on the device only
  TAILN=16 run "${SMALL_LIMIT:-120}" small_kernels python3 benchmarks/small_kernels_check.py "$OUT/small"
  TAILN=8 run "${TREE_LIMIT:-120}" tree_probe python3 benchmarks/tree_draft_probe.py "$OUT/tree" --quick --profile
  for sec in smollm2-135m batches; do
    TAILN=20 run "${SK_LIMIT:-170}" "step_kernels_$sec" python3 benchmarks/step_kernels_check.py "$OUT/sk_$sec" "--only=$sec"
  done
elif [ "$1" = random ]; then
  bash benchmarks/device_parts.sh stage
  run 60 kernel_check python3 benchmarks/kernel_check.py
  # the decode-step Triton kernels (norm + projection, short attention): bf16 correctness, times, steps with and without
  for sec in attention smollm2-135m llama-3.1-8b kernel; do
    TAILN=8 run "${NL_LIMIT:-170}" "step_kernels_$sec" python3 benchmarks/step_kernels_check.py "$OUT/sk_$sec" "--only=$sec"
  done
  run "${KIMI_LIMIT:-150}" kimi_slice python3 benchmarks/kimi_slice.py "$OUT"
  run "${L8B_LIMIT:-90}" llama8b python3 benchmarks/gpu_smoke.py none "$OUT" 8b
  # regeneration throughput, immediate vs batched admission (one process each)
  for k in 1 32; do KS=$k run "${REGEN_LIMIT:-90}" "regen_k$k" python3 benchmarks/regen_throughput.py "/tmp/rt$k" 1024 256; done
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:src
  bash benchmarks/device_parts.sh join
  run "${SMOKE_LIMIT:-120}" smoke_bf16 python3 benchmarks/gpu_smoke.py "$M" "$OUT" bf16fast
  # engine step vs its graphs alone: the host's share of a step (decides overlap scheduling vs kernel fusion)
  TAILN=16 run "${ANAT_LIMIT:-110}" step_anatomy python3 benchmarks/step_anatomy.py "$OUT" "$M"
  # the shipped drafter in bf16, the dtype CUDA users get (its per-device policy was set from float32 runs)
  TAILN=12 run "${SHIPPED_LIMIT:-120}" bench_shipped_bf16 python3 -m eaglespec bench --model "$M" --dtype bfloat16 \
    --draft src/eaglespec/assets/smollm2-135m-eagle3 ${SHIPPED_SPECS:---spec 1,1,2 --spec 2,1,3 --spec 3,1,4} \
    --batch-sizes "${SHIPPED_BATCHES:-1,8}" --limit "${SHIPPED_N:-40}" --max-new-tokens 256 --out /tmp/bs
  cp /tmp/bs/results.json "$OUT/bench_shipped_bf16.json" 2>/dev/null
  # the 1000 tok/s goal's benchmark (bf16, no speculation, MT-bench), without and with overlapped decoding
  for ov in no-overlap overlap; do
    TAILN=5 run "${NOSPEC_LIMIT:-70}" "nospec_bf16_$ov" python3 -m eaglespec bench --model "$M" --dtype bfloat16 \
      --no-spec "--$ov" --batch-sizes 1,32 --max-new-tokens 256 --out "/tmp/ns_$ov"
    cp "/tmp/ns_$ov/results.json" "$OUT/nospec_bf16_$ov.json" 2>/dev/null
  done
  TAILN=30 run "${BENCH_LIMIT:-170}" bench_oracle python3 -m eaglespec bench --model "$M" --dtype float32 --compile --draft oracle \
    --draft random --spec 3,1,4 --spec 5,4,16 --batch-sizes 1,8,32 --limit 32 --max-new-tokens 128 --out /tmp/bo
  cp /tmp/bo/results.json "$OUT/bench_oracle.json" 2>/dev/null
  run "${PEER_LIMIT:-60}" peer python3 -m eaglespec bench --model "$M" --no-spec --peer hf --limit 4 --max-new-tokens 128 --out /tmp/bp
  cp /tmp/bp/results.json "$OUT/bench_peer.json" 2>/dev/null
fi
# at most 8 files come back from a call: everything in one archive (the tails above are the summary)
(cd "$OUT" && tar czf measure.tgz --exclude measure.tgz . && find . -type f ! -name measure.tgz -delete)
