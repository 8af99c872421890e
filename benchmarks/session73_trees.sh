#!/usr/bin/env bash
# Session 73: trees past the construction kernels' old bounds (K > 8, > 1,024 candidates) on the kernels against
# PyTorch's path, random SmolLM2 weights (no GGUF needed): first the tokens (kernels on / off must agree), then each
# phase's time per step, the new bounds against the old ones (with_setting), alternating.
set -euo pipefail
cd benchmarks
CASES=(--case=1:8,8,48 --case=1:20,8,48 --case=1:24,8,48 --case=1:12,10,48 --case=1:10,16,48)
OLD=(eaglespec.layers.tree_build_kernels.MAX_CANDIDATES=1024 eaglespec.layers.tree_build_kernels.MAX_LEVEL_WIDTH=8)
export PYTHONPATH=../src PYTHONUNBUFFERED=1
timeout 150 python3 tree_kernels_check.py "$OUT/check" "--specs=20,8,48;12,10,48;5,16,48" --rows=1 \
  > "$OUT/check.txt" 2>&1 || echo "check failed or cut: $?"
tail -n 12 "$OUT/check.txt"
for r in $(seq 1 "${ROUNDS:-2}"); do
  python3 spec_phase_trace.py "$OUT/new$r" --only=1 --draft-vocab=12288 "${CASES[@]}" > "$OUT/new$r.txt" 2>&1
  python3 with_setting.py "${OLD[@]}" -- spec_phase_trace.py "$OUT/old$r" --only=1 --draft-vocab=12288 "${CASES[@]}" \
    > "$OUT/old$r.txt" 2>&1
done
for f in $(cd "$OUT" && ls new*.txt old*.txt | sed "s/.txt//"); do echo "== $f"; grep "ms by events" "$OUT/$f.txt" || tail -n 8 "$OUT/$f.txt"; done
