"""The loop's bookkeeping: the iteration and state files saved, usage added and reported, the current step shown,
the wall clock the run has used."""

from __future__ import annotations

import time
from typing import Optional

from evolver import events as ev
from evolver.data import RoleUsage, add_tallies
from evolver.store.runstate import IterationRecord


class Bookkeeping:
    """Loop's bookkeeping (a part of evolver.evolution.loop.Loop, which holds the run, its state and settings)."""

    def add_usage(self, record: IterationRecord, role: str, usage: RoleUsage, limits: Optional[dict] = None) -> None:
        with self.saving:
            record.usage[role] = record.usage.get(role, RoleUsage()).add(usage)
            add_tallies(record.rate_limits, limits or {})
            self.run.save_iteration(record)
        self.report_spent(record)

    def report_spent(self, record: Optional[IterationRecord]) -> None:
        """The run's usage so far, the iteration in progress included, for the views."""
        total = dict(self.state.usage)
        for role, usage in (record.usage.items() if record is not None else ()):
            total[role] = total.get(role, RoleUsage()).add(usage)
        self.events.emit(ev.Spent(total, self.cfg.budget_usd, self.cfg.budget_tokens))

    def save(self, record: IterationRecord) -> None:
        with self.saving:
            self.run.save_iteration(record)

    def step(self, text: str) -> None:
        self.state.current_step = text
        self.save_state()
        self.events.emit(ev.Phase(text))

    def elapsed(self) -> float:
        return self.state.elapsed + time.monotonic() - self.started

    def save_state(self) -> None:
        snapshot = self.state.model_copy(update={"elapsed": self.elapsed(), "updated_at": time.time()})
        self.run.save_state(snapshot)


def count(items: list, noun: str) -> str:
    """The count with its noun: "3 candidates", "1 candidate"."""
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
