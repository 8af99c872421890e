"""What forwards of several tokens cost on this machine against one of a single token: the measurement behind
`draft="auto"`'s choice on the CPU (`api.auto_spec`, with the policy of `assets.cpu_sizes` / `assets.cpu_choice`).

Speculation gains only when verifying D tokens costs well under D decode steps. On a GPU a few-token forward costs
about a one-token one (weights are read once, compute is idle), and the policy there is measured per device type.
On a CPU it depends on the machine and on how the projections are computed: on one 2-core machine a 3-token forward
of SmolLM2 cost 1.0x a 1-token one (session 9: S2 K1 D3 1.46x), on another (an AMD EPYC) 1.64-1.80x through
F.linear's few-row GEMMs (session 18: 0.90-0.99x), 1.01-1.07x for 2-4 tokens through weight-major projections
(session 19), 1.24-1.3x for 3-6 tokens through oneDNN's packed copies (session 61), and on an Intel Xeon whose MKL
serves 3 rows at about the cost of 1 and jumps at 4, 1.1x for 3 tokens against 1.35x for 4 and 1.43x for 6
(session 68, layers/cpu_linear.py). So the CPU's choice is measured where it runs, on the target as the engine will
run it (after `prepare_for_inference`).

`verify_cost_ratios(model, sizes, repeats=5, record=None) -> {size: ratio}`: cache-free forwards of 1 x n positions
(no grad; the logits of every position computed, as a verify computes them), after one warm-up of each size, timed in
rounds of 1 token then each size in turn; a size's ratio is the median over the rounds of its time over the same
round's 1-token time. Both choices matter on a shared machine, whose speed drifts between seconds and whose single
forwards are sometimes hit by a busy spell. Timed one size after the other (two of each), the ratio for SmolLM2's 4
tokens ranged 0.87-1.28 over 12 calls on an idle 2-core VM, against 0.94-1.15 alternating (session 33). Session 68
(a 2-core Xeon, sizes 3 / 4 / 6 together): as the fastest of each size over the fastest of 1 token, the greedy choice
these ratios feed (`assets.cpu_choice`) came out the same (the chain of 2) in 8 of 12 calls (3 rounds: 9 of 12); as
the median of each round's ratio, in 11 of 12 (3 rounds: 7 of 12). About 1.1 s for SmolLM2's sizes 3, 4 and 6 on a
2-core CPU, 0.2 s a round.

`record` (a JSON file; `api.auto_spec` passes `record_path()`): the rounds timed before on this machine, kept per
key (`machine_key`: the CPU, torch, its threads, the model's parameters and how its projections run) and size for
RECORD_DAYS, at most RECORD_ROUNDS of them. A size with `repeats` rounds there takes one more round (warm-up included,
~0.4 s for three sizes), none once it has RECORD_ROUNDS, and one with fewer, `repeats` rounds, as with no record; its
ratio is the median over its recorded rounds and the new ones. So a machine's first load times `repeats` rounds and
later loads refine the median at a fraction of the cost (session 68: the timing had added ~0.65 s to `generate`'s
start-up). An unreadable record is timed afresh, and an unwritable one is left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..layers.context import ForwardContext
from .kv_cache import KVCache

RECORD_ROUNDS = 15  # rounds kept per key and size: the median over them decides
RECORD_DAYS = 7.0  # after which a recorded round is dropped (a machine's load and software change)
VERIFY_PREFIX = 128  # committed tokens before a forward timed as a verify (`as_verify`)


def _verify_context(model: torch.nn.Module, n: int, device: torch.device) -> Callable[[], ForwardContext]:
    """A forward of n tokens as a chain's verify (or, n = 1, a decode step) after VERIFY_PREFIX committed ones:
    through a KV cache of the target's shapes and dtype (ModelRunner.kv_dtype), each token seeing the prefix and the
    tokens before it. Returns a maker of a fresh context a forward (a context keeps per-forward values)."""
    dtype = getattr(model, "kv_dtype", None) or next(model.parameters()).dtype
    kv = KVCache(model.config.num_hidden_layers, model.kv_cache_shapes(), 1, VERIFY_PREFIX + n, dtype, device)
    pos = torch.arange(VERIFY_PREFIX, VERIFY_PREFIX + n, device=device)[None]  # [1, n]
    mask = torch.arange(VERIFY_PREFIX + n, device=device)[None, None, :] <= pos[..., None]  # [1, n, prefix + n]
    return lambda: ForwardContext(positions=pos, write_index=pos, attn_mask=mask, kv=kv.layers())


def _forward_s(model: torch.nn.Module, ids: torch.Tensor, context: Callable[[], ForwardContext] | None) -> float:
    ctx = context() if context is not None else ForwardContext.plain(1, ids.shape[1], ids.device)
    t0 = time.perf_counter()
    model(ids, ctx)
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    return time.perf_counter() - t0


def record_path() -> Path | None:
    """Where `api.auto_spec` keeps this machine's timed rounds: $EAGLESPEC_CACHE_DIR/cpu_forward_costs.json (the
    variable set but empty: no record), else under $XDG_CACHE_HOME/eaglespec or ~/.cache/eaglespec."""
    folder = os.environ.get("EAGLESPEC_CACHE_DIR")
    if folder is None:
        try:
            folder = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eaglespec")
        except RuntimeError:  # no home directory to be found: no record
            return None
    return Path(folder) / "cpu_forward_costs.json" if folder else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(model: torch.nn.Module) -> str:
    """What a forward's timing depends on besides the load of the moment: the CPU and its core count, torch and its
    threads, the model's parameters (names, shapes, dtypes) and how each projection and layer runs (`CpuLinear`'s
    packed copy and `direct_rows`, the modules' types, the 4-bit path's numba steps), as a short hash."""
    parts = [_cpu_name(), str(os.cpu_count()), torch.__version__, str(torch.get_num_threads())]
    parts += [f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in model.named_parameters()]
    parts += [f"{n}:{type(m).__name__}:{getattr(m, 'direct_rows', '')}:{getattr(m, 'packed', None) is not None}"
              for n, m in model.named_modules()]
    # layers whose steps run the 4-bit path's numba kernels (engine/int4_step.py)
    parts += [f"{n}:int4-step" for n, m in model.named_modules() if getattr(m, "cpu_step", None) is not None]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _read(record: Path) -> dict:
    try:
        doc = json.loads(record.read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(record: Path, doc: dict) -> None:
    """Atomically (another process may read it meanwhile); where the folder cannot be written, nothing."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=record.parent, prefix=record.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, record)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def _kept(doc: dict, key: str) -> dict:
    """A record's rounds for one key (size text -> rounds), {} where absent or malformed."""
    kept = doc.get(key)
    return kept if isinstance(kept, dict) else {}


def _recorded(entry: object, now: float) -> list[tuple[float, float]]:
    """A size's recorded (time, ratio) rounds younger than RECORD_DAYS (malformed ones dropped)."""
    if not isinstance(entry, list):
        return []
    rounds = [(float(t), float(r)) for t, r in (x for x in entry if isinstance(x, list) and len(x) == 2)
              if isinstance(t, (int, float)) and isinstance(r, (int, float))]
    return [(t, r) for t, r in rounds if now - t < RECORD_DAYS * 86400 and r > 0]


@torch.no_grad()
def _time_rounds(model: torch.nn.Module, rounds: dict[int, int], as_verify: bool) -> dict[int, list[float]]:
    """Each size's ratio in each of its `rounds[size]` rounds (a round: 1 token, then each size it still needs),
    after a warm-up of each size timed at all; `as_verify`: forwards through a cache (`_verify_context`)."""
    ratios: dict[int, list[float]] = {n: [] for n in rounds}
    sizes = [n for n in sorted(rounds) if rounds[n] > 0]
    if not sizes:
        return ratios
    device = next(model.parameters()).device
    ids = {n: torch.zeros(1, n, dtype=torch.long, device=device) for n in [1] + sizes}
    contexts = {n: _verify_context(model, n, device) if as_verify else None for n in ids}
    for n, x in ids.items():  # warm-up
        _forward_s(model, x, contexts[n])
    for i in range(max(rounds[n] for n in sizes)):
        one = _forward_s(model, ids[1], contexts[1])
        for n in sizes:
            if i < rounds[n]:
                ratios[n].append(_forward_s(model, ids[n], contexts[n]) / one)
    return ratios


def verify_cost_ratios(model: torch.nn.Module, sizes: Iterable[int], repeats: int = 5, record: Path | None = None,
                       as_verify: bool = False) -> dict[int, float]:
    """{n: (time of a forward of n positions) / (time of one of 1 position)} for each of `sizes`: the median of the
    rounds' ratios, `repeats` rounds timed now, or, for a size with at least that many in the `record`, the recorded
    ones and one more (none once it has RECORD_ROUNDS). `as_verify`: the forwards run as a chain's verify and a decode
    step do, through a KV cache after VERIFY_PREFIX tokens (module docstring), kept in the record apart."""
    sizes = sorted(set(sizes))
    if not sizes or sizes[0] < 1 or repeats < 1:
        raise ValueError(f"verify_cost_ratios: sizes must be >= 1 and repeats >= 1 (got {sizes}, {repeats})")
    now = time.time()
    doc = _read(record) if record is not None else {}
    key = machine_key(model) + (":verify" if as_verify else "") if record is not None else ""
    kept = _kept(doc, key)
    history = {n: _recorded(kept.get(str(n)), now) for n in sizes}
    # a size kept fewer than `repeats` times: `repeats` rounds; fewer than RECORD_ROUNDS: one more; else none
    timed = _time_rounds(model, {n: repeats if len(h) < repeats else int(len(h) < RECORD_ROUNDS)
                                 for n, h in history.items()}, as_verify)
    for n in sizes:
        history[n] = (history[n] + [(now, r) for r in timed[n]])[-RECORD_ROUNDS:]
    if record is not None and any(timed.values()):
        fresh = _read(record)  # another process's record meanwhile, if any, keeps its other keys
        fresh[key] = {**_kept(fresh, key), **{str(n): [list(x) for x in h] for n, h in history.items()}}
        _write(record, fresh)
    return {n: statistics.median(r for _, r in h) for n, h in history.items()}
