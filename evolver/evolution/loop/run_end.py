"""The run's end, once it stopped: the audited policy's audit of its best against its base (which may roll
it back), then the base and the best on the sealed holdout."""

from __future__ import annotations

import dataclasses
from typing import Optional

from evolver import events as ev
from evolver.evaluation.metrics import rewards_by_task
from evolver.evolution.gate import search
from evolver.evolution.loop.measuring import mostly_infra
from evolver.evolution.loop.outcome import best_change


class RunEnd:
    """Loop's end: audit and holdout (a part of evolver.evolution.loop.Loop, which holds the run, its state and settings)."""

    def audit(self) -> None:
        """The audited policy's last word on the run (gate.search): its best against its base, side by side on
        fresh trials, look by look; unless the best is shown better the run is rolled back to its base, so it
        ends worse than it began at most alpha of the time. A resumed run replays the looks from disk."""
        best = self.state.incumbent_commit
        if self.policy.audit is None or self.state.incumbent == 0 or any(a["best_commit"] == best for a in self.state.audits):
            return
        self.step(f"audit: iteration {self.state.incumbent}'s best against the base")
        arms = [(f"audit-{self.state.incumbent:03d}-{side}", self.checkout(f"audit-{side}", commit))
                for side, commit in (("base", self.manifest.base_commit), ("best", best))]

        def run(look: search.AuditLook) -> Optional[tuple[dict, dict]]:
            results = self.concurrently(lambda arm: self.measure(arm[0], arm[1], self.manifest.gate_tasks, look.trials,
                                                                 self.seed(self.state.generation) + 11), arms)
            return None if any(map(mostly_infra, results)) else (rewards_by_task(results[0].simulations), rewards_by_task(results[1].simulations))

        looks = search.evaluate_audit(self.policy, run)
        holds = search.audit_holds(looks)
        decided = looks and looks[-1].decision != "continue"
        reason = looks[-1].reason if decided else "Undecided: most of the audit's simulations hit infrastructure errors, and nothing unshown is kept."
        self.state.audits.append({"best": self.state.incumbent, "best_commit": best, "holds": holds, "reason": reason,
                                  "looks": [dataclasses.asdict(c) for c in looks]})
        if not holds:
            base = self.manifest.base_commit
            self.state.best_history.append(best_change(0, base, f"audit: iteration {self.state.incumbent} not shown better than the base: {reason}"))
            self.state.incumbent, self.state.incumbent_commit = 0, base
            self.state.generation += 1
            self.lineage.set_branch(self.lineage.best_branch, base)
        self.run.log("audited", best=self.state.audits[-1]["best"], holds=holds, reason=reason)
        self.save_state()
        for _, worktree in arms:
            self.lineage.remove_worktree(worktree)
        self.events.emit(ev.Phase(f"audit: {'the best stands' if holds else 'rolled back to the base'}: {reason}"))

    def holdout(self) -> None:
        """Evaluate the base and the kept lineage on the sealed holdout (never used for a decision)."""
        if not self.manifest.holdout_tasks:
            return
        self.step("holdout")
        results = {}
        for label, commit in (("base", self.manifest.base_commit), ("best", self.state.incumbent_commit)):
            wt = self.checkout(f"holdout-{label}", commit)
            # Named by commit: a run extended later measures its new best, not the old one's file.
            res = self.measure(f"holdout-{commit[:12]}", wt, self.manifest.holdout_tasks, self.cfg.holdout_trials, self.seed(0) + 7)
            results[label] = res.summary.avg_reward
            self.lineage.remove_worktree(wt)
        self.run.save_holdout(results)
        self.events.emit(ev.Holdout(results["base"], results["best"]))
