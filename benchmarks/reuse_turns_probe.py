"""Prefix reuse on an eager CUDA engine, turn by turn (session 52: its first reused turn took 4.6 s against 32 ms
without reuse, in long_prefill_check.py): a 3,000-token first prompt, then turns of 40 new tokens each, reuse on and
off, torch.compile on and off; the time to each turn's first token.

    python benchmarks/reuse_turns_probe.py GGUF [--turns 4]
"""

from __future__ import annotations

import argparse

import torch

from eaglespec import api
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--turns", type=int, default=4)
    args = ap.parse_args()
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    first = [(i * 104729) % 40000 + 100 for i in range(3000)]
    print("| compile | reuse | TTFT per turn (ms) | reused per turn |")
    print("| --- | --- | --- | --- |")
    for compile_ in (True, False):
        for reuse in (False, True):
            eng = api.load(args.model, draft=None, config=EngineConfig(
                device="cuda", max_batch_size=1, cuda_graphs=False, reuse_prefixes=reuse, compile=compile_,
                max_seq_len=4096))
            prompt, ttft, reused = list(first), [], []
            for turn in range(args.turns + 1):
                torch.cuda.synchronize()
                req = eng.add_request(prompt, params, chat=False)
                while not req.finished:
                    eng.step()
                ttft.append((req.t_first - req.t_start) * 1e3)
                reused.append(req.reused)
                prompt = prompt + list(req.output_ids) + [(turn * 31 + j) % 40000 + 100 for j in range(40)]
            print(f"| {compile_} | {reuse} | {' / '.join(f'{t:.1f}' for t in ttft)} | "
                  f"{' / '.join(map(str, reused))} |")
            del eng


if __name__ == "__main__":
    main()
