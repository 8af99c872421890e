"""Prefix reuse in `Engine` (engine.py), in a file of its own: a mixin of the engine's methods over its scheduler and
runner (the policy, which row a prompt takes and how much of it is reused, is scheduler.py's).

- `_release_finished()`: finished requests leave their rows; where the engine reuses prefixes (`reuses`), a text
  request's row keeps the tokens its cache entries hold (`Scheduler.keep`);
- `_kept_across(grow)`: runs `grow()` (which reallocates the caches and makes a new scheduler) and copies the kept
  rows' entries into the new caches, kept again there (a conversation through `Engine.generate` grows them each
  turn);
- `forget_prefixes()`: nothing kept is reused from now on (a benchmark's runs each start cold; `reseed`).
"""

from __future__ import annotations

from typing import Callable

from ..assets import reuses_prefixes


class PrefixReuse:
    @property
    def reuses(self) -> bool:
        """Whether finished rows keep their entries: on the eager path (`ModelRunner.keeps_free_rows`), where
        `EngineConfig.reuse_prefixes` (None: `assets.reuses_prefixes`, the CPU) says."""
        reuse = self.config.reuse_prefixes
        return (reuses_prefixes(self.device.type) if reuse is None else reuse) and self.runner.keeps_free_rows

    def _release_finished(self) -> None:
        """Finished requests leave their rows; a text request's row keeps the tokens its cache entries hold, for a
        later prompt that starts with them (scheduler.py): the prompt and output up to its host length (the entries
        computed; the last token has none yet)."""
        assert self.scheduler is not None
        keeps = self.reuses
        for q in self.scheduler.release_finished():
            if keeps and q.mm_inputs is None:
                self.scheduler.keep(q.slot, (q.prompt_ids + q.output_ids)[: self.runner.host_len[q.slot]])
            self.runner.release(q.slot)

    def _kept_across(self, grow: Callable[[], None]) -> None:
        """`grow()`, keeping the kept rows: their target and drafter entries copied into the new caches."""
        r = self.runner
        kept = self.scheduler.kept if self.scheduler is not None else {}
        old = [c.tensors for c in (r.kv, r.dkv) if c is not None] if kept else []
        grow()
        new = [c.tensors for c in (r.kv, r.dkv) if c is not None]
        for row, tokens in kept.items():
            n = len(tokens)
            for before, after in zip(old, new):
                for a, b in zip(before, after):
                    b[:, row, :n].copy_(a[:, row, :n])
            self.scheduler.keep(row, tokens)

    def forget_prefixes(self) -> None:
        """Prompts from now on prefill whole: no free row's entries are reused (a benchmark's runs each start cold)."""
        if self.scheduler is not None:
            self.scheduler.forget()
