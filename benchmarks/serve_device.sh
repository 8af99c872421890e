#!/usr/bin/env bash
# `eaglespec serve` on the device machine in one call: the default server (the shipped drafter, auto's schedule)
# against plain decoding through HTTP, whole answers at 1 / 8 / 32 clients and streamed at 32 clients for
# --stream-interval 1 / 4 / 16. Logs, tables and each server's /metrics under $OUT.
#
#   run(carry=[".device/g1"]) bash benchmarks/device_parts.sh stage; run(carry=[".device/g2"]) ... stage
#   run(carry=[".device/g3", ".whl"]) bash benchmarks/device_parts.sh join && bash benchmarks/serve_device.sh
#
# .whl holds the web stack's wheels for the device's Python 3.12 (serve_load.py's docstring gives the download:
# fastapi uvicorn pydantic httptools uvloop prometheus-client), installed here into /tmp/site. About 4-5 minutes.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
python3 -c "import fastapi, uvicorn, uvloop, httptools, prometheus_client"   # a missing wheel stops here
G=/root/m/SmolLM2-135M-Instruct.Q4_1.gguf
python3 benchmarks/serve_load.py "$OUT/json" --concurrency 1,8,32 --limit 80 --rounds 4 --max-tokens 256 \
  "--server-args=--model $G --no-spec" "--server-args=--model $G" | tee "$OUT/json.md"
python3 benchmarks/serve_load.py "$OUT/stream" --stream --concurrency 32 --limit 80 --rounds 2 --max-tokens 256 \
  "--server-args=--model $G --no-spec" "--server-args=--model $G" "--server-args=--model $G --stream-interval 4" \
  "--server-args=--model $G --stream-interval 16" | tee "$OUT/stream.md"
grep -h "serving\|captured" "$OUT"/json/server_*.log | head -4
