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
from evolver.evolution.loop.context import RunContext
from evolver.evolution.loop.stops import StopRun
from evolver.evolution.plan import forecast, meta_prompt_tokens
from evolver.llm import price_of
from evolver.store.runstate import FINAL_STATUSES, slug


class Incumbent:
    """The run's measurements of its incumbent."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def measure_baseline(self, base: bool = False) -> None:
        """The incumbent's analysis and reference (``base``: the base's, whatever the run's best is now), the noise floor
        and the estimate of the rest; measured once, read from disk on every resume."""
        ctx = self.ctx
        ctx.step("measuring the baseline")
        analysis = self.analysis_result(base)
        reference = self.reference_table()
        ctx.events.emit(ev.Baseline(analysis.summary.avg_reward, mean_reward(reference)))
        if mean_reward(reference) == 1.0:
            raise StopRun(
                "the incumbent already passes every gate task in every trial, so no candidate can be shown better; "
                "evolve on a harder domain or split, or with a weaker agent model"
            )
        gate = search.iteration_gate(ctx.policy, reference)
        floor = memo.remembered(
            "noise-floor",
            {"reference": reference, "gate": dataclasses.asdict(gate)},
            Path(gatelib.__file__).parent.glob("*.py"),
            lambda: gatelib.noise_floor(reference, gate),
        )
        ctx.events.emit(
            ev.NoiseFloor(len(ctx.manifest.gate_tasks), gate.stages[-1], None if math.isinf(floor) else floor * 100, gate.min_effect * 100)
        )
        self.estimate(analysis, reference)

    def estimate(self, analysis: EvalResult, reference: dict) -> None:
        """What the rest of the run is expected to take and can take at most, priced by the baseline's own simulations."""
        ctx, manifest = self.ctx, self.ctx.manifest
        sims = analysis.summary.num_simulations + len(manifest.gate_tasks) * ctx.policy.reference_trials
        per_sim = {
            role: RoleUsage(
                prompt_tokens=round(u.prompt_tokens / max(1, sims)),
                completion_tokens=round(u.completion_tokens / max(1, sims)),
                cost=u.cost / max(1, sims),
            )
            for role, u in ctx.state.usage.items()
            if role != "meta"
        }
        rest = forecast(
            ctx.cfg,
            len(manifest.analysis_tasks),
            len(manifest.gate_tasks),
            len(manifest.holdout_tasks),
            iterations=ctx.state.iterations_target - ctx.state.next_iteration + 1,
            per_simulation=per_sim,
            meta_price=price_of(ctx.cfg.role("meta").model),
            meta_prompt_tokens=self.meta_prompt_tokens(),
            baseline=False,
            noise=reference,
        )
        seconds = analysis.summary.duration / max(1, analysis.summary.num_simulations)
        ctx.events.emit(ev.Estimate(rest, seconds, ctx.cfg.concurrency, ctx.cfg.budget_usd, ctx.cfg.budget_tokens))

    def meta_prompt_tokens(self) -> int:
        """About what a one-shot prompt holds: the system prompt and guide, agent/'s files, the digest."""
        return meta_prompt_tokens(self.ctx.guide, Path(self.ctx.run.repo), self.ctx.cfg.digest_chars)

    def refresh_stale_reference(self) -> None:
        """A reference older than reference_max_hours is measured again, with fresh seeds,
        before the next candidate is compared with it (never in the middle of a comparison)."""
        ctx = self.ctx
        if ctx.run.iteration(ctx.state.next_iteration) is not None or not ctx.cfg.reference_max_hours:
            return
        measured = ctx.run.evaluation(f"reference-g{ctx.state.generation}").measured_at()
        if measured is not None and time.time() - measured > ctx.cfg.reference_max_hours * 3600:
            ctx.state.generation += 1
            ctx.run.log("reference_stale", generation=ctx.state.generation)
            ctx.save_state()

    def analysis_result(self, base: bool = False) -> EvalResult:
        """The incumbent's results on the analysis set (the only results the digest sees); ``base``: the base's."""
        ctx = self.ctx
        g, commit = (0, ctx.manifest.base_commit) if base else (ctx.state.generation, ctx.state.incumbent_commit)
        wt = ctx.checkout(f"incumbent-g{g}", commit)
        result = ctx.measure(f"analysis-g{g}", wt, ctx.manifest.analysis_tasks, ctx.cfg.analysis_trials, ctx.seed(g))
        ctx.lineage.remove_worktree(wt)
        kept = ctx.run.iteration(ctx.state.incumbent) if ctx.state.incumbent and not base else None
        if kept and kept.analysis is None:  # the history shows a kept candidate's analysis score
            kept.analysis = result.summary.avg_reward
            ctx.run.save_iteration(kept)
        return result

    def reference_table(self) -> dict:
        """The incumbent's gate results, reused while it is unchanged. Per-decision: measured afresh, with new
        seeds, for each new incumbent, so the trials that selected it never set its bar; otherwise the base's,
        measured once (the start of the incumbents' history)."""
        ctx = self.ctx
        g, commit = (ctx.state.generation, ctx.state.incumbent_commit) if ctx.policy.fresh_reference else (0, ctx.manifest.base_commit)
        wt = ctx.checkout(f"incumbent-g{g}", commit)
        result = ctx.measure(f"reference-g{g}", wt, ctx.manifest.gate_tasks, ctx.policy.reference_trials, ctx.seed(g))
        ctx.lineage.remove_worktree(wt)
        return rewards_by_task(result.simulations)

    def history(self) -> dict:
        """Every gate trial of the incumbent so far, the audited policy's reference: the base's reference, or the kept
        candidate's trials beside its parent (its screen trial, the first, left out); then its trials beside later candidates."""
        ctx = self.ctx
        s, kept = ctx.state, ctx.run.iteration(ctx.state.incumbent) if ctx.state.incumbent else None
        first = ctx.latest_rewards(f"iter-{slug(kept.kept)}-gate" if kept else "reference-g0") or {}
        tables = [{task: rewards[1:] for task, rewards in first.items()} if kept else first]
        tables += [
            ctx.latest_rewards(f"iter-{r.iteration:03d}-incumbent") or {}
            for r in ctx.run.iterations()
            if r.parent_commit == s.incumbent_commit and r.status in FINAL_STATUSES
        ]
        return {task: [x for table in tables for x in table.get(task, [])] for task in ctx.manifest.gate_tasks}
