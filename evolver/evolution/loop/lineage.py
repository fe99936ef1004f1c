"""One lineage's iteration (gate_policy audited or per-decision): K candidates from the incumbent, proposed from its
analysis results, validated and smoke-tested, judged by the gate beside it, at most one kept as the new incumbent."""

from __future__ import annotations

import string

from evolver.evolution.loop.context import RunContext, count
from evolver.evolution.loop.gating import Gating
from evolver.evolution.loop.incumbent import Incumbent
from evolver.evolution.loop.outcome import Outcome
from evolver.evolution.loop.proposing import Proposing
from evolver.evolution.loop.validation import Validation
from evolver.store.runstate import CandidateRecord, IterationRecord


class LineageSearch:
    def __init__(self, ctx: RunContext, incumbent: Incumbent, proposing: Proposing, validation: Validation, outcome: Outcome):
        self.ctx, self.incumbent, self.proposing, self.validation, self.outcome = ctx, incumbent, proposing, validation, outcome
        self.gating = Gating(ctx, incumbent)

    def baseline(self) -> None:
        self.incumbent.measure_baseline()

    def new_iteration(self, n: int) -> IterationRecord:
        self.incumbent.refresh_stale_reference()
        s = self.ctx.state
        return IterationRecord(
            iteration=n,
            parent=s.incumbent,
            parent_commit=s.incumbent_commit,
            generation=s.generation,
            candidates=candidates(n, self.ctx.cfg.candidates),
        )

    def run(self, record: IterationRecord) -> None:
        ctx = self.ctx
        ctx.step(f"iteration {record.iteration}: proposing {count(record.candidates, 'candidate')}")
        analysis = self.incumbent.analysis_result()  # once, before the proposals are drawn at once: they share it
        name = f"analysis-g{record.generation}"
        ctx.each(record, "proposing", lambda r, c: self.proposing.propose(r, c, analysis, name))
        ctx.each(record, "evaluating", self.validation.prepare)
        self.gating.gate_candidates(record)
        self.outcome.conclude(record)

    def finish(self, record: IterationRecord) -> None:
        self.outcome.finish_iteration(record)


def candidates(n: int, k: int) -> list[CandidateRecord]:
    """Iteration n's K candidates: "3" alone, or "3a", "3b", ..."""
    labels = [str(n)] if k == 1 else [f"{n}{letter}" for letter in string.ascii_lowercase[:k]]
    return [CandidateRecord(label=label) for label in labels]
