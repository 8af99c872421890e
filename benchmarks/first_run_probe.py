"""Why does the first speculative configuration of a batch size run slower than the next ones in one `eaglespec
bench` process (session 7, H200: batch 8, 2.36 s against 1.96 s for the same work)? A one-time cost in the timed
run: this wrapper runs `eaglespec bench ARGS...` and prints, with seconds since start, every Triton JIT compile
(`triton.knobs.runtime.jit_post_compile_hook`), the start and end of every timed run, and torch.compile's counters
at both, so compiles that land inside a timed run show up.

    python3 benchmarks/first_run_probe.py [--no-cudnn-sdp] [--no-prefill-pass] bench --model M --draft D ...

Session 7 found no compile inside the timed runs. The suspect left (docs/benchmarks.md, "Session 7"): SDPA's cuDNN
backend, which builds an execution plan once per new shape on the host, in the eager multi-row prefill and catch-up
(one shape per batch of prompts; the phase timer's CUDA events do not see host work, hence the "rest" share).
`--no-cudnn-sdp` turns that backend off (`torch.backends.cuda.enable_cudnn_sdp(False)`): if the first run's extra time
goes, that is the cause. Session 8 found it so (2.45 s / 1.93 s for the same work with cuDNN, 1.95 s / 1.96 s without;
docs/benchmarks.md, "Session 8"), and eager SDPA calls now skip cuDNN (layers/attention.py). Since session 7 the bench
prefills every timed batch once, untimed, in its warm-up (`ConfigRun.prefill_pass`), which should hide any such
one-time cost; `--no-prefill-pass` skips it, as the bench of session 7 did, so the cause can still be probed.
"""

from __future__ import annotations

import sys
import time

import torch
import triton

T0 = time.perf_counter()


def stamp(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:8.2f}] {msg}", flush=True)


def on_compile(*args, **kw) -> bool:
    fn = kw.get("fn")
    name = getattr(getattr(fn, "fn", fn), "__qualname__", "?")
    stamp(f"triton compile {name}: {str(kw.get('repr', ''))[:200]}")
    return False


def dynamo_counts() -> str:
    from torch._dynamo.utils import counters

    return str({k: dict(v) for k, v in counters.items() if k in ("stats", "frames", "recompiles")})


def main() -> int:
    from eaglespec.bench import runs
    from eaglespec.cli import main as cli

    args = sys.argv[1:]
    while args and args[0] in ("--no-cudnn-sdp", "--no-prefill-pass"):
        if args.pop(0) == "--no-cudnn-sdp":
            torch.backends.cuda.enable_cudnn_sdp(False)
            stamp("cuDNN SDPA off")
        else:
            runs.ConfigRun.prefill_pass = lambda self, *a, **kw: None
            stamp("no untimed prefill pass")
    triton.knobs.runtime.jit_post_compile_hook = on_compile
    torch._logging.set_logs(recompiles=True)

    timed = runs.ConfigRun.run

    def run(self, prompts, params, refs=None):
        stamp(f"timed run start: {self.config.name} bs={self.batch_size} {dynamo_counts()}")
        timed(self, prompts, params, refs)
        stamp(f"timed run end: {self.config.name} bs={self.batch_size} {dynamo_counts()}")

    runs.ConfigRun.run = run
    rc = cli(args)
    from torch._dynamo.utils import compile_times

    print(compile_times(), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
