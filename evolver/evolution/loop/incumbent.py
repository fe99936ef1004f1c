"""What the run measures of its incumbent: the baseline at the start (with the estimate of the rest that
it prices), the analysis results each iteration's proposals read, and the gate reference, measured again when stale."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from evolver import events as ev
from evolver import memo
from evolver.data import EvalResult, RoleUsage
from evolver.evaluation.metrics import mean_reward, rewards_by_task
from evolver.evolution import gate as gatelib
from evolver.evolution.gate import search
from evolver.evolution.loop.stops import StopRun
from evolver.evolution.plan import forecast, meta_prompt_tokens
from evolver.llm import price_of


class Incumbent:
    """Loop's measurements of the incumbent (a part of evolver.evolution.loop.Loop, which holds the run, its state and settings)."""

    def measure_baseline(self) -> None:
        self.step("measuring the baseline")
        analysis = self.analysis_result()
        reference = self.reference_table()
        self.events.emit(ev.Baseline(analysis.summary.avg_reward, mean_reward(reference)))
        if mean_reward(reference) == 1.0:
            raise StopRun("the incumbent already passes every gate task in every trial, so no candidate can be shown better; "
                          "evolve on a harder domain or split, or with a weaker agent model")
        gate = search.iteration_gate(self.policy, reference)
        floor = memo.remembered("noise-floor", {"reference": reference, "gate": dataclasses.asdict(gate)},
                                Path(gatelib.__file__).parent.glob("*.py"), lambda: gatelib.noise_floor(reference, gate))
        self.events.emit(ev.NoiseFloor(len(self.manifest.gate_tasks), gate.stages[-1], None if math.isinf(floor) else floor * 100,
                                       gate.min_effect * 100))
        self.estimate(analysis, reference)

    def estimate(self, analysis: EvalResult, reference: dict) -> None:
        """What the rest of the run is expected to take and can take at most, priced by the baseline's own simulations."""
        sims = analysis.summary.num_simulations + len(self.manifest.gate_tasks) * self.policy.reference_trials
        per_sim = {role: RoleUsage(prompt_tokens=round(u.prompt_tokens / max(1, sims)), completion_tokens=round(u.completion_tokens / max(1, sims)),
                                   cost=u.cost / max(1, sims)) for role, u in self.state.usage.items() if role != "meta"}
        rest = forecast(self.cfg, len(self.manifest.analysis_tasks), len(self.manifest.gate_tasks), len(self.manifest.holdout_tasks),
                        iterations=self.state.iterations_target - self.state.next_iteration + 1, per_simulation=per_sim,
                        meta_price=price_of(self.cfg.role("meta").model), meta_prompt_tokens=self.meta_prompt_tokens(), baseline=False,
                        noise=reference)
        seconds = analysis.summary.duration / max(1, analysis.summary.num_simulations)
        self.events.emit(ev.Estimate(rest, seconds, self.cfg.concurrency, self.cfg.budget_usd, self.cfg.budget_tokens))

    def meta_prompt_tokens(self) -> int:
        """About what a one-shot prompt holds: the system prompt and guide, agent/'s files, the digest."""
        return meta_prompt_tokens(self.guide, Path(self.run.repo), self.cfg.digest_chars)

    def refresh_stale_reference(self) -> None:
        """A reference older than reference_max_hours is measured again, with fresh seeds,
        before the next candidate is compared with it (never in the middle of a comparison)."""
        if self.run.iteration(self.state.next_iteration) is not None or not self.cfg.reference_max_hours:
            return
        measured = self.run.evaluation(f"reference-g{self.state.generation}").measured_at()
        if measured is not None and time.time() - measured > self.cfg.reference_max_hours * 3600:
            self.state.generation += 1
            self.run.log("reference_stale", generation=self.state.generation)
            self.save_state()

    def analysis_result(self) -> EvalResult:
        """The incumbent's results on the analysis set (the only results the digest sees)."""
        g = self.state.generation
        wt = self.checkout(f"incumbent-g{g}", self.state.incumbent_commit)
        result = self.measure(f"analysis-g{g}", wt, self.manifest.analysis_tasks, self.cfg.analysis_trials, self.seed(g))
        self.lineage.remove_worktree(wt)
        kept = self.run.iteration(self.state.incumbent) if self.state.incumbent else None
        if kept and kept.analysis is None:  # the history shows a kept candidate's analysis score
            kept.analysis = result.summary.avg_reward
            self.run.save_iteration(kept)
        return result

    def reference_table(self) -> dict:
        """The incumbent's gate results, reused while it is unchanged. Per-decision: measured afresh, with new
        seeds, for each new incumbent, so the trials that selected it never set its bar; audited: the base's,
        measured once (the start of the incumbents' history)."""
        g, commit = (self.state.generation, self.state.incumbent_commit) if self.policy.fresh_reference else (0, self.manifest.base_commit)
        wt = self.checkout(f"incumbent-g{g}", commit)
        result = self.measure(f"reference-g{g}", wt, self.manifest.gate_tasks, self.policy.reference_trials, self.seed(g))
        self.lineage.remove_worktree(wt)
        return rewards_by_task(result.simulations)
