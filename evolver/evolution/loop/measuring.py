"""The loop's one way to simulations: an evaluation through the backend, reused from disk when it finished,
its usage charged once; with the worktrees, seeds and concurrency every measurement uses."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from evolver import events as ev
from evolver.config_requests import eval_request
from evolver.data import EvalResult
from evolver.evaluation.metrics import rewards_by_task
from evolver.store.runstate import IterationRecord, charge


class Measuring:
    """Loop's measurements (a part of evolver.evolution.loop.Loop, which holds the run, its state and settings)."""

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


def mostly_infra(result: EvalResult) -> bool:
    """Most of its simulations hit infrastructure errors: too few to judge by."""
    return result.summary.infra_errors > result.summary.num_simulations / 2
