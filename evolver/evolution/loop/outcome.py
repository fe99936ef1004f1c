"""An iteration's outcome: its kept candidate or how far the furthest got, recorded in git and the run's state
(the incumbent, the stall count, the usage), once however often a resume repeats it."""

from __future__ import annotations

import time
from typing import Optional

from evolver import events as ev
from evolver.data import RoleUsage, add_tallies
from evolver.evolution.loop.context import RunContext
from evolver.store.runstate import BestChange, IterationRecord, slug

# How far a candidate got, best first: an iteration is as far as its furthest candidate.
PROGRESS = ("accepted", "rejected", "undecided", "invalid", "refused", "no_patch")


class Outcome:
    """An iteration's outcome, recorded."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def conclude(self, record: IterationRecord) -> None:
        """The iteration's outcome: its kept candidate, or how far the furthest one got."""
        furthest = min(record.candidates, key=lambda c: PROGRESS.index(c.status))
        record.kept = furthest.label if furthest.status == "accepted" else None
        record.status = furthest.status
        record.reason = furthest.reason if len(record.candidates) == 1 else f"{furthest.label}: {furthest.reason}"
        self.ctx.save(record)

    def finish_iteration(self, record: IterationRecord) -> None:
        """Record the outcome in git and state; idempotent, so a resume can repeat it."""
        ctx, n = self.ctx, record.iteration
        ctx.save(record)
        for cand in record.candidates:
            if cand.commit:
                parent = record.parent_label or ("base" if record.parent == 0 else record.parent)
                beside = "its parent" if record.parent_label else "incumbent"  # a pool child is judged against its parent's trials
                status = "joined the pool" if record.parent_label and cand.status == "accepted" else cand.status
                note = (
                    f"evolver {status}: {cand.reason}\n"
                    f"iteration {n}, candidate {cand.label}, parent {parent}, "
                    f"gate {_fmt(cand.gate_candidate)} vs {beside} {_fmt(record.gate_incumbent)}"
                )
                ctx.lineage.add_note(cand.commit, note)
        winner = record.winner
        if winner and ctx.state.incumbent != n and ctx.state.next_iteration == n:
            ctx.state.incumbent, ctx.state.incumbent_commit, ctx.state.best_label = n, winner.commit, winner.label
            ctx.state.generation += 1
            ctx.lineage.set_branch(ctx.lineage.best_branch, winner.commit)
            ctx.state.best_history.append(best_change(n, winner.commit, winner.reason, winner.label))
        if ctx.state.next_iteration == n:
            # One gate decision per iteration however many candidates: the gate bounds the chance
            # that any no-op among them is kept by alpha (docs/gate.md).
            ctx.state.decisions += any(c.status in ("accepted", "rejected") for c in record.candidates)
            # The stall rule (README): iterations in a row that kept nothing; an undecided one (too many
            # infrastructure errors to judge) neither counts nor breaks the streak.
            if record.status == "accepted":
                ctx.state.consecutive_rejections = 0
            elif record.status != "undecided":
                ctx.state.consecutive_rejections += 1
            ctx.state.next_iteration = n + 1
            for name, usage in record.usage.items():
                ctx.state.usage[name] = ctx.state.usage.get(name, RoleUsage()).add(usage)
            add_tallies(ctx.state.rate_limits, record.rate_limits)
        if not ctx.run.logged("decided", iteration=n):  # before the state moves on, once: a kill never loses it
            ctx.run.log("decided", iteration=n, status=record.status, kept=record.kept, reason=record.reason)
        ctx.save_state()
        ctx.lineage.remove_worktree(ctx.run.worktree(f"iter-{n:03d}-incumbent"))
        for cand in record.candidates:
            ctx.lineage.remove_worktree(ctx.run.worktree(f"iter-{slug(cand.label)}"))
            ctx.events.emit(ev.Decided(cand.label, cand.status, cand.title, cand.reason))


def best_change(iteration: int, commit: str, reason: str, label: str = "") -> BestChange:
    """A change of the run's best to ``label`` ("" the base), as state.json's best_history records it."""
    return BestChange(iteration=iteration, label=label or "base", commit=commit, reason=reason, at=time.time())


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.3f}"
