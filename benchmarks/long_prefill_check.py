"""Chunked prefill and prefix reuse on a device (session 52; both built and tested on the CPU only):

1. a long prompt prefilled whole (`prefill_chunk=None`) and in windows (`--chunk`): the prefill's time (its second
   run: the first one's first-use costs apart), the first
   token's log-probability, how many of the first `--new` greedy tokens agree (bf16 may flip near-ties);
2. an eager engine (no CUDA graphs: the engines that keep free rows, as MoE targets run) answering a conversation's
   second turn with and without prefix reuse: the time to its first token, its answer identical or not.

    python benchmarks/long_prefill_check.py [GGUF] [--device cuda] [--tokens 6000] [--chunk 1024] [--new 32]
"""

from __future__ import annotations

import argparse
import time

import torch

from eaglespec import api
from eaglespec.config import EngineConfig
from eaglespec.sampling_params import SamplingParams


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def first_logprob(eng, ids: list[int]) -> float:
    """The log-probability of the first token a prefill of `ids` chooses (greedy)."""
    out = eng.generate([ids], SamplingParams(max_new_tokens=1, logprobs=0), chat=False)[0]
    return out.logprobs[0].logprob


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--tokens", type=int, default=6000)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()
    ids = [(i * 7919) % 40000 + 100 for i in range(args.tokens)]
    params = SamplingParams(max_new_tokens=args.new, ignore_eos=True)
    rows = []
    answers = {}
    for chunk in (None, args.chunk):
        eng = api.load(args.model, draft=None, config=EngineConfig(device=args.device, max_batch_size=1,
                                                                   max_seq_len=args.tokens + 256,
                                                                   prefill_chunk=chunk, reuse_prefixes=False))
        dev = str(eng.device)
        eng.generate([ids[:64]], SamplingParams(max_new_tokens=2), chat=False)  # warm-up
        lp = first_logprob(eng, ids)  # its first use (on CUDA: kernels' first shapes, compiles) untimed
        sync(dev)
        t = time.perf_counter()
        lp = first_logprob(eng, ids)
        sync(dev)
        seconds = time.perf_counter() - t
        answers[chunk] = eng.generate([ids], params, chat=False)[0].token_ids
        rows.append((chunk, seconds, lp))
        del eng
    agree = next((i for i, (a, b) in enumerate(zip(*answers.values())) if a != b), args.new)
    print(f"long prompt of {args.tokens} tokens on {dev}:")
    print("| prefill | seconds | first token's log-probability |")
    print("| --- | ---: | ---: |")
    for chunk, seconds, lp in rows:
        print(f"| {'whole' if chunk is None else f'windows of {chunk}'} | {seconds:.3f} | {lp:.5f} |")
    print(f"greedy tokens agreeing from the start: {agree} of {args.new}")

    turn = [(i * 104729) % 40000 + 100 for i in range(min(args.tokens, 3000))]
    out = {}
    for reuse in (False, True):
        eng = api.load(args.model, draft=None, config=EngineConfig(device=args.device, max_batch_size=1,
                                                                   cuda_graphs=False, reuse_prefixes=reuse,
                                                                   max_seq_len=len(turn) + 512))
        first = eng.generate([turn], params, chat=False)[0]
        follow = turn + first.token_ids + turn[:40]
        t = time.perf_counter()
        req = eng.add_request(follow, params, chat=False)
        while not req.finished:
            eng.step()
        out[reuse] = (req.t_first - req.t_start, time.perf_counter() - t, req.reused, list(req.output_ids))
        del eng
    print(f"second turn of {len(follow)} tokens, eager engine on {dev}:")
    print("| reuse | TTFT (ms) | turn (s) | reused tokens |")
    print("| --- | ---: | ---: | ---: |")
    for reuse, (ttft, total, reused, _) in out.items():
        print(f"| {'on' if reuse else 'off'} | {ttft * 1e3:.1f} | {total:.3f} | {reused} |")
    print(f"answers identical: {out[False][3] == out[True][3]}")


if __name__ == "__main__":
    main()
