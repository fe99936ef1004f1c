"""The population search's iteration (gate_policy "population", docs/search.md; its decisions are gate.population's).

    draw a parent from the pool's Pareto front -> the parent on a minibatch of analysis tasks (again, while it passes
    every one) -> K children proposed from what it did there -> each committed, refused when inert -> its screen:
    the minibatch again, its proposer's tries of the very agent it submitted reused -> strictly better than its
    parent: the first part of the gate tasks -> not clearly below its parent there: the rest -> it joins the pool
    -> the pool's best mean gate score is the run's best, which the audit judges at the end

The pool is the base (its reference-g0, one trial per gate task) and every child that joined (state.pool); a
member's gate trials are its evaluations iter-NNN-gate and iter-NNN-gate2. Everything is on disk before the next
step, so a killed run resumes where it stopped, drawing the same parent and minibatches from its seed.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from evolver.data import EvalResult
from evolver.evaluation.metrics import mean_reward, rewards_by_task
from evolver.evolution.gate import population as pool_rules
from evolver.evolution.loop.context import RunContext, count, member_trials, mostly_infra
from evolver.evolution.loop.incumbent import Incumbent
from evolver.evolution.loop.lineage import candidates
from evolver.evolution.loop.outcome import PROGRESS, Outcome, best_change
from evolver.evolution.loop.proposing import Proposing
from evolver.evolution.loop.validation import Validation, broken, smoke_timeout
from evolver.evolution.noop import agent_digest, agent_files
from evolver.store.runstate import CandidateRecord, IterationRecord, PoolMember, slug

BASE = "base"


class PopulationSearch:
    def __init__(self, ctx: RunContext, incumbent: Incumbent, proposing: Proposing, validation: Validation, outcome: Outcome):
        self.ctx, self.incumbent, self.proposing, self.validation, self.outcome = ctx, incumbent, proposing, validation, outcome
        self.config = ctx.policy.population

    def baseline(self) -> None:
        """The base's analysis and its gate trials (the pool's first member), whatever the run's best is now."""
        self.incumbent.measure_baseline(base=True)

    # -- the pool --------------------------------------------------------------------------------
    def members(self) -> list[PoolMember]:
        """The base, then every child that joined, in the order they joined."""
        base = PoolMember(label=BASE, commit=self.ctx.manifest.base_commit, parent="", iteration=0)
        return [base, *self.ctx.state.pool]

    def table(self, label: str) -> dict:
        """A member's gate trials (or a child's so far): the base's reference, or a child's two parts."""
        return member_trials(self.ctx.latest_rewards, label)

    def tables(self) -> dict[str, dict]:
        return {m.label: self.table(m.label) for m in self.members()}

    # -- an iteration ----------------------------------------------------------------------------
    def new_iteration(self, n: int) -> IterationRecord:
        label = pool_rules.draw_parent(self.tables(), self.ctx.cfg.seed * 7919 + n)
        parent = next(m for m in self.members() if m.label == label)
        # Each iteration its own seeds (generation n): its parent's minibatch and its children's tries and screens share them.
        return IterationRecord(
            iteration=n,
            parent=parent.iteration,
            parent_commit=parent.commit,
            parent_label=label,
            generation=n,
            candidates=candidates(n, self.ctx.cfg.candidates),
        )

    def run(self, record: IterationRecord) -> None:
        ctx, n = self.ctx, record.iteration
        ctx.step(f"iteration {n}: {record.parent_label} on a minibatch of analysis tasks")
        found = self.evidence(record)
        if found is not None:
            analysis, name = found
            ctx.step(f"iteration {n}: proposing {count(record.candidates, 'candidate')} from {record.parent_label}")
            ctx.each(record, "proposing", lambda r, c: self.proposing.propose(r, c, analysis, name))
            ctx.each(record, "evaluating", lambda r, c: self.validation.prepare(r, c, smoke=False))
            ctx.step(f"iteration {n}: screening {count([c for c in record.candidates if c.status == 'evaluating'], 'candidate')}")
            ctx.each(record, "evaluating", self.screen_and_gate)
        self.conclude(record)

    def evidence(self, record: IterationRecord) -> Optional[tuple[EvalResult, str]]:
        """The parent on a minibatch of analysis tasks, one trial each: what its children's proposers read and what
        their screens are judged against. A minibatch the parent passes whole holds nothing to learn or win back: the
        next is drawn, up to config.draws; None (the iteration's candidates are not proposed) when every one was."""
        ctx, cfg, n = self.ctx, self.config, record.iteration
        worktree = ctx.checkout(f"parent-{n:03d}", record.parent_commit)
        try:
            for draw in range(cfg.draws):
                tasks = list(pool_rules.minibatch(ctx.manifest.analysis_tasks, ctx.cfg.seed, (n - 1) * cfg.draws + draw, cfg.minibatch))
                name = f"analysis-{n:03d}-d{draw}"
                result = ctx.measure(name, worktree, tasks, 1, ctx.seed(record.generation), record=record)
                if mostly_infra(result):
                    why = f"{result.summary.infra_errors} of {result.summary.num_simulations} simulations of the parent's minibatch hit infrastructure errors"
                    self.skip(record, "undecided", why)
                    return None
                if not pool_rules.passes_everything(rewards_by_task(result.simulations)):
                    record.minibatch, record.evidence = tasks, name
                    ctx.save(record)
                    return result, name
        finally:
            ctx.lineage.remove_worktree(worktree)
        self.skip(
            record, "no_patch", f"not proposed: {record.parent_label} passed every task of {cfg.draws} minibatch(es) of analysis tasks"
        )
        return None

    def skip(self, record: IterationRecord, status: str, why: str) -> None:
        for cand in record.candidates:
            if cand.status == "proposing":
                cand.status, cand.reason = status, why
        self.ctx.save(record)

    def screen_and_gate(self, record: IterationRecord, cand: CandidateRecord) -> None:
        """The child's screen beside its parent on the minibatch; if it passes, the gate tasks in two parts."""
        ctx, cfg = self.ctx, self.config
        name, seed = f"iter-{slug(cand.label)}", ctx.seed(record.generation)
        worktree = ctx.run.worktree(name)
        parent_mini = {t: r for t, r in (ctx.latest_rewards(record.evidence) or {}).items() if t in record.minibatch}
        reused, tried = self.reused_tries(cand, worktree, record.minibatch)
        rest = [t for t in record.minibatch if t not in reused]
        fresh = ctx.measure(f"{name}-screen", worktree, rest, 1, seed, timeout=smoke_timeout(ctx), record=record) if rest else None
        why = next(filter(None, (broken(r) for r in [*tried, *([fresh] if fresh else [])])), None)
        if why:  # the screen is the child's first run: it is its smoke test too
            return self.decide(record, cand, "invalid", f"smoke test failed: {why}")
        if fresh is not None and mostly_infra(fresh):
            return self.decide(
                record,
                cand,
                "undecided",
                f"{fresh.summary.infra_errors} of {fresh.summary.num_simulations} screen simulations hit infrastructure errors",
            )
        mine = {**reused, **(rewards_by_task(fresh.simulations) if fresh else {})}
        verdict = pool_rules.screen(parent_mini, mine)
        cand.screen = {**dataclasses.asdict(verdict), "reused": len(reused)}
        if not verdict.passed:
            return self.decide(record, cand, "rejected", verdict.reason)
        first, second = cfg.parts(ctx.manifest.gate_tasks)
        part = ctx.measure(f"{name}-gate", worktree, first, cfg.gate_trials, seed, record=record)
        if mostly_infra(part):
            return self.decide(
                record,
                cand,
                "undecided",
                f"{part.summary.infra_errors} of {part.summary.num_simulations} gate simulations hit infrastructure errors",
            )
        holds = pool_rules.first_part_holds(self.table(record.parent_label), rewards_by_task(part.simulations), cfg.margin)
        cand.gate_part = dataclasses.asdict(holds)
        cand.gate_candidate = holds.child
        if not holds.passed:
            return self.decide(record, cand, "rejected", holds.reason)
        if second:
            rest_of_gate = ctx.measure(f"{name}-gate2", worktree, second, cfg.gate_trials, seed, record=record)
            if mostly_infra(rest_of_gate):
                return self.decide(
                    record,
                    cand,
                    "undecided",
                    f"{rest_of_gate.summary.infra_errors} of {rest_of_gate.summary.num_simulations} "
                    "gate simulations hit infrastructure errors",
                )
        cand.gate_candidate = mean_reward(self.table(cand.label))
        self.decide(
            record,
            cand,
            "accepted",
            f"Joined the pool: gate {cand.gate_candidate:.3f} over {len(ctx.manifest.gate_tasks)} tasks; {verdict.reason}",
        )

    def reused_tries(self, cand: CandidateRecord, worktree, tasks: list[str]) -> tuple[dict, list[EvalResult]]:
        """The rewards, by minibatch task, of the proposer's tries of the very agent the candidate is (same seed, one
        trial: the screen's own measurement), and those tries' results (their failures are the candidate's)."""
        ctx, digest = self.ctx, agent_digest(agent_files(worktree))
        rewards: dict[str, list] = {}
        results = []
        for tried in cand.tries:
            result = ctx.run.evaluation(tried["evaluation"]).latest_result() if tried.get("agent") == digest else None
            if result is None:
                continue
            results.append(result)
            for task, values in rewards_by_task(result.simulations).items():
                if task in tasks and task not in rewards and values and values[0] is not None:
                    rewards[task] = values[:1]
        return rewards, results

    def decide(self, record: IterationRecord, cand: CandidateRecord, status: str, reason: str) -> None:
        cand.status, cand.reason = status, reason
        self.ctx.save(record)

    def conclude(self, record: IterationRecord) -> None:
        """The iteration's outcome: the children that joined the pool, or how far the furthest got. Nothing is "kept"
        as a lineage keeps; the run's best moves when the iteration is finished (finish)."""
        furthest = min(record.candidates, key=lambda c: PROGRESS.index(c.status))
        joined = [c.label for c in record.candidates if c.status == "accepted"]
        record.gate_incumbent = mean_reward(self.table(record.parent_label))
        record.kept, record.status = None, furthest.status
        record.reason = (
            f"{', '.join(joined)} joined the pool"
            if joined
            else furthest.reason
            if len(record.candidates) == 1
            else f"{furthest.label}: {furthest.reason}"
        )
        self.ctx.save(record)

    def finish(self, record: IterationRecord) -> None:
        """The children that joined become members, and the run's best is the pool's pick; once, however often a resume
        repeats it (the state is saved with the iteration's other outcomes)."""
        ctx = self.ctx
        if ctx.state.next_iteration == record.iteration:
            known = {m.label for m in ctx.state.pool}
            ctx.state.pool += [
                PoolMember(label=c.label, commit=c.commit, parent=record.parent_label, iteration=record.iteration)
                for c in record.candidates
                if c.status == "accepted" and c.commit and c.label not in known
            ]
            self.move_best()
        self.outcome.finish_iteration(record)

    def move_best(self) -> None:
        """The run's best: the member of the best mean gate score, among those no audit has rolled back."""
        ctx, state = self.ctx, self.ctx.state
        failed = {a.best_commit for a in state.audits if not a.holds}
        tables = {m.label: self.table(m.label) for m in self.members() if m.label == BASE or m.commit not in failed}
        label = pool_rules.pick(tables)
        member = next(m for m in self.members() if m.label == label)
        if member.commit == state.incumbent_commit:
            return
        score = mean_reward(tables[label])
        state.incumbent, state.incumbent_commit, state.best_label = member.iteration, member.commit, "" if label == BASE else label
        state.generation += 1
        ctx.lineage.set_branch(ctx.lineage.best_branch, member.commit)
        state.best_history.append(
            best_change(
                member.iteration, member.commit, f"the pool's best mean gate score: {label}, {score:.3f}", "" if label == BASE else label
            )
        )
