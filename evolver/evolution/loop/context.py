"""The run as every step of the loop sees it: what the run is and holds, and the few operations every step shares
(measure, check out, save, say the step), passed to each step explicitly.

measure() is the loop's one way to simulations: an evaluation through the backend, reused from disk when it
finished, its usage charged once. save() and save_state() write the iteration and state files; step() says what
the run is doing, on disk and to the views.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from evolver import events as ev
from evolver.config import Config
from evolver.config_requests import eval_request
from evolver.data import EvalResult, RoleUsage, add_tallies
from evolver.evaluation.backends import Backend
from evolver.evaluation.metrics import rewards_by_task
from evolver.evolution.gate import search
from evolver.evolution.proposers import Proposer
from evolver.store.lineage import Lineage
from evolver.store.rundir import RunDir
from evolver.store.runstate import CandidateRecord, IterationRecord, Manifest, RunState, charge, slug


@dataclasses.dataclass
class RunContext:
    run: RunDir
    manifest: Manifest
    state: RunState
    cfg: Config
    policy: search.Policy  # what the run's gate bounds (gate.search), as the run recorded it
    lineage: Lineage
    prompts_dir: Path
    guide: str
    events: ev.Events
    backend: Backend  # where simulations run
    proposer: Proposer  # evolver.evolution.proposers, as the run's settings choose
    identifiers: frozenset = frozenset()  # the domain's task-data identifiers, for the static scan
    local_api_base: Optional[str] = None  # the embedded model's server, when the command serves one
    started: float = dataclasses.field(default_factory=time.monotonic)
    saving: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # candidates' threads share the iteration file

    # -- simulations ------------------------------------------------------------------------------
    def measure(
        self,
        name: str,
        checkout: Path,
        tasks: list[str],
        trials: int,
        seed: int,
        *,
        timeout: Optional[float] = None,
        record: Optional[IterationRecord] = None,
    ) -> EvalResult:
        """Evaluate, reusing a finished result and finished simulations on disk (the store says which).

        Each simulation's usage is charged once (runstate.charge), to the iteration or the run;
        the charge is saved before the result is kept."""
        evaluation = self.run.evaluation(name)
        finished = evaluation.result(trials)
        if finished is not None:
            return finished
        timeout = timeout or self.cfg.worker_timeout
        req = eval_request(
            self.cfg,
            checkout,
            evaluation.path,
            local_api_base=self.local_api_base,
            timeout=timeout,
            split=None,
            task_ids=tasks,
            trials=trials,
            seed=seed,
        )
        try:
            result = self.backend.evaluate(
                req,
                self.run.run_id,
                timeout=timeout,
                on_progress=lambda done, total, mean: self.events.emit(ev.EvalProgress(name, done, total, mean)),
            )
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

    def checkout(self, name: str, commit: str) -> Path:
        return self.lineage.open_worktree(self.run.worktree(name), commit)

    def seed(self, generation: int) -> int:
        return self.cfg.seed + 1000 * generation

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

    def each(self, record: IterationRecord, status: str, step: Callable[[IterationRecord, CandidateRecord], None]) -> None:
        """Run one step for every candidate at ``status``, all at once (each in its own worktree)."""
        self.concurrently(lambda c: step(record, c), [c for c in record.candidates if c.status == status])

    # -- the run's files and what it says ---------------------------------------------------------
    def add_usage(self, record: IterationRecord, role: str, usage: RoleUsage, limits: Optional[dict] = None) -> None:
        with self.saving:
            record.usage[role] = record.usage.get(role, RoleUsage()).add(usage)
            add_tallies(record.rate_limits, limits or {})
            self.run.save_iteration(record)
        self.report_spent(record)

    def report_spent(self, record: Optional[IterationRecord]) -> None:
        """The run's usage so far, the iteration in progress included, for the views."""
        total = dict(self.state.usage)
        for role, usage in record.usage.items() if record is not None else ():
            total[role] = total.get(role, RoleUsage()).add(usage)
        self.events.emit(ev.Spent(total, self.cfg.budget_usd, self.cfg.budget_tokens))

    def save(self, record: IterationRecord) -> None:
        with self.saving:
            self.run.save_iteration(record)

    def step(self, text: str) -> None:
        self.state.current_step = text
        self.save_state()
        self.events.emit(ev.Phase(text))

    def elapsed(self) -> float:
        return self.state.elapsed + time.monotonic() - self.started

    def save_state(self) -> None:
        snapshot = self.state.model_copy(update={"elapsed": self.elapsed(), "updated_at": time.time()})
        self.run.save_state(snapshot)


def member_trials(latest: Callable[[str], Optional[dict]], label: str) -> dict:
    """A candidate's gate trials, by task (a population child's first and second part together; the base's reference).
    ``latest`` reads an evaluation's rewards by task, None before it has any."""
    if label in ("", "base"):
        return latest("reference-g0") or {}
    name = f"iter-{slug(label)}"
    return {**(latest(f"{name}-gate") or {}), **(latest(f"{name}-gate2") or {})}


def count(items: list, noun: str) -> str:
    """The count with its noun: "3 candidates", "1 candidate"."""
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def mostly_infra(result: EvalResult) -> bool:
    """Most of its simulations hit infrastructure errors: too few to judge by."""
    return result.summary.infra_errors > result.summary.num_simulations / 2
