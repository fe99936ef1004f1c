"""Gating: the candidates that passed their smoke test through the gate's stages beside the incumbent,
each stage's verdict recorded before the next starts (docs/gate.md)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from evolver.evaluation.metrics import mean_reward, rewards_by_task
from evolver.evolution import gate as gatelib
from evolver.evolution.gate import search
from evolver.evolution.loop.bookkeeping import count
from evolver.evolution.loop.measuring import mostly_infra
from evolver.store.runstate import FINAL_STATUSES, IterationRecord, slug


class Gating:
    """Loop's gate (a part of evolver.evolution.loop.Loop, which holds the run, its state and settings)."""

    def gate_candidates(self, record: IterationRecord) -> None:
        """The gate over the candidates that passed their smoke test, stage by stage. With several,
        a screen picks the best (it can only reject); the one left runs the gate's stages beside
        the incumbent, measured again in the same window, so no drift since the reference can
        pass for an improvement (docs/gate.md). The gate's evaluate_set drives the stages:
        run_stage measures each, save_stage records its verdict before the next starts."""
        # A resumed iteration replays the gate from its first stage on the evaluations already on disk, so the
        # candidates a screen already rejected enter again: the survivor is then confirmed on fresh trials, never
        # on the screen's trials that selected it (docs/gate.md), and the run ends as an uninterrupted one.
        entered = {c.label: c for c in record.candidates if c.status == "evaluating" or c.verdicts}
        if not any(c.status == "evaluating" for c in entered.values()):
            return
        # What is known of the incumbent before this iteration: per-decision, its reference (it sizes the gate and sharpens
        # early stops); audited, its whole history (it screens the candidates too).
        reference = self.reference_table() if self.policy.fresh_reference else self.incumbent_history()
        n, seed = record.iteration, self.seed(record.generation)
        arm = self.checkout(f"iter-{n:03d}-incumbent", record.parent_commit)
        for cand in entered.values():
            cand.verdicts = []
        record.gate_stages = []

        def run_stage(stage: gatelib.Stage) -> Optional[tuple[dict, dict]]:
            """The stage's evaluations, at once; None, the candidates undecided, when most of one's simulations failed."""
            inc_trials, cand_trials = stage.incumbent_trials, stage.candidate_trials
            self.step(f"iteration {n}: gate stage {stage.index + 1}/{stage.count} ({count(stage.alive, 'candidate')}, {cand_trials} trial(s) per task"
                      + (f", the incumbent beside them at {inc_trials})" if inc_trials else ")"))
            jobs = [(f"iter-{n:03d}-incumbent", arm, inc_trials)] if inc_trials else []
            jobs += [(f"iter-{slug(label)}-gate", self.run.worktree(f"iter-{slug(label)}"), cand_trials) for label in stage.alive]
            results = self.concurrently(lambda job: self.measure(job[0], job[1], self.manifest.gate_tasks, job[2], seed, record=record), jobs)
            incumbent: dict = {}
            if inc_trials:
                inc_result = results.pop(0)
                incumbent = rewards_by_task(inc_result.simulations)
                record.gate_incumbent = mean_reward(incumbent)
                if mostly_infra(inc_result):
                    self.undecided(record, stage.alive, f"{inc_result.summary.infra_errors} of {inc_result.summary.num_simulations} "
                                                        "simulations of the incumbent beside the candidates hit infrastructure errors")
                    return None
            tables = {}
            for label, result in zip(stage.alive, results):
                tables[label] = rewards_by_task(result.simulations)
                entered[label].gate_candidate = mean_reward(tables[label])
                if mostly_infra(result):
                    self.undecided(record, stage.alive, f"{result.summary.infra_errors} of {result.summary.num_simulations} gate simulations "
                                                        f"of {label} hit infrastructure errors")
                    return None
            return incumbent, tables

        def save_stage(stage: gatelib.Stage, verdict: gatelib.SetVerdict) -> None:
            record.gate_stages.append(dataclasses.asdict(verdict))
            for label in stage.alive:
                mine = verdict.verdicts[label]
                entered[label].verdicts.append(dataclasses.asdict(mine))
                entered[label].reason = mine.reason
                entered[label].status = {"accept": "accepted", "reject": "rejected"}.get(mine.decision, "evaluating")
            self.save(record)

        search.judge_iteration(self.policy, list(entered), run_stage, reference=reference, on_stage=save_stage)

    def undecided(self, record: IterationRecord, labels: tuple[str, ...], why: str) -> None:
        """Too many infrastructure errors to judge: the candidates still in the gate are undecided."""
        for label in labels:
            cand = record.candidate(label)
            cand.status, cand.reason = "undecided", why
        self.save(record)

    def incumbent_history(self) -> dict:
        """Every gate trial of the incumbent so far, the audited policy's reference: the base's reference, or the kept
        candidate's trials beside its parent (its screen trial, the first, left out); then its trials beside later candidates."""
        s, kept = self.state, self.run.iteration(self.state.incumbent) if self.state.incumbent else None
        first = self.latest_rewards(f"iter-{slug(kept.kept)}-gate" if kept else "reference-g0") or {}
        tables = [{task: rewards[1:] for task, rewards in first.items()} if kept else first]
        tables += [self.latest_rewards(f"iter-{r.iteration:03d}-incumbent") or {} for r in self.run.iterations()
                   if r.parent_commit == s.incumbent_commit and r.status in FINAL_STATUSES]
        return {task: [x for table in tables for x in table.get(task, [])] for task in self.manifest.gate_tasks}
