"""The local backend: simulations in worker processes forked by this machine's zygote.

The controller never imports the candidate's code: it writes the request,
has the zygote (evolver.evaluation.zygote) fork workers, watches sims.jsonl for progress,
enforces the wall-clock limit, and turns what the workers left on disk into an
EvalResult. The evaluation's folder is read and written through evolver.store.evaldir.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from evolver import ratelimit
from evolver.data import EvalRequest, EvalResult
from evolver.errors import UsageError
from evolver.evaluation import zygote_client
from evolver.evaluation.backends import Cancelled, Progress, TaskListing
from evolver.evaluation.backends.results import eval_result
from evolver.ratelimit.service import Service
from evolver.store.evaldir import EvalDir

# Workers per evaluation: tau2's simulations are partly CPU-bound under one GIL,
# so two processes use both cores of a small machine.
WORKER_PROCESSES = min(2, os.cpu_count() or 1)

LIST_TIMEOUT = 600.0


class Zygote:
    """One connection to the warm zygote (evolver.evaluation.zygote_client finds or starts it), used by one
    evaluation at a time: its messages say which of that evaluation's workers exited."""

    def __init__(self, environment: Optional[dict] = None) -> None:
        self.conn = zygote_client.connect()
        self.exits: dict[int, int] = {}
        self.environment = environment

    def _note(self, msg: dict) -> None:
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["code"]

    def spawn(self, request: Path, log: Path, cwd: str) -> int:
        env = zygote_client.environment_fd(dict(os.environ) if self.environment is None else self.environment)
        zygote_client.send_with_fds(self.conn.sock, {"request": str(request), "log": str(log), "cwd": cwd}, [env])
        os.close(env)
        return zygote_client.await_pid(self.conn, self._note, 60)

    def wait(self, timeout: float) -> None:
        """Return when a worker exits or ``timeout`` seconds pass."""
        for msg in self.conn.receive(timeout):
            self._note(msg)

    def exit_code(self, pid: int) -> Optional[int]:
        for msg in self.conn.receive(0):
            self._note(msg)
        return self.exits.get(pid)


def _stop(zygote: Zygote, pid: int) -> None:
    """Stop a worker and everything it started (it leads its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if zygote.exit_code(pid) is not None:
                return
            zygote.wait(0.05)


def _merge(statuses: list[dict]) -> dict:
    """One status for the shards of an evaluation: the worst state wins."""
    states = [s.get("state") for s in statuses]
    for state in ("usage_error", "candidate_error", "importing", None, "running", "listed", "done"):
        if state in states:
            first = statuses[states.index(state)]
            break
    tasks = list(dict.fromkeys(t for s in statuses for t in s.get("tasks") or []))  # each worker sees the whole grid
    return {**first, "state": first.get("state"), "tasks": tasks}


def _shards(req: EvalRequest) -> list[EvalRequest]:
    """Share the grid between the cores: every worker runs it in one tau2 call, claiming simulations as it goes."""
    one = req.list_only or req.task_ids and len(req.task_ids) * req.trials < 2
    n = 1 if one else max(1, min(WORKER_PROCESSES, req.concurrency))
    per = -(-req.concurrency // n)
    return [req.model_copy(update={"shard": i, "shards": n, "concurrency": per}) for i in range(n)]


class LocalBackend:
    """Evaluations on this machine. Several may run at once (one per thread: the candidates of an
    iteration); each holds its own connection to the zygote, kept for the next one afterwards.
    The workers get ``environment`` (default: this process's), e.g. a Ray driver's keys on a Ray node,
    and ``limiter`` (the command's rate limiter, or a Ray node's relay to the cluster's) on a Unix
    socket in the runtime directory: every worker's LLM calls wait their turn in it."""

    name = "local"

    def __init__(self, environment: Optional[dict] = None, limiter=None) -> None:
        self.environment = environment
        self.limiter = None if ratelimit.switched_off() else limiter
        self.service: Optional[Service] = None
        self.idle: list[Zygote] = []
        self.lock = threading.Lock()
        self.cancelled = threading.Event()

    def evaluate(self, req: EvalRequest, run_id: str, *, timeout: float, on_progress: Optional[Progress] = None) -> EvalResult:
        """Evaluate; simulations already on disk in req.out_dir are kept, not run again. Time its calls
        spent waiting for the rate limit does not count against ``timeout``."""
        with self._connection() as zygote:
            return _evaluate(zygote, req, run_id, timeout, on_progress, self.cancelled, self._throttled)

    def _throttled(self) -> float:
        return self.limiter.throttled() if self.limiter is not None else 0.0

    def _workers_environment(self) -> dict:
        env = dict(os.environ) if self.environment is None else dict(self.environment)
        with self.lock:
            if self.limiter is not None and self.service is None:
                self.service = Service(self.limiter, zygote_client.runtime_dir())
        if self.service is not None:
            env[ratelimit.ENV] = str(self.service.path)
        return env

    def list_tasks(self, req: EvalRequest) -> TaskListing:
        with self._connection() as zygote:
            return _list_tasks(zygote, req, self.cancelled)

    def cancel(self) -> None:
        self.cancelled.set()

    def close(self) -> None:
        with self.lock:
            for zygote in self.idle:
                zygote.conn.close()
            self.idle.clear()
            if self.service is not None:
                self.service.close()
                self.service = None

    def __enter__(self) -> "LocalBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _connection(self):
        with self.lock:
            zygote = self.idle.pop() if self.idle else None
        if zygote is None or zygote.conn.closed:
            zygote = Zygote(self._workers_environment())
        try:
            yield zygote
        finally:
            with self.lock:
                self.idle.append(zygote)


def _run_worker(
    zygote: Zygote,
    req: EvalRequest,
    timeout: float,
    cancelled: threading.Event,
    on_tick: Optional[Callable[[], None]] = None,
    throttled: Callable[[], float] = lambda: 0.0,
) -> tuple[dict, Optional[str], int]:
    """Run the workers of one evaluation to the end, the time limit (the time during which calls waited
    for the rate limit, ``throttled``, not counted) or a cancel. Returns (merged status, why they were
    stopped, worst exit code)."""
    evaluation = EvalDir(req.out_dir)
    evaluation.begin(req)  # a resumed evaluation reads neither the last workers' verdict nor their claims
    shards = _shards(req)
    pids = []
    for shard in shards:
        pids.append(zygote.spawn(evaluation.write_shard_request(shard), evaluation.log_file, req.checkout))
    started, throttled_before = time.monotonic(), throttled()
    note = None
    try:
        while any(zygote.exit_code(pid) is None for pid in pids):
            if cancelled.is_set():
                raise Cancelled("the evaluation was cancelled")
            if time.monotonic() - started - (throttled() - throttled_before) > timeout:
                note = f"the worker was stopped at the wall-clock limit of {timeout:g} s"
                for pid in pids:
                    _stop(zygote, pid)
                break
            if on_tick:
                on_tick()
            zygote.wait(0.2)
    except BaseException:  # Ctrl-C, a cancel or the controller failing: leave no worker behind
        for pid in pids:
            _stop(zygote, pid)
        raise
    status = _merge([evaluation.read_status(s.shard) for s in shards])
    if status.get("state") == "usage_error":
        raise UsageError(status["message"])
    codes = [zygote.exit_code(pid) for pid in pids]
    return status, note, max((c for c in codes if c is not None), default=-1)


def _list_tasks(zygote: Zygote, req: EvalRequest, cancelled: threading.Event) -> TaskListing:
    """The task ids a request selects, the domain's splits, and the identifiers in its task data
    (for the static scan), resolved by tau2 in a worker."""
    status, note, code = _run_worker(zygote, req.model_copy(update={"list_only": True}), LIST_TIMEOUT, cancelled)
    if status.get("state") != "listed":
        raise RuntimeError(note or f"listing tasks failed (worker exit code {code}); see {EvalDir(req.out_dir).log_file}")
    return TaskListing(tasks=status["tasks"], splits=status.get("splits") or {}, identifiers=status.get("identifiers") or [])


def _evaluate(
    zygote: Zygote,
    req: EvalRequest,
    run_id: str,
    timeout: float,
    on_progress: Optional[Progress],
    cancelled: threading.Event,
    throttled: Callable[[], float],
) -> EvalResult:
    evaluation = EvalDir(req.out_dir)
    started = time.monotonic()

    tally = evaluation.tally()

    def tick() -> None:
        if on_progress:
            tasks = _merge(evaluation.statuses() or [{}])["tasks"]
            on_progress(*tally.progress(len(tasks) * req.trials))

    status, note, code = _run_worker(zygote, req, timeout, cancelled, tick, throttled)
    state = status.get("state")
    candidate_error = status.get("message") if state == "candidate_error" else None
    if state == "importing" and note:
        candidate_error = f"agent/agent.py did not finish importing within {timeout:g} s"
    if state not in ("done", "candidate_error", "importing") and not note:
        note = f"the worker exited with code {code} before finishing; see {evaluation.log_file}"
    task_ids = status.get("tasks") or []
    if on_progress:
        on_progress(*tally.progress(len(task_ids) * req.trials))
    return eval_result(
        req,
        run_id,
        evaluation,
        task_ids,
        isolation=status.get("isolation") or {},
        candidate_error=candidate_error,
        note=note,
        duration=time.monotonic() - started,
    )


def open_local(*, ray_address: str = "", rate_limits: Optional[dict] = None) -> LocalBackend:
    """The local backend (evolver.kinds.BACKENDS), its rate limiter installed for this process's own calls too."""
    from evolver import ratelimit
    from evolver.ratelimit.lanes import Limiter

    limiter = Limiter(rate_limits)
    ratelimit.install(limiter)
    return LocalBackend(limiter=limiter)
