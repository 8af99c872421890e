#!/usr/bin/env bash
# `eaglespec generate` with its defaults (the embedded SmolLM2 and, where the policy says so, its shipped drafter)
# against `--no-spec`: MT-bench questions 14, 27, 40, 53, 66, 79 (one per category), 128 new tokens, greedy, each its
# own process (as a user runs it). Prints the totals and the ratio; the per-answer stats go to OUT/*.json.
# ARGS: more options for every run (e.g. ARGS="--cpu-weights q4"); EAGLESPEC: the command (default `eaglespec`; e.g.
# EAGLESPEC="python benchmarks/with_setting.py eaglespec.engine.int4_step.USE_KERNELS=False -- -m eaglespec").
#   bash benchmarks/cpu_generate.sh OUT
set -euo pipefail
OUT=${1:?usage: cpu_generate.sh OUT}
mkdir -p "$OUT"
for q in 14 27 40 53 66 79; do
  prompt=$(python -c "from eaglespec.bench.datasets import mt_bench; print(mt_bench()[$q - 1].first)")
  for mode in default no-spec; do
    flag=(); [ "$mode" = no-spec ] && flag=(--no-spec)
    # shellcheck disable=SC2086  # ARGS, EAGLESPEC: split on spaces
    ${EAGLESPEC:-eaglespec} generate "$prompt" --max-new-tokens 128 ${ARGS:-} "${flag[@]}" --stats-json "$OUT/q$q-$mode.json" \
      > "$OUT/q$q-$mode.txt"
  done
  cmp -s "$OUT/q$q-default.txt" "$OUT/q$q-no-spec.txt" && echo "q$q: same answer" || echo "q$q: answers differ"
done
python - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
tot = {}
for mode in ("default", "no-spec"):
    st = [json.loads(p.read_text()) for p in sorted(out.glob(f"q*-{mode}.json"))]
    n, s = sum(x["tokens"] for x in st), sum(x["seconds"] for x in st)
    tot[mode] = n / s
    taus = [x.get("accept_length_mean") for x in st if x.get("accept_length_mean")]
    print(f"{mode}: {n} tokens in {s:.2f} s ({n / s:.1f} tok/s)" + (f", tau per answer {min(taus):.2f}-{max(taus):.2f}" if taus else ""))
print(f"speedup {tot['default'] / tot['no-spec']:.2f}x")
PY
