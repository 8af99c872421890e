"""One GGUF on the CPU through `api.load`: load seconds, peak resident memory, and one-row plain decoding speed.

For files without a tokenizer too (a fixed prompt of token ids, `ignore_eos`): `--cpu-weights` as the CLI takes it
(auto / q4 / dense), THREADS PyTorch threads (2), one warm-up, then the best of ROUNDS decodes of TOKENS tokens. The
peak resident set is the process's (`ru_maxrss`), so run one configuration a process (what this script is: one file,
one setting).

usage: PYTHONPATH=src python benchmarks/gguf_cpu_load.py FILE [auto|q4|dense] [TOKENS] [ROUNDS] [THREADS]
"""

from __future__ import annotations

import json
import resource
import sys
import time

import torch

from eaglespec import api
from eaglespec.config import EngineConfig
from eaglespec.engine.int4_weights import on_int4_path
from eaglespec.sampling_params import SamplingParams


def main() -> None:
    path = sys.argv[1]
    weights = sys.argv[2] if len(sys.argv) > 2 else "auto"
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    torch.set_num_threads(threads)
    t = time.perf_counter()
    engine = api.load(path, draft=None, config=EngineConfig(device="cpu", max_batch_size=1, cpu_weights=weights))
    load_s = time.perf_counter() - t
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    vocab = engine.runner.target.get_embed_and_head()[0].shape[0]  # the embedding weight [vocabulary, hidden]
    prompt = [(7 * i + 3) % vocab for i in range(32)]
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    engine.generate([prompt], params)  # warm-up
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        engine.generate([prompt], params)
        best = max(best, tokens / (time.perf_counter() - t))
    four_bit = on_int4_path(engine.runner.target)
    print(json.dumps(dict(file=path.rsplit("/", 1)[-1], cpu_weights=weights, threads=threads, four_bit=four_bit,
                          load_s=round(load_s, 1),
                          peak_rss_gb_after_load=round(peak_gb, 2), tok_s=round(best, 1))))


if __name__ == "__main__":
    main()
