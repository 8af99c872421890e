"""Speculation schedules: which `SpecConfig` shape a step takes, by the rows it runs and the kind of step it is
(greedy, sampled, under count penalties), and their text form (`--spec`).

- `SpecSchedule(entries, sampled, penalized)`: the shapes by rows for greedy steps, and those of the other kinds
  (None: as greedy steps; (): they decode plainly); `shape(rows, greedy, penalized)` / `shape_index` pick one.
- `parse_spec(text)` / `spec_text(spec)`: `S,K,D`, `R:S,K,D/R:S,K,D/...`, then `;sampled=...` / `;penalized=...`;
  `format_spec` writes a shape or schedule in any such form (bench's labels).
- `spec_envelope(shapes)`: the largest S, K and D of several shapes, by which an engine sizes its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .config import SpecConfig, parse_ints
from .errors import ConfigError

Entries = tuple[tuple[int, SpecConfig], ...]  # ((max_rows, shape), ...) by increasing max_rows


@dataclass(frozen=True)
class SpecSchedule:
    """Speculation shapes chosen per step by the rows it runs and by what its rows ask: `entries` = ((max_rows,
    SpecConfig), ...) by increasing max_rows, for greedy steps (every row greedy). A step over rows 0..R-1 (R = its
    highest running row + 1: the CUDA graph's batch bucket is sized by it, and inert rows below it cost as much as
    running ones) takes the first entry with R <= max_rows, past the last entry the last one. One engine can so
    verify a chain for a lone request and a tree once several run (the shipped SmolLM2 drafter on the H200: a chain
    of 3 at one row, the tree S4 K4 D8 at 2-8; docs/benchmarks.md).

    `sampled`: the entries of steps where any row samples, chosen the same way; None: those of greedy steps; ():
    sampled steps decode plainly. Sampling accepts fewer drafts than greedy decoding (a tree's siblings rarely
    rescue a rejected draft), so it pays for narrower shapes: the H200's sampled steps take the chain of 3 where
    greedy steps take trees (docs/benchmarks.md, "Session 24"; "Session 50": a greedy-built engine ran its sampled
    32-row steps on the greedy tree S5 K2 D8 at 0.40x plain decoding).
    `penalized`: the same for steps where any row has a count penalty (frequency, presence, repetition), which
    come before `sampled`: the drafter was trained on unpenalized text, and every verified node is adjusted, so
    speculation lost to plain decoding under penalties on the H200 (docs/benchmarks.md, "Session 50")."""

    entries: Entries
    sampled: Entries | None = None
    penalized: Entries | None = None

    def __post_init__(self) -> None:
        for name, entries in (("", self.entries), ("sampled ", self.sampled or ()),
                              ("penalized ", self.penalized or ())):
            rows = [r for r, _ in entries]
            if (name == "" and not rows) or (rows and rows[0] < 1) or any(b <= a for a, b in zip(rows, rows[1:])):
                raise ConfigError(f"a speculation schedule needs {name}row limits >= 1 in increasing order "
                                  f"(got {rows})")

    @staticmethod
    def of(spec: "SpecConfig | SpecSchedule") -> "SpecSchedule":
        return spec if isinstance(spec, SpecSchedule) else SpecSchedule(((ALL_ROWS, spec),))

    @property
    def shapes(self) -> tuple[SpecConfig, ...]:
        """The distinct shapes, greedy entries first (a step names its shape by its index here)."""
        return tuple(dict.fromkeys(s for _, s in self.entries + (self.sampled or ()) + (self.penalized or ())))

    @property
    def single(self) -> "SpecConfig | None":
        """The one shape every step takes, if there is one (else None)."""
        shapes = self.shapes
        return shapes[0] if len(shapes) == 1 and () not in (self.sampled, self.penalized) else None

    def mode_entries(self, greedy: bool = True, penalized: bool = False) -> Entries:
        """The entries of steps of this kind (() where they decode plainly)."""
        if penalized and self.penalized is not None:
            return self.penalized
        return self.entries if greedy or self.sampled is None else self.sampled

    def shape(self, rows: int, greedy: bool = True, penalized: bool = False) -> "SpecConfig | None":
        """The shape of a step over rows 0..rows-1 (greedy: every row greedy; penalized: a row has a count penalty);
        None: it decodes plainly."""
        entries = self.mode_entries(greedy, penalized)
        if not entries:
            return None
        return next((s for r, s in entries if rows <= r), entries[-1][1])

    def shape_index(self, rows: int, greedy: bool = True, penalized: bool = False) -> int | None:
        """The index in `shapes` of `shape(rows, greedy, penalized)`; None: the step decodes plainly."""
        spec = self.shape(rows, greedy, penalized)
        return None if spec is None else self.shapes.index(spec)


ALL_ROWS = 1 << 30  # a schedule entry's row limit that every engine is within (`SpecSchedule.of`'s lone shape)
_MODES = ("sampled", "penalized")  # SpecSchedule's fields past the greedy entries, in the text form's order


def parse_spec(text: str, option: str = "--spec") -> "SpecConfig | SpecSchedule":
    """The text form of a speculation shape: `S,K,D` (steps, topk, draft tokens) -> a SpecConfig; `R:S,K,D/R:S,K,D/...`
    -> a SpecSchedule (each step the shape of the first entry whose R reaches its highest running row + 1), e.g.
    `1:3,1,4/8:4,2,8/16:3,1,4/32:4,2,8`, the H200 policy of session 19; either followed by `;sampled=` and a shape
    or schedule for the steps that sample (`SpecSchedule.sampled`), and/or `;penalized=` one for steps under count
    penalties (`SpecSchedule.penalized`), each possibly `plain` (such steps decode plainly), e.g.
    `1:3,1,4/8:4,4,8;sampled=3,1,4;penalized=plain`. `spec_text` writes it back. Errors name `option`."""
    text = text.strip()
    first, *parts = text.split(";")
    if parts:
        modes: dict[str, Entries] = {}
        for part in parts:
            key, eq, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if key not in _MODES or not eq or not value or key in modes:
                raise ConfigError(f"{option} takes a greedy shape or schedule, then optionally ;sampled=... and "
                                  f";penalized=..., each a shape, a schedule or plain, e.g. "
                                  f"1:3,1,4/8:4,4,8;sampled=3,1,4;penalized=plain (got {text!r})")
            # a lone shape covers every step: its entry's rows reach every engine, as SpecSchedule.of's
            modes[key] = () if value == "plain" else SpecSchedule.of(parse_spec(value, option)).entries
        return SpecSchedule(SpecSchedule.of(parse_spec(first, option)).entries, **modes)
    if ":" in text:
        entries = []
        for part in text.split("/"):
            rows, sep, shape = part.partition(":")
            if not sep or not rows.strip().isdigit() or ":" in shape:
                raise ConfigError(f"{option} takes S,K,D or a schedule ROWS:S,K,D/ROWS:S,K,D/..., e.g. "
                                  f"1:3,1,4/8:4,2,8 (got {text!r})")
            entries.append((int(rows), parse_spec(shape, option)))
        return SpecSchedule(tuple(entries))
    vals = parse_ints(text, option)
    if len(vals) != 3:
        raise ConfigError(f"{option} takes S,K,D (steps, topk, draft tokens), e.g. 5,4,16 (got {text!r})")
    return SpecConfig(*vals)


def spec_text(spec: "SpecConfig | SpecSchedule") -> str:
    """`parse_spec`'s form: "3,1,4", a schedule's "1:3,1,4/8:4,2,8", with other modes' entries
    "...;sampled=3,1,4;penalized=plain"."""
    return format_spec(spec, lambda s: f"{s.steps},{s.topk},{s.draft_tokens}", "/", ";{}={}")


def format_spec(spec: "SpecConfig | SpecSchedule", shape: Callable[[SpecConfig], str], sep: str,
                mode: str) -> str:
    """A shape or schedule written with `shape` for each shape: a schedule's entries "ROWS:SHAPE" joined by `sep`
    (a lone entry covers every step, whatever its row limit: its shape alone), then, for each mode whose steps
    have their own (sampled, penalized), `mode` formatted with its name and its entries ("plain" where such steps
    decode plainly)."""
    if not isinstance(spec, SpecSchedule):
        return shape(spec)

    def entries_text(entries: Entries) -> str:
        if not entries:
            return "plain"
        if len(entries) == 1:
            return shape(entries[0][1])
        return sep.join(f"{rows}:{shape(s)}" for rows, s in entries)

    text = entries_text(spec.entries)
    for name in _MODES:
        entries = getattr(spec, name)
        if entries is not None:
            text += mode.format(name, entries_text(entries))
    return text


def spec_envelope(shapes: Sequence[SpecConfig]) -> SpecConfig:
    """The largest steps, topk and draft tokens of any of these shapes: what an engine speculating with all of them
    sizes its caches, drafter state and headroom by (a valid shape: D <= 1 + S*K holds for the maxima)."""
    return SpecConfig(max(s.steps for s in shapes), max(s.topk for s in shapes), max(s.draft_tokens for s in shapes))
