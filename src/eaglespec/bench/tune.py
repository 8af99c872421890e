"""Tuning: the grid of speculative shapes to try, and the verdict per batch size.

Contract:
- `grid(steps, topk, draft_tokens)` -> the `SpecConfig`s to try. Each argument is a list or None for the default.
  The default grid is the chains S = 1..8 (K = 1, D = S + 1) and the trees S in (2, 4, 6, 8), K in (2, 4, 8),
  D in (8, 16, 32) with S + 1 < D <= 1 + S*K: 28 shapes. With explicit lists the grid is their product, keeping the
  valid shapes (1 <= D <= 1 + S*K); without --draft-tokens, D is S + 1 for a chain and each default D that fits a
  tree. Order: by (S, K, D); duplicates dropped.
- `verdict(records)` -> per batch size the fastest run overall and the fastest speculative one (record dicts of
  report.py), whether speculation is net-negative there, and the sentence that says so:
  "net-negative at batch size B: the fastest speculative configuration (S=.. K=.. D=..) runs X tok/s, slower than no
  speculation at Y tok/s; run without speculation".
- `spec_max_rows(verdicts)` -> when speculation wins at the smaller batch sizes and loses at a larger one, the
  largest batch size B up to which it wins everywhere (the `--spec-max-rows B` an engine of more rows should serve
  with), else None.
- `schedule(verdicts)` -> one engine's policy: the fastest speculative shape per batch size, up to the first size
  where speculation loses, as a SpecSchedule by rows (one shape: a SpecConfig; none wins: None).
- `tune_section(records, sampling)` -> the document's "tune" entry: {"mode", "fastest": {bs: config},
  "fastest_speculative": {bs: config}, "net_negative": {bs: bool}, "fastest_identical": {bs: config | None} (the
  fastest speculative run whose answers all equal no speculation's; greedy sweeps only), "spec_max_rows": B | None,
  "schedule": "R:S,K,D/..." | "S,K,D" | None, "messages": [...]}; with a B a message says "speculation pays up to
  batch size B and loses above it: serve engines of more rows with --spec-max-rows B"; with a schedule of several
  shapes one says "one engine for all these batch sizes: --spec R:S,K,D/... [--spec-max-rows B] (Python:
  eaglespec.load(spec=...))". `mode` (`sweep_mode(sampling)`, the document's "sampling" entry): the kind of step
  measured, "greedy", "sampled" or "penalized"; for the last two the last message gives the schedule as that mode's
  entries of a `--spec` ("GREEDY;sampled=...", or "=plain" where speculation lost everywhere). In a greedy sweep,
  where the fastest speculative run's answers differ from no speculation's in some prompts (bf16 verifies of many
  tokens round unlike one-token steps: the one-row trees of session 62, 15-23 of 80 answers equal on MT-bench, against
  the chain's 80), a message per batch size says how many and names the fastest run that kept them all
  (`Verdict.identity_note`); the schedule stays the fastest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..config import SpecConfig

from ..spec_schedule import SpecSchedule, spec_text
from ..errors import ConfigError

CHAIN_STEPS = tuple(range(1, 9))
TREE_STEPS = (2, 4, 6, 8)
TREE_TOPK = (2, 4, 8)
TREE_TOKENS = (8, 16, 32)


def grid(steps: Sequence[int] | None = None, topk: Sequence[int] | None = None,
         draft_tokens: Sequence[int] | None = None) -> list[SpecConfig]:
    out: list[SpecConfig] = []
    if steps is None and topk is None and draft_tokens is None:
        out += [SpecConfig.chain(s) for s in CHAIN_STEPS]
        out += [SpecConfig(s, k, d) for s in TREE_STEPS for k in TREE_TOPK for d in TREE_TOKENS
                if s + 1 < d <= 1 + s * k]
    else:
        for s in steps or CHAIN_STEPS:
            for k in topk or (1,) + TREE_TOPK:
                if s < 1 or k < 1:
                    raise ConfigError(f"steps and topk must be >= 1 (got S={s} K={k})")
                ds = draft_tokens if draft_tokens is not None else (
                    (s + 1,) if k == 1 else tuple(d for d in TREE_TOKENS if s + 1 < d <= 1 + s * k))
                out += [SpecConfig(s, k, d) for d in ds if 1 <= d <= 1 + s * k]
    unique = sorted(set(out), key=lambda c: (c.steps, c.topk, c.draft_tokens))
    if not unique:
        raise ConfigError("the tuning grid is empty: no draft-tokens value fits 1 <= D <= 1 + steps*topk")
    return unique


@dataclass
class Verdict:
    batch_size: int
    fastest: dict[str, Any]
    fastest_spec: dict[str, Any] | None
    baseline: dict[str, Any] | None
    fastest_identical: dict[str, Any] | None = None  # the fastest speculative run whose every answer is the baseline's

    @property
    def net_negative(self) -> bool:
        return (self.fastest_spec is not None and self.baseline is not None
                and self.fastest_spec["tok_per_s"] < self.baseline["tok_per_s"])

    def message(self) -> str:
        s, b = self.fastest_spec, self.baseline
        if s is None or b is None:
            f = self.fastest
            return f"batch size {self.batch_size}: fastest is {f['config']} at {f['tok_per_s']:.1f} tok/s"
        shape = _shape(s)
        if self.net_negative:
            return (f"net-negative at batch size {self.batch_size}: the fastest speculative configuration ({shape}) "
                    f"runs {s['tok_per_s']:.1f} tok/s, slower than no speculation at {b['tok_per_s']:.1f} tok/s; "
                    "run without speculation")
        return (f"batch size {self.batch_size}: fastest is {shape} ({s['config']}) at {s['tok_per_s']:.1f} tok/s, "
                f"{s['tok_per_s'] / b['tok_per_s']:.2f}x no speculation ({b['tok_per_s']:.1f} tok/s): {_flags(s)}")

    def identity_note(self) -> str | None:
        """For a greedy sweep: where the fastest speculative run (winning over no speculation) gave answers other
        than no speculation's in some prompts, how many, and the fastest run that kept them all (or that none did).
        On a GPU in bf16 a verify of many tokens rounds its products unlike a one-token step, and near-ties of the
        argmax flip: a user who needs plain decoding's exact text takes the second shape. None otherwise."""
        s = self.fastest_spec
        if s is None or self.baseline is None or self.net_negative:
            return None
        same, n = _identical(s)
        if same is None or same == n:
            return None
        note = (f"batch size {self.batch_size}: with {_shape(s)} {same}/{n} answers equal no speculation's (a verify "
                "of several tokens can round unlike a one-token step and flip a near-tie)")
        f = self.fastest_identical
        if f is None or f["tok_per_s"] < self.baseline["tok_per_s"]:
            return note + "; no faster speculative configuration kept every answer"
        return (note + f"; every answer kept, fastest: {_shape(f)} ({f['config']}) at {f['tok_per_s']:.1f} tok/s, "
                f"{f['tok_per_s'] / self.baseline['tok_per_s']:.2f}x: {_flags(f)}")


def _shape(r: dict[str, Any]) -> str:
    return f"S={r['steps']} K={r['topk']} D={r['draft_tokens']}"


def _flags(r: dict[str, Any]) -> str:
    return f"--steps {r['steps']} --topk {r['topk']} --draft-tokens {r['draft_tokens']}"


def _identical(r: dict[str, Any]) -> tuple[int | None, int | None]:
    """(answers equal to the baseline's, prompts) of a record; None where the run did not compare them."""
    return r.get("identical_outputs"), r.get("prompts")


def verdict(records: Sequence[dict[str, Any]]) -> list[Verdict]:
    out = []
    for bs in dict.fromkeys(r["batch_size"] for r in records if r["kind"] != "peer"):
        rs = [r for r in records if r["batch_size"] == bs and r["kind"] != "peer"]
        spec = [r for r in rs if r["kind"] == "spec"]
        base = next((r for r in rs if r["kind"] == "no-spec"), None)
        kept = [r for r in spec if None not in _identical(r) and _identical(r)[0] == _identical(r)[1]]
        out.append(Verdict(bs, max(rs, key=lambda r: r["tok_per_s"]),
                           max(spec, key=lambda r: r["tok_per_s"]) if spec else None, base,
                           max(kept, key=lambda r: r["tok_per_s"]) if kept else None))
    return out


def spec_max_rows(verdicts: Sequence[Verdict]) -> int | None:
    """The largest batch size up to which speculation wins at every measured size, when it loses at a larger one."""
    measured = sorted((v for v in verdicts if v.fastest_spec is not None and v.baseline is not None),
                      key=lambda v: v.batch_size)
    best = None
    for v in measured:  # the prefix of batch sizes where speculation wins
        if v.net_negative:
            return best  # None when it already loses at the smallest size
        best = v.batch_size
    return None  # it wins at every measured size


def schedule(verdicts: Sequence[Verdict]) -> SpecConfig | SpecSchedule | None:
    """One engine's policy from the sweep: the fastest speculative shape of each measured batch size, from the
    smallest up to the first where speculation loses, as a SpecSchedule by rows (a step over R rows takes the entry
    of the smallest measured batch size >= R; past the last, the last), entries of one shape merged into the larger
    size's; one shape alone as that SpecConfig; None when speculation loses at the smallest size."""
    entries: list[tuple[int, SpecConfig]] = []
    for v in sorted((v for v in verdicts if v.fastest_spec is not None and v.baseline is not None),
                    key=lambda v: v.batch_size):
        if v.net_negative:
            break
        s = v.fastest_spec
        shape = SpecConfig(s["steps"], s["topk"], s["draft_tokens"])
        if entries and entries[-1][1] == shape:
            entries.pop()  # the larger size's entry covers the rows below it too
        entries.append((v.batch_size, shape))
    if not entries:
        return None
    return entries[0][1] if len(entries) == 1 else SpecSchedule(tuple(entries))


def sweep_mode(sampling: dict[str, Any] | None) -> str:
    """The kind of step a sweep measured (its document's "sampling" entry): "penalized" (a count penalty),
    "sampled" (temperature > 0) or "greedy" (`SpecSchedule`'s modes)."""
    if sampling is None:
        return "greedy"
    if sampling.get("frequency_penalty") or sampling.get("presence_penalty") or \
            sampling.get("repetition_penalty", 1.0) != 1.0:
        return "penalized"
    return "sampled" if sampling.get("temperature", 0.0) > 0 else "greedy"


def tune_section(records: Sequence[dict[str, Any]], sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    vs = verdict(records)
    limit = spec_max_rows(vs)
    messages = [v.message() for v in vs]
    if limit is not None:
        messages.append(f"speculation pays up to batch size {limit} and loses above it: serve engines of more rows "
                        f"with --spec-max-rows {limit}")
    policy = schedule(vs)
    mode = sweep_mode(sampling)
    if mode == "greedy":  # sampled answers differ by their draws: only greedy ones are compared
        messages += [note for note in (v.identity_note() for v in vs) if note is not None]
    if isinstance(policy, SpecSchedule) and mode == "greedy":  # one engine for all these sizes: a shape per step
        text = spec_text(policy)
        messages.append(f"one engine for all these batch sizes: --spec {text}"
                        + (f" --spec-max-rows {limit}" if limit is not None else "")
                        + f" (Python: eaglespec.load(spec=eaglespec.config.parse_spec({text!r})))")
    if mode != "greedy" and vs:  # the shapes of such steps: a schedule's entries for them alone
        text = spec_text(policy) if policy is not None else "plain"
        messages.append(f"measured on {mode} steps: an engine gives them these shapes alone with --spec "
                        f"'GREEDY;{mode}={text}' (GREEDY: the shape or schedule of greedy steps, which a greedy "
                        "sweep finds)")
    return {
        "mode": mode,
        "fastest": {str(v.batch_size): v.fastest["config"] for v in vs},
        "fastest_speculative": {str(v.batch_size): v.fastest_spec["config"] if v.fastest_spec else None for v in vs},
        "net_negative": {str(v.batch_size): v.net_negative for v in vs},
        "fastest_identical": {str(v.batch_size): v.fastest_identical["config"] if v.fastest_identical and
                              mode == "greedy" else None for v in vs},
        "spec_max_rows": limit,
        "schedule": spec_text(policy) if policy is not None else None,
        "messages": messages,
    }
