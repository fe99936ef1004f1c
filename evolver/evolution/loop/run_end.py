"""The run's end, once it stopped: the audited policy's audit of its best against its base (which may roll
it back), then the base and the best on the sealed holdout."""

from __future__ import annotations

import dataclasses
from typing import Optional

from evolver import events as ev
from evolver.evaluation.metrics import rewards_by_task
from evolver.evolution.gate import search
from evolver.evolution.loop.context import RunContext, mostly_infra
from evolver.evolution.loop.outcome import best_change
from evolver.store.runstate import Audit, named, slug


class RunEnd:
    """The run's end: the audit, then the holdout."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def audit(self) -> None:
        """The audited policy's last word on the run (gate.search): its best against its base, side by side on
        fresh trials, look by look; unless the best is shown better the run is rolled back to its base, so it
        ends worse than it began at most alpha of the time. A resumed run replays the looks from disk."""
        ctx = self.ctx
        best = ctx.state.incumbent_commit
        if ctx.policy.audit is None or ctx.state.incumbent == 0 or any(a.best_commit == best for a in ctx.state.audits):
            return
        label = ctx.run.best_label(ctx.state) or str(ctx.state.incumbent)
        ctx.step(f"audit: {named(label)}, the run's best, against the base")
        arms = [
            (f"audit-{slug(label)}-{side}", ctx.checkout(f"audit-{side}", commit))
            for side, commit in (("base", ctx.manifest.base_commit), ("best", best))
        ]

        def run(look: search.AuditLook) -> Optional[tuple[dict, dict]]:
            results = ctx.concurrently(
                lambda arm: ctx.measure(arm[0], arm[1], ctx.manifest.gate_tasks, look.trials, ctx.seed(ctx.state.generation) + 11), arms
            )
            return (
                None
                if any(map(mostly_infra, results))
                else (rewards_by_task(results[0].simulations), rewards_by_task(results[1].simulations))
            )

        looks = search.evaluate_audit(ctx.policy, run)
        holds = search.audit_holds(looks)
        decided = looks and looks[-1].decision != "continue"
        reason = (
            looks[-1].reason
            if decided
            else "Undecided: most of the audit's simulations hit infrastructure errors, and nothing unshown is kept."
        )
        ctx.state.audits.append(
            Audit(
                best=ctx.state.incumbent,
                label=label,
                best_commit=best,
                holds=holds,
                reason=reason,
                looks=[dataclasses.asdict(c) for c in looks],
            )
        )
        if not holds:
            base = ctx.manifest.base_commit
            ctx.state.best_history.append(best_change(0, base, f"audit: {named(label)} not shown better than the base: {reason}"))
            ctx.state.incumbent, ctx.state.incumbent_commit, ctx.state.best_label = 0, base, ""
            ctx.state.generation += 1
            ctx.lineage.set_branch(ctx.lineage.best_branch, base)
        ctx.run.log("audited", best=ctx.state.audits[-1].best, holds=holds, reason=reason)
        ctx.save_state()
        for _, worktree in arms:
            ctx.lineage.remove_worktree(worktree)
        ctx.events.emit(ev.Phase(f"audit: {'the best stands' if holds else 'rolled back to the base'}: {reason}"))

    def holdout(self) -> None:
        """Evaluate the base and the kept lineage on the sealed holdout (never used for a decision)."""
        ctx = self.ctx
        if not ctx.manifest.holdout_tasks:
            return
        ctx.step("holdout")
        results = {}
        for label, commit in (("base", ctx.manifest.base_commit), ("best", ctx.state.incumbent_commit)):
            wt = ctx.checkout(f"holdout-{label}", commit)
            # Named by commit: a run extended later measures its new best, not the old one's file.
            res = ctx.measure(f"holdout-{commit[:12]}", wt, ctx.manifest.holdout_tasks, ctx.cfg.holdout_trials, ctx.seed(0) + 7)
            results[label] = res.summary.avg_reward
            ctx.lineage.remove_worktree(wt)
        ctx.run.save_holdout(results)
        ctx.events.emit(ev.Holdout(results["base"], results["best"]))
