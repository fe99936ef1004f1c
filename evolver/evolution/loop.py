"""The evolution loop: one iteration = K candidates from the same parent, at most one kept.

    measure the baseline -> repeat: digest -> propose K (at once) -> validate -> commit
    -> smoke -> staged gate over the K -> keep one or none -> (end) holdout and report

Every step writes its result to the run directory before the next starts, and
every step first looks there for its own result, so a run killed at any point
resumes where it stopped without redoing finished simulations or duplicating
candidates.
"""

from __future__ import annotations

import dataclasses
import json
import math
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from evolver import events as ev
from evolver import ratelimit
from evolver.config import Config
from evolver.config_requests import eval_request
from evolver.data import EvalResult, RoleUsage, add_tallies
from evolver.evaluation.backends import Backend
from evolver.evaluation.metrics import mean_reward, rewards_by_task
from evolver.evolution import gate as gatelib
from evolver.evolution.gate import search
from evolver.evolution.evidence import EarlierCandidate, Evidence, flipped
from evolver.evolution.noop import inert_edit_reason
from evolver.evolution.patch import Edit, PatchRejected, apply_edits
from evolver.evolution.plan import forecast, meta_prompt_tokens, proposer_budget
from evolver.evolution.proposers import Proposer, Request
from evolver.evolution.triage import triage
from evolver.errors import UsageError
from evolver.llm import ConfigurationError, ProviderError, price_of
from evolver.store.lineage import Lineage, commit_message
from evolver.store.rundir import RunDir, measured
from evolver.store.runstate import FINAL_STATUSES, BestChange, CandidateRecord, IterationRecord, Manifest, RunState, charge, slug

SMOKE_TIMEOUT = 600.0
RATE_LIMITS_EVERY = 2.0  # seconds between looks at the rate limiter while a run is driven
# How far a candidate got, best first: an iteration is as far as its furthest candidate.
PROGRESS = ("accepted", "rejected", "undecided", "invalid", "refused", "no_patch")


class StopRun(Exception):
    """A stop condition was met; the reason is recorded in state.json."""


@dataclasses.dataclass
class Loop:
    run: RunDir
    manifest: Manifest
    state: RunState
    cfg: Config
    policy: search.Policy  # what the run's gate bounds: each decision, or the run through an audit (gate.search)
    lineage: Lineage
    prompts_dir: Path
    guide: str
    events: ev.Events
    identifiers: frozenset = frozenset()  # the domain's task-data identifiers, for the static scan
    proposer: Optional[Proposer] = None  # evolver.evolution.proposers, as the run's settings choose
    backend: Optional[Backend] = None  # where simulations run; set by the command that drives the loop
    local_api_base: Optional[str] = None  # the embedded model's server, when the command serves one: given to drive()
    started: float = dataclasses.field(default_factory=time.monotonic)
    saving: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # candidates' threads share the iteration file

    # ------------------------------------------------------------------ the loop
    def drive(self, local_api_base: Optional[str] = None) -> None:
        """Run until a stop condition; ``local_api_base`` is the embedded server the command started, if any."""
        self.local_api_base = local_api_base
        watching = threading.Event()  # set when the run stops being driven
        threading.Thread(target=self.watch_rate_limits, args=(watching,), name="rate-limits", daemon=True).start()
        try:
            self.measure_baseline()
            try:
                while True:
                    self.check_stop()
                    self.refresh_stale_reference()
                    self.iterate(self.state.next_iteration)
            except StopRun:
                self.audit()  # in the run's own try: a kill during it is an interruption like any other
                raise
        except StopRun as stop:
            self.state.stop_reason = str(stop)
            self.state.status = "finished"
            self.save_state()
            self.run.log("stopped", reason=str(stop))
            self.events.emit(ev.Ended("stopped", str(stop), self.run.run_id))
            self.holdout()
        except ConfigurationError as exc:  # the meta-LLM refuses its settings: no retry or wait can fix it, said at once
            self.state.status, self.state.stop_reason = "interrupted", str(exc)
            self.save_state()
            self.run.log("interrupted", reason=str(exc))
            self.events.emit(ev.Ended("failed", str(exc), self.run.run_id))
            raise UsageError(f"{exc}; the run stopped (resume it with `evolver run --resume {self.run.run_id}` once the setting is fixed)") from None
        except ProviderError as exc:  # the meta-LLM stayed down through its retries: nothing is lost, resume later
            self.state.status, self.state.stop_reason = "paused", f"the meta-LLM failed: {exc}"
            self.save_state()
            self.run.log("paused", reason=str(exc))
            self.events.emit(ev.Ended("paused", str(exc), self.run.run_id))
        except KeyboardInterrupt:
            self.state.status = "interrupted"
            self.save_state()
            self.run.log("interrupted")
            self.events.emit(ev.Ended("interrupted", "", self.run.run_id))
            raise
        except BaseException as exc:  # the command reports it; the views only close
            self.events.emit(ev.Ended("failed", str(exc), self.run.run_id))
            raise
        finally:
            watching.set()

    def watch_rate_limits(self, stop: threading.Event, every: float = RATE_LIMITS_EVERY) -> None:
        """Every few seconds while the run is driven: the command's rate limiter, per provider endpoint and
        model, to the views and to the run directory (for `evolver status`)."""
        while not stop.wait(every):
            limiter = ratelimit.current()
            try:
                lanes = limiter.snapshot() if limiter is not None else {}
            except OSError:
                continue
            if lanes:
                self.run.save_rate_limits(lanes)
                self.events.emit(ev.RateLimits(lanes))

    def iterate(self, n: int) -> None:
        record = self.run.iteration(n) or self.new_iteration(n)
        self.save(record)
        if record.status not in FINAL_STATUSES:
            self.step(f"iteration {n}: proposing {_count(record.candidates, 'candidate')}")
            analysis = self.analysis_result()  # once, before the proposals are drawn at once: they share it
            self.each(record, "proposing", lambda r, c: self.propose(r, c, analysis))
            self.each(record, "evaluating", self.prepare)
            self.gate_candidates(record)
            self.conclude(record)
        self.finish_iteration(record)

    # ------------------------------------------------------------------ steps
    def measure_baseline(self) -> None:
        self.step("measuring the baseline")
        analysis = self.analysis_result()
        reference = self.reference_table()
        self.events.emit(ev.Baseline(analysis.summary.avg_reward, mean_reward(reference)))
        if mean_reward(reference) == 1.0:
            raise StopRun("the incumbent already passes every gate task in every trial, so no candidate can be shown better; "
                          "evolve on a harder domain or split, or with a weaker agent model")
        gate = search.iteration_gate(self.policy, reference)
        floor = gatelib.noise_floor(reference, gate)
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

    def new_iteration(self, n: int) -> IterationRecord:
        k = self.cfg.candidates
        labels = [str(n)] if k == 1 else [f"{n}{letter}" for letter in string.ascii_lowercase[:k]]
        return IterationRecord(iteration=n, parent=self.state.incumbent, parent_commit=self.state.incumbent_commit,
                               generation=self.state.generation, candidates=[CandidateRecord(label=label) for label in labels])

    def each(self, record: IterationRecord, status: str, step: Callable[[IterationRecord, CandidateRecord], None]) -> None:
        """Run one step for every candidate at ``status``, all at once (each in its own worktree)."""
        self.concurrently(lambda c: step(record, c), [c for c in record.candidates if c.status == status])

    def propose(self, record: IterationRecord, cand: CandidateRecord, analysis: EvalResult) -> None:
        name = slug(cand.label)
        parent_tree = self.checkout(f"parent-{name}", record.parent_commit)
        workdir = self.run.proposal_dir(name)
        session = self.set_aside_interrupted(record, workdir)
        tries = iter(range(1, 1_000_000))

        def try_agent(root: Path, tasks: list[str]) -> tuple[EvalResult, Path]:
            """The proposer's scratch agent on analysis tasks, paired with the analysis's first trial (same seed)."""
            name_ = f"propose-{name}-s{session}-try{next(tries)}"
            return self.measure(name_, root, tasks, 1, self.seed(record.generation), record=record), self.run.evaluation(name_).path

        request = Request(
            label=cand.label, focus=(record.candidates.index(cand), len(record.candidates)), parent=parent_tree,
            evidence=Evidence(analysis, self.run.evaluation(f"analysis-g{record.generation}").path, self.earlier_candidates(record),
                              triage({name: records for name, records in measured(self.run.repo, self.run.run_id).items()
                                      if name.startswith("evals/analysis-")}), parent=parent_tree),
            learnings=self.learnings(), guide=self.guide, identifiers=self.identifiers, meta=self.cfg.role("meta", self.local_api_base),
            llm_retries=self.cfg.llm_retries, context_tokens=self.cfg.meta_context_tokens, budget=proposer_budget(self.cfg),
            workdir=workdir, prompts_dir=self.prompts_dir, digest_chars=self.cfg.digest_chars, try_agent=try_agent,
            progress=lambda turn, turns, doing: self.events.emit(ev.Proposing(cand.label, turn, turns, doing)),
        )
        with ratelimit.tracking() as limits:  # the meta-LLM's calls, made in this thread
            outcome = self.proposer.propose(request)
        cand.responses, cand.errors, cand.findings = outcome.responses, outcome.errors, outcome.findings
        cand.investigation = outcome.stats
        if outcome.proposal is None:
            cand.status, cand.reason = "no_patch", f"no valid patch after {len(outcome.responses)} answer(s): {outcome.errors[-1] if outcome.errors else 'empty'}"
        else:
            p = outcome.proposal
            cand.title, cand.rationale = p.title, p.rationale
            cand.edits = [dataclasses.asdict(e) for e in p.edits]
            cand.status, cand.reason = ("refused", outcome.refused) if outcome.refused else ("evaluating", "")
        self.add_usage(record, "meta", outcome.usage, limits)  # saves the candidate's outcome with the meta-LLM's charge
        self.run.log("proposed", iteration=record.iteration, candidate=cand.label, status=cand.status, title=cand.title)
        self.lineage.remove_worktree(parent_tree)

    def set_aside_interrupted(self, record: IterationRecord, workdir: Path) -> int:
        """A proposal cut off by a kill is asked again, never half-applied: its transcript is kept beside
        the new one and what its meta-LLM used is charged now. Returns the new session's number."""
        done = sorted(workdir.glob("interrupted-*.json"))
        current = workdir / "transcript.json"
        if current.exists():
            try:
                spent = RoleUsage(**json.loads(current.read_text()).get("usage", {}))
            except (OSError, ValueError, TypeError):
                spent = RoleUsage()
            current.rename(workdir / f"interrupted-{len(done) + 1}.json")
            self.add_usage(record, "meta", spent)
            done.append(current)
        return len(done) + 1

    def earlier_candidates(self, record: IterationRecord) -> list[EarlierCandidate]:
        """The run's candidates before this iteration, as a proposer may see them: diff, verdict, flipped gate tasks."""
        labels = {task: f"G{i + 1}" for i, task in enumerate(self.manifest.gate_tasks)}
        out = []
        for r in self.run.iterations():
            if r.iteration >= record.iteration:
                break
            incumbent = self.latest_rewards(f"iter-{r.iteration:03d}-incumbent") or self.latest_rewards(f"reference-g{r.generation}") or {}
            for c in r.candidates:
                table = self.latest_rewards(f"iter-{slug(c.label)}-gate") or {}
                out.append(EarlierCandidate(
                    label=c.label, title=c.title, status=c.status, reason=c.reason,
                    diff=self.lineage.diff(r.parent_commit, c.commit) if c.commit else "",
                    flips=tuple(f"{labels.get(task, '?')}: {was:.2f} -> {now:.2f}" for task, was, now in flipped(table, incumbent)),
                    gate_delta=None if c.gate_candidate is None or r.gate_incumbent is None else c.gate_candidate - r.gate_incumbent))
        return out

    def prepare(self, record: IterationRecord, cand: CandidateRecord) -> None:
        """Commit the candidate, refuse it when it cannot behave differently, and smoke-test it."""
        wt = self.candidate_worktree(record, cand)
        if cand.status == "evaluating":
            inert = self.inert_reason(record, cand)
            if inert:
                cand.status, cand.reason = "refused", inert
        if cand.status == "evaluating":
            self.step(f"iteration {record.iteration}: smoke test")
            # The smoke test's limit is the worker timeout's too, when that is shorter.
            smoke = self.measure(f"iter-{slug(cand.label)}-smoke", wt, self.manifest.analysis_tasks[:1], 1, self.seed(record.generation),
                                 timeout=min(SMOKE_TIMEOUT, self.cfg.worker_timeout), record=record)
            broken = smoke.candidate_error or next((s.error.splitlines()[0] for s in smoke.simulations if s.outcome == "failed" and s.error), None)
            if broken:
                cand.status, cand.reason = "invalid", f"smoke test failed: {broken}"
        self.save(record)

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
            self.step(f"iteration {n}: gate stage {stage.index + 1}/{stage.count} ({_count(stage.alive, 'candidate')}, {cand_trials} trial(s) per task"
                      + (f", the incumbent beside them at {inc_trials})" if inc_trials else ")"))
            jobs = [(f"iter-{n:03d}-incumbent", arm, inc_trials)] if inc_trials else []
            jobs += [(f"iter-{slug(label)}-gate", self.run.worktree(f"iter-{slug(label)}"), cand_trials) for label in stage.alive]
            results = self.concurrently(lambda job: self.measure(job[0], job[1], self.manifest.gate_tasks, job[2], seed, record=record), jobs)
            incumbent: dict = {}
            if inc_trials:
                inc_result = results.pop(0)
                incumbent = rewards_by_task(inc_result.simulations)
                record.gate_incumbent = mean_reward(incumbent)
                if _mostly_infra(inc_result):
                    self.undecided(record, stage.alive, f"{inc_result.summary.infra_errors} of {inc_result.summary.num_simulations} "
                                                        "simulations of the incumbent beside the candidates hit infrastructure errors")
                    return None
            tables = {}
            for label, result in zip(stage.alive, results):
                tables[label] = rewards_by_task(result.simulations)
                entered[label].gate_candidate = mean_reward(tables[label])
                if _mostly_infra(result):
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

    def conclude(self, record: IterationRecord) -> None:
        """The iteration's outcome: its kept candidate, or how far the furthest one got."""
        furthest = min(record.candidates, key=lambda c: PROGRESS.index(c.status))
        record.kept = furthest.label if furthest.status == "accepted" else None
        record.status = furthest.status
        record.reason = furthest.reason if len(record.candidates) == 1 else f"{furthest.label}: {furthest.reason}"
        self.save(record)

    def finish_iteration(self, record: IterationRecord) -> None:
        """Record the outcome in git and state; idempotent, so a resume can repeat it."""
        n = record.iteration
        self.save(record)
        for cand in record.candidates:
            if cand.commit:
                note = (f"evolver {cand.status}: {cand.reason}\n"
                        f"iteration {n}, candidate {cand.label}, parent {'base' if record.parent == 0 else record.parent}, "
                        f"gate {_fmt(cand.gate_candidate)} vs incumbent {_fmt(record.gate_incumbent)}")
                self.lineage.add_note(cand.commit, note)
        winner = record.winner
        if winner and self.state.incumbent != n and self.state.next_iteration == n:
            self.state.incumbent, self.state.incumbent_commit = n, winner.commit
            self.state.generation += 1
            self.lineage.set_branch(self.lineage.best_branch, winner.commit)
            self.state.best_history.append(_best(n, winner.commit, winner.reason))
        if self.state.next_iteration == n:
            # One gate decision per iteration however many candidates: the gate bounds the chance
            # that any no-op among them is kept by alpha (docs/gate.md).
            self.state.decisions += any(c.status in ("accepted", "rejected") for c in record.candidates)
            # The stall rule (README): iterations in a row that kept nothing; an undecided one (too many
            # infrastructure errors to judge) neither counts nor breaks the streak.
            if record.status == "accepted":
                self.state.consecutive_rejections = 0
            elif record.status != "undecided":
                self.state.consecutive_rejections += 1
            self.state.next_iteration = n + 1
            for name, usage in record.usage.items():
                self.state.usage[name] = self.state.usage.get(name, RoleUsage()).add(usage)
            add_tallies(self.state.rate_limits, record.rate_limits)
        if not self.run.logged("decided", iteration=n):  # before the state moves on, once: a kill never loses it
            self.run.log("decided", iteration=n, status=record.status, kept=record.kept, reason=record.reason)
        self.save_state()
        self.lineage.remove_worktree(self.run.worktree(f"iter-{n:03d}-incumbent"))
        for cand in record.candidates:
            self.lineage.remove_worktree(self.run.worktree(f"iter-{slug(cand.label)}"))
            self.events.emit(ev.Decided(cand.label, cand.status, cand.title, cand.reason))

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
            return None if any(map(_mostly_infra, results)) else (rewards_by_task(results[0].simulations), rewards_by_task(results[1].simulations))

        looks = search.evaluate_audit(self.policy, run)
        holds = search.audit_holds(looks)
        decided = looks and looks[-1].decision != "continue"
        reason = looks[-1].reason if decided else "Undecided: most of the audit's simulations hit infrastructure errors, and nothing unshown is kept."
        self.state.audits.append({"best": self.state.incumbent, "best_commit": best, "holds": holds, "reason": reason,
                                  "looks": [dataclasses.asdict(c) for c in looks]})
        if not holds:
            base = self.manifest.base_commit
            self.state.best_history.append(_best(0, base, f"audit: iteration {self.state.incumbent} not shown better than the base: {reason}"))
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

    # ------------------------------------------------------------------ helpers
    def check_stop(self) -> None:
        s = self.state
        if s.next_iteration > s.iterations_target:
            raise StopRun(f"completed {s.iterations_target} iteration(s)")
        if self.cfg.stall and s.consecutive_rejections >= self.cfg.stall:
            raise StopRun(f"{s.consecutive_rejections} consecutive candidates were not kept (stall limit {self.cfg.stall})")
        cost = sum(u.cost for u in s.usage.values())
        tokens = sum(u.prompt_tokens + u.completion_tokens for u in s.usage.values())
        if self.cfg.budget_usd and cost >= self.cfg.budget_usd:
            raise StopRun(f"budget reached: ${cost:.2f} of ${self.cfg.budget_usd:.2f}")
        if self.cfg.budget_tokens and tokens >= self.cfg.budget_tokens:
            raise StopRun(f"token budget reached: {tokens:,} of {self.cfg.budget_tokens:,}")
        if self.cfg.max_hours and self.elapsed() >= self.cfg.max_hours * 3600:
            raise StopRun(f"wall-clock limit of {self.cfg.max_hours:g} h reached")

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

    def incumbent_history(self) -> dict:
        """Every gate trial of the incumbent so far, the audited policy's reference: the base's reference, or the kept
        candidate's trials beside its parent (its screen trial, the first, left out); then its trials beside later candidates."""
        s, kept = self.state, self.run.iteration(self.state.incumbent) if self.state.incumbent else None
        first = self.latest_rewards(f"iter-{slug(kept.kept)}-gate" if kept else "reference-g0") or {}
        tables = [{task: rewards[1:] for task, rewards in first.items()} if kept else first]
        tables += [self.latest_rewards(f"iter-{r.iteration:03d}-incumbent") or {} for r in self.run.iterations()
                   if r.parent_commit == s.incumbent_commit and r.status in FINAL_STATUSES]
        return {task: [x for table in tables for x in table.get(task, [])] for task in self.manifest.gate_tasks}

    def measure(self, name: str, checkout: Path, tasks: list[str], trials: int, seed: int, *, timeout: Optional[float] = None,
                record: Optional[IterationRecord] = None) -> EvalResult:
        """Evaluate, reusing a finished result and finished simulations on disk (the store says which).

        Each simulation's usage is charged once (runstate.charge), to the iteration or the run;
        the charge is saved before the result is kept."""
        evaluation = self.run.evaluation(name)
        finished = evaluation.result(trials)
        if finished is not None:
            return finished
        timeout = timeout or self.cfg.worker_timeout
        req = eval_request(self.cfg, checkout, evaluation.path, local_api_base=self.local_api_base, timeout=timeout, split=None, task_ids=tasks, trials=trials, seed=seed)
        try:
            result = self.backend.evaluate(req, self.run.run_id, timeout=timeout,
                                           on_progress=lambda done, total, mean: self.events.emit(ev.EvalProgress(name, done, total, mean)))
        finally:
            self.events.emit(ev.EvalFinished(name))
        with self.saving:
            charge(record if record is not None else self.state, name, result.simulations)
            if record is not None:
                self.run.save_iteration(record)
        if record is None:
            self.save_state()
        self.report_spent(record)
        evaluation.keep_result(result)
        return result

    def latest_rewards(self, name: str) -> Optional[dict]:
        result = self.run.evaluation(name).latest_result()
        return None if result is None else rewards_by_task(result.simulations)

    def inert_reason(self, record: IterationRecord, cand: CandidateRecord) -> Optional[str]:
        """Why the candidate cannot behave differently from what was already measured, if so: its
        agent/ equals its parent's or an earlier candidate's, or it edits only layers that are off."""
        tree = self.lineage.agent_tree_of(cand.commit)
        if tree == self.lineage.agent_tree_of(record.parent_commit):
            return "the patch leaves agent/ as it was: nothing to measure"
        siblings = record.candidates[:record.candidates.index(cand)]
        for earlier in [c for r in self.run.iterations() if r.iteration < record.iteration for c in r.candidates] + siblings:
            if earlier.commit and self.lineage.agent_tree_of(earlier.commit) == tree:
                which = f"iteration {earlier.label}" if earlier.label.isdigit() else f"candidate {earlier.label}"
                return f"its agent/ is identical to {which}'s ({earlier.status}): nothing new to measure"
        parent = self.checkout(f"parent-{slug(cand.label)}", record.parent_commit)
        try:
            return inert_edit_reason(parent, self.run.worktree(f"iter-{slug(cand.label)}"))
        finally:
            self.lineage.remove_worktree(parent)

    def candidate_worktree(self, record: IterationRecord, cand: CandidateRecord) -> Path:
        """The candidate's worktree; its branch and commit are made once and reused on resume."""
        name = slug(cand.label)
        branch = self.lineage.candidate_branch(name)
        existing = self.lineage.commit_of(branch)
        if existing:
            cand.branch, cand.commit = branch, existing
            return self.checkout(f"iter-{name}", existing)
        wt = self.checkout(f"iter-{name}", record.parent_commit)
        try:
            apply_edits(wt, [Edit(**e) for e in cand.edits])
        except PatchRejected as exc:
            cand.status, cand.reason = "invalid", str(exc)
            return wt
        message = commit_message(cand.title, cand.rationale, {
            "Evolver-Run": self.run.run_id, "Evolver-Iteration": str(record.iteration), "Evolver-Candidate": cand.label,
            "Evolver-Parent": "base" if record.parent == 0 else str(record.parent),
        })
        cand.branch, cand.commit = branch, self.lineage.commit_candidate(wt, branch, message)
        self.save(record)
        return wt

    def checkout(self, name: str, commit: str) -> Path:
        return self.lineage.open_worktree(self.run.worktree(name), commit)

    def seed(self, generation: int) -> int:
        return self.cfg.seed + 1000 * generation

    def learnings(self) -> list[str]:
        lines = [prior_learnings(self.run.prior_learnings_file)] if self.run.prior_learnings_file.exists() else []
        for r in self.run.iterations():
            if r.status not in FINAL_STATUSES:
                continue
            for c in r.candidates:
                delta = "" if c.gate_candidate is None or r.gate_incumbent is None else f", gate {r.gate_incumbent:.3f} -> {c.gate_candidate:.3f}"
                lines.append(f"- Iteration {c.label}: \"{c.title or '(no patch)'}\" -> {c.status}{delta}. {c.reason}")
        return lines

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

    def concurrently(self, work: Callable, items: list) -> list:
        """work(item) for every item at once, results in order. Ctrl-C or a failure in one cancels
        the evaluations of the others, so nothing runs on unseen."""
        if len(items) <= 1:
            return [work(item) for item in items]
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            try:
                return list(pool.map(work, items))
            except BaseException:
                self.backend.cancel()
                raise

    def step(self, text: str) -> None:
        self.state.current_step = text
        self.save_state()
        self.events.emit(ev.Phase(text))

    def elapsed(self) -> float:
        return self.state.elapsed + time.monotonic() - self.started

    def save_state(self) -> None:
        snapshot = self.state.model_copy(update={"elapsed": self.elapsed(), "updated_at": time.time()})
        self.run.save_state(snapshot)


PRIOR_LEARNINGS_CHARS = 4000  # of the learnings brought from earlier work: the end, where an appended file keeps its latest


def prior_learnings(path: Path) -> str:
    """The learnings a run brought from earlier work (learnings_file, e.g. auto-harness's workspace/learnings.md)
    as the first entry of its learnings: one entry, however many lines the file has."""
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    if len(text) > PRIOR_LEARNINGS_CHARS:
        text = "[... the beginning is cut]\n" + text[-PRIOR_LEARNINGS_CHARS:]
    return f"- Before this run (findings from earlier work, not tested here):\n{text}"


def _best(iteration: int, commit: str, reason: str) -> BestChange:
    return BestChange(iteration=iteration, commit=commit, reason=reason, at=time.time())


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _mostly_infra(result: EvalResult) -> bool:
    return result.summary.infra_errors > result.summary.num_simulations / 2


def _fmt(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.3f}"
