#!/usr/bin/env bash
# Session 67's device check of the greedy CUDA schedule at 16 and 32 rows after session 66 gave 9-12-row steps the
# chain of 4 (fb7e199; measured then at 12 rows only): `--spec auto` beside --no-spec, continuous batching, MT-bench
# 80, 256 tokens, with the committed schedule (`new`) and the one before it (`old`: 9-16 rows the chain of 3), in
# alternation, each table printed as its run ends. Run after the GGUF is staged (device_parts.sh join). Not run yet:
# session 67 got no device machine (every start refused).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name --format=csv,noheader
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
D=src/eaglespec/assets/smollm2-135m-eagle3
ARGS="bench --model $G --draft $D --max-new-tokens 256 --prompts mt-bench --no-spec --spec auto \
  --batch-sizes ${ROWS:-16,32} --batching continuous"
OLD=$(mktemp --suffix=.py)   # the bench under session 65's schedule (a file: `timeout` runs commands, not functions)
cat > "$OLD" <<'PY'
import runpy, sys
from eaglespec import assets
a = assets
a._DEFAULT_SPEC["cuda"] = ((1, a._CHAIN_4), (8, a._TREE_K4), (16, a._CHAIN_3), (32, a._TREE_K2))
print("with the old schedule:", a._DEFAULT_SPEC["cuda"], flush=True)
sys.argv = ["eaglespec"] + sys.argv[1:]
runpy.run_module("eaglespec", run_name="__main__", alter_sys=True)
PY
for r in ${RUNS:-new1 old1 new2 old2}; do
  case $r in
    new*) timeout 250 python3 -m eaglespec $ARGS --out "$OUT/$r" > "$OUT/$r.log" 2>&1 ;;
    old*) timeout 250 python3 "$OLD" $ARGS --out "$OUT/$r" > "$OUT/$r.log" 2>&1 ;;
  esac
  echo "$r rc=$?"; grep -E "^\| (no-spec|draft|auto)|Error|schedule" "$OUT/$r.log" | head -12
done
