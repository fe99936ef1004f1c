"""Gating: the candidates that passed their smoke test through the gate's stages beside the incumbent,
each stage's verdict recorded before the next starts (docs/gate.md)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from evolver.evaluation.metrics import mean_reward, rewards_by_task
from evolver.evolution import gate as gatelib
from evolver.evolution.gate import search
from evolver.evolution.loop.context import RunContext, count, mostly_infra
from evolver.evolution.loop.incumbent import Incumbent
from evolver.store.runstate import IterationRecord, slug


class Gating:
    """An iteration's gate, judged beside the incumbent that ``incumbent`` measures."""

    def __init__(self, ctx: RunContext, incumbent: Incumbent):
        self.ctx, self.incumbent = ctx, incumbent

    def gate_candidates(self, record: IterationRecord) -> None:
        """The gate over the candidates that passed their smoke test, stage by stage. With several,
        a screen picks the best (it can only reject); the one left runs the gate's stages beside
        the incumbent, measured again in the same window, so no drift since the reference can
        pass for an improvement (docs/gate.md). The gate's evaluate_set drives the stages:
        run_stage measures each, save_stage records its verdict before the next starts."""
        ctx = self.ctx
        # A resumed iteration replays the gate from its first stage on the evaluations already on disk, so the
        # candidates a screen already rejected enter again: the survivor is then confirmed on fresh trials, never
        # on the screen's trials that selected it (docs/gate.md), and the run ends as an uninterrupted one.
        entered = {c.label: c for c in record.candidates if c.status == "evaluating" or c.verdicts}
        if not any(c.status == "evaluating" for c in entered.values()):
            return
        # What is known of the incumbent before this iteration: per-decision, its reference (it sizes the gate and sharpens
        # early stops); audited, its whole history (it screens the candidates too).
        reference = self.incumbent.reference_table() if ctx.policy.fresh_reference else self.incumbent.history()
        n, seed = record.iteration, ctx.seed(record.generation)
        arm = ctx.checkout(f"iter-{n:03d}-incumbent", record.parent_commit)
        for cand in entered.values():
            cand.verdicts = []
        record.gate_stages = []

        def run_stage(stage: gatelib.Stage) -> Optional[tuple[dict, dict]]:
            """The stage's evaluations, at once; None, the candidates undecided, when most of one's simulations failed."""
            inc_trials, cand_trials = stage.incumbent_trials, stage.candidate_trials
            ctx.step(
                f"iteration {n}: gate stage {stage.index + 1}/{stage.count} ({count(stage.alive, 'candidate')}, {cand_trials} trial(s) per task"
                + (f", the incumbent beside them at {inc_trials})" if inc_trials else ")")
            )
            jobs = [(f"iter-{n:03d}-incumbent", arm, inc_trials)] if inc_trials else []
            jobs += [(f"iter-{slug(label)}-gate", ctx.run.worktree(f"iter-{slug(label)}"), cand_trials) for label in stage.alive]
            results = ctx.concurrently(lambda job: ctx.measure(job[0], job[1], ctx.manifest.gate_tasks, job[2], seed, record=record), jobs)
            incumbent: dict = {}
            if inc_trials:
                inc_result = results.pop(0)
                incumbent = rewards_by_task(inc_result.simulations)
                record.gate_incumbent = mean_reward(incumbent)
                if mostly_infra(inc_result):
                    undecided(
                        ctx,
                        record,
                        stage.alive,
                        f"{inc_result.summary.infra_errors} of {inc_result.summary.num_simulations} "
                        "simulations of the incumbent beside the candidates hit infrastructure errors",
                    )
                    return None
            tables = {}
            for label, result in zip(stage.alive, results):
                tables[label] = rewards_by_task(result.simulations)
                entered[label].gate_candidate = mean_reward(tables[label])
                if mostly_infra(result):
                    undecided(
                        ctx,
                        record,
                        stage.alive,
                        f"{result.summary.infra_errors} of {result.summary.num_simulations} gate simulations "
                        f"of {label} hit infrastructure errors",
                    )
                    return None
            return incumbent, tables

        def save_stage(stage: gatelib.Stage, verdict: gatelib.SetVerdict) -> None:
            record.gate_stages.append(dataclasses.asdict(verdict))
            for label in stage.alive:
                mine = verdict.verdicts[label]
                entered[label].verdicts.append(dataclasses.asdict(mine))
                entered[label].reason = mine.reason
                entered[label].status = {"accept": "accepted", "reject": "rejected"}.get(mine.decision, "evaluating")
            ctx.save(record)

        search.judge_iteration(ctx.policy, list(entered), run_stage, reference=reference, on_stage=save_stage)


def undecided(ctx: RunContext, record: IterationRecord, labels: tuple[str, ...], why: str) -> None:
    """Too many infrastructure errors to judge: the candidates still in the gate are undecided."""
    for label in labels:
        cand = record.candidate(label)
        cand.status, cand.reason = "undecided", why
    ctx.save(record)
