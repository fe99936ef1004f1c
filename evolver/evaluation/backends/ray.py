"""The Ray backend: simulations as Ray tasks, on a Ray cluster or on a local Ray instance.

The driver (this process, the trusted controller) resolves the request's tasks,
cuts the grid into groups of tasks, every trial of a task in the same group (tau2
draws each trial's seed from the request's seed, so a group gets the seeds it would
get on one machine), and sends each group to a Ray task together with the
candidate's agent/ as a tar archive: no filesystem is shared. On its node the group
runs under evolver.evaluation.backends.ray_node, with that node's zygote and sandbox, and
streams back each simulation's record and trajectory as it ends. Only the driver
writes the run directory, so the result, resuming and progress are those of the
local backend.

A group whose Ray worker or node is lost is sent again for its unfinished
simulations. cancel() and Ctrl-C cancel the Ray tasks, which stop their workers.
Provider keys travel as a task argument, never in Ray's runtime_env: Ray writes a
runtime_env's variables, values included, into every node's runtime_env_agent.log.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from evolver import ratelimit
from evolver.data import EvalRequest, EvalResult, SimRecord
from evolver.errors import UsageError
from evolver.evaluation.backends import Cancelled, Progress, TaskListing, ray_limits, ray_node, ray_start
from evolver.evaluation.backends.local import WORKER_PROCESSES
from evolver.evaluation.backends.results import eval_result  # the result is built as the local backend builds it
from evolver.store.evaldir import EvalDir

# Simulations one Ray task runs at once: the request's concurrency is shared out in groups of about
# this size, one Ray task per group, all at once, but no more groups than the cluster has CPUs for
# their worker processes (each group starts the local backend's two): every worker pays a start
# (the candidate staged and imported, tau2 set up): on this 2-core machine, 32 simulations at
# concurrency 16 in four groups ran at 0.30x the local backend, in one group at 1.11x.
GROUP_CONCURRENCY = 4
# What a group asks of Ray: a CPU per this many simulations at once. An API-bound simulation mostly
# waits (the local backend drives 16 at once on 2 cores at 0.9x tau2's own speed), so several
# evaluations (the candidates of an iteration) share a node, as they share this machine locally.
SIMULATIONS_PER_CPU = 16
ATTEMPTS = 3  # Ray tasks per group before its unfinished simulations count as infrastructure errors
CANCEL_GRACE = 10.0  # seconds a cancelled group has to stop its workers before its Ray worker is killed
REPORT_GRACE = 30.0  # seconds past the wall-clock limit for groups to report having stopped at it
WAIT = 0.2  # seconds between the driver's looks at cancel and the clock

# The driver's variables that describe its own machine or session rather than the evaluation:
# on a node, the node's own values stand. Everything else (provider keys and endpoints, EVOLVER_*
# settings, PYTHONPATH) reaches the node's workers, as the local backend's workers get it.
MACHINE_LOCAL = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "HOSTNAME",
    "TERM",
    "TMPDIR",
    "TEMP",
    "TMP",
    "DISPLAY",
    "MAIL",
    "VIRTUAL_ENV",
    "PYTHONHOME",
    "PYTHONEXECUTABLE",
    "_",
    "EVOLVER_RUNTIME_DIR",
    "EVOLVER_ZYGOTE_IDLE",
    "EVOLVER_ZYGOTE_FD",
}
MACHINE_LOCAL_PREFIXES = ("LD_", "XDG_", "SSH_", "DBUS_", "RAY_", "CONDA_", "LC_")


def worker_environment(environ: dict) -> dict:
    return {k: v for k, v in environ.items() if k not in MACHINE_LOCAL and not k.startswith(MACHINE_LOCAL_PREFIXES)}


def plan(tasks: list[str], concurrency: int, cpus: int) -> tuple[list[list[str]], list[int]]:
    """(groups of tasks, the concurrency of each): together they run the request's concurrency.
    Tasks are dealt in turn, so long and short ones mix in every group."""
    n = max(1, min(len(tasks), -(-concurrency // GROUP_CONCURRENCY), cpus // WORKER_PROCESSES))
    return [tasks[i::n] for i in range(n)], [concurrency // n + (i < concurrency % n) for i in range(n)]


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UsageError("the ray backend needs the ray package: pip install 'evolver[ray]'") from None
    return ray


class RayBackend:
    """Evaluations as Ray tasks. With no address it starts a local Ray instance (this machine's CPUs,
    no dashboard) and stops it in close(); "auto" or an address joins a running cluster, whose
    nodes need evolver installed as on this machine. Thread-safe, like every backend."""

    name = "ray"

    def __init__(self, address: str = "", rate_limits: Optional[dict] = None) -> None:
        self.ray = _import_ray()
        # Where evolver starts the instance, it and its zygotes live in one private folder, removed in close().
        self.root = Path(tempfile.mkdtemp(prefix="evolver-ray-")) if not address else None
        self.lock = threading.Lock()
        self.running: set[threading.Event] = set()  # one per evaluation in flight: what cancel() stops
        self.listings: dict[tuple, TaskListing] = {}
        self.closed = False
        try:
            ray_start.start(self.ray, address, self.root)
        except BaseException:  # a refused address, or Ctrl-C while Ray starts
            self.ray.shutdown()
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
            raise
        self.environment = self.ray.put(worker_environment(dict(os.environ)))
        self.run_group = self.ray.remote(num_returns="streaming", max_retries=0)(ray_node.run_group)
        self.list_remote = self.ray.remote(max_retries=ATTEMPTS - 1)(ray_node.list_tasks)
        self.rate_limits, self.said = dict(rate_limits or {}), set()
        self.actor = None if ratelimit.switched_off() else _limiter_actor(self.ray, self.rate_limits)
        self.own_limiter = None
        if self.actor is not None:  # this process's own calls (the meta-LLM) take their turn in the cluster's limit too
            self.own_limiter = ray_limits.RemoteLimiter(self.actor, self.rate_limits, say=self.say)
            self.previous_limiter = ratelimit.install(self.own_limiter)

    def throttled(self) -> float:
        """Seconds during which some call in the cluster waited for the rate limit (0 without its limiter)."""
        if self.actor is None:
            return 0.0
        try:
            return self.ray.get(self.actor.throttled.remote(), timeout=5)
        except (self.ray.exceptions.RayError, self.ray.exceptions.GetTimeoutError):
            return 0.0

    def say(self, text: str) -> None:
        """A word for the person running the command, once (e.g. that the cluster's rate limiter was lost)."""
        with self.lock:
            if text in self.said:
                return
            self.said.add(text)
        print(f"evolver: note: {text}", file=sys.stderr, flush=True)

    def evaluate(self, req: EvalRequest, run_id: str, *, timeout: float, on_progress: Optional[Progress] = None) -> EvalResult:
        """Evaluate; simulations already recorded in req.out_dir are kept, not run again."""
        started = time.monotonic()
        # Given ids need no listing (the loop always gives them): the groups' workers check them.
        tasks = list(req.task_ids)[: req.num_tasks or None] if req.task_ids else self.list_tasks(req).tasks
        stop = threading.Event()
        with self.lock:
            self.running.add(stop)
        try:
            evaluation = _Evaluation(self, req, tasks, stop, on_progress)
            evaluation.run(timeout, deadline=started + timeout + REPORT_GRACE)
        finally:
            with self.lock:
                self.running.discard(stop)
        return evaluation.result(run_id, time.monotonic() - started)

    def list_tasks(self, req: EvalRequest) -> TaskListing:
        """Resolved by a worker on a node (where the plugins are), once per selection."""
        key = (req.domain, req.split, tuple(req.task_ids or ()), req.num_tasks, tuple(req.plugins))
        with self.lock:
            if key in self.listings:
                return self.listings[key]
        found = self.ray.get(self.list_remote.remote(req.model_dump(mode="json"), self.environment))
        if "usage_error" in found:
            raise UsageError(found["usage_error"])
        listing = TaskListing(**found)
        with self.lock:
            self.listings[key] = listing
        return listing

    def cancel(self) -> None:
        with self.lock:
            for stop in self.running:
                stop.set()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.cancel()
        if self.own_limiter is not None:  # its actor dies with the cluster: later calls of this process must not ask it
            ratelimit.install(self.previous_limiter)
        self.ray.shutdown()
        if self.root is not None:
            ray_start.await_zygotes(self.root / "zygote")
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "RayBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _limiter_actor(ray, rate_limits: dict):
    """The cluster's one rate limiter (ray_limits.LimiterActor), on the driver's node where Ray can: its node
    is then lost only with the driver. It asks for no CPU; its calls never block."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
    return ray.remote(num_cpus=0, max_restarts=0)(ray_limits.LimiterActor).options(scheduling_strategy=here).remote(rate_limits)


@dataclass
class _Group:
    tasks: list[str]
    concurrency: int
    attempts: int = 0


class _Evaluation:
    """One evaluation on the driver: sends its groups out as Ray tasks, writes what streams back."""

    def __init__(self, backend: RayBackend, req: EvalRequest, tasks: list[str], stop: threading.Event, on_progress: Optional[Progress]):
        self.ray, self.backend, self.req, self.tasks, self.stop, self.on_progress = backend.ray, backend, req, tasks, stop, on_progress
        self.evaluation = EvalDir(req.out_dir)
        self.total = len(tasks) * req.trials
        self.ends: list[dict] = []  # the closing items of the groups
        self.notes: list[str] = []  # why simulations are missing, for the result's worker_note
        self.inflight: dict = {}  # Ray generator -> its group

    def run(self, timeout: float, deadline: float) -> None:
        self._prepare()
        self.timeout = timeout  # each group's own limit, as the local backend's; the driver's deadline adds a grace
        self.archive = self.ray.put(ray_node.pack_agent(Path(self.req.checkout)))
        throttled = self.backend.throttled()
        try:
            cpus = int(self.ray.cluster_resources().get("CPU", 1))
            for tasks, concurrency in zip(*plan(self.tasks, self.req.concurrency, cpus)):
                if self._unfinished(tasks):
                    self._dispatch(_Group(tasks, concurrency))
            while self.inflight:
                if self.stop.is_set():
                    raise Cancelled("the evaluation was cancelled")
                if (
                    time.monotonic() > deadline and time.monotonic() > deadline + self.backend.throttled() - throttled
                ):  # waits for the rate limit not counted
                    self.notes.append(f"the worker was stopped at the wall-clock limit of {timeout:g} s")
                    break
                ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=WAIT)
                for gen in ready:
                    self._take(gen)
                self._progress()
        finally:
            self._cancel_inflight()
        self._write_status()

    def _prepare(self) -> None:
        self.evaluation.begin(self.req)  # a resumed evaluation must not read the last one's verdict
        self.evaluation.make_trajectories_dir()
        self.tally = self.evaluation.tally()
        # Resume: simulations already scored are not run again; infrastructure errors are.
        self.done = self.evaluation.measured()

    def _unfinished(self, tasks: list[str]) -> bool:
        return any((t, trial) not in self.done for t in tasks for trial in range(self.req.trials))

    def _dispatch(self, group: _Group) -> None:
        group.attempts += 1
        sub = self.req.model_copy(update={"task_ids": group.tasks, "num_tasks": None, "concurrency": group.concurrency})
        done = [
            self.done[(t, trial)].model_dump_json() + "\n"
            for t in group.tasks
            for trial in range(self.req.trials)
            if (t, trial) in self.done
        ]
        job = {"request": sub.model_dump(mode="json"), "done": done, "timeout": self.timeout}
        job["rate_limits"] = self.backend.rate_limits  # a node's share of them, should the cluster's limiter be lost
        task = self.backend.run_group.options(num_cpus=min(1.0, group.concurrency / SIMULATIONS_PER_CPU), scheduling_strategy="SPREAD")
        self.inflight[task.remote(job, self.archive, self.backend.environment, self.backend.actor)] = group

    def _take(self, gen) -> None:
        """The next item of a group: a finished simulation, its closing item, or its end or failure."""
        group = self.inflight[gen]
        try:
            item = self.ray.get(next(gen))
        except StopIteration:
            del self.inflight[gen]
            return
        except self.ray.exceptions.RayError as exc:  # its Ray worker or node was lost, or its code failed
            del self.inflight[gen]
            self._lost(group, exc)
            return
        if "record" in item:
            self._write(item, group)
        elif "note" in item:
            self._log(item["note"] + "\n")
            self.backend.say(item["note"])
        elif "usage_error" in item:
            raise UsageError(item["usage_error"])
        else:
            self._end(item["end"])

    def _lost(self, group: _Group, exc: Exception) -> None:
        if not self._unfinished(group.tasks):
            return
        reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}"
        self._log(f"a Ray task of tasks {', '.join(group.tasks)} ended early (attempt {group.attempts} of {ATTEMPTS}): {reason}\n{exc}\n")
        if group.attempts < ATTEMPTS:
            self._dispatch(group)  # its finished simulations stay; the others run again
        else:
            self.notes.append(
                f"a Ray task failed {ATTEMPTS} times for task(s) {', '.join(group.tasks)} ({reason}); see {self.evaluation.log_file}"
            )

    def _write(self, item: dict, group: _Group) -> None:
        record = SimRecord.model_validate_json(item["record"])
        if record.task_id not in group.tasks or not 0 <= record.trial < self.req.trials:
            return  # not this group's simulation: nothing of the kind may land in the run directory
        if item["trajectory"] is not None and record.trajectory_file:
            self.evaluation.write_trajectory(record, item["trajectory"])
        if item.get("turns") is not None and record.turns_file:
            self.evaluation.write_turns(record, item["turns"])
        self.evaluation.append_sim(item["record"])  # the line as the node's worker wrote it
        if record.outcome != "infra_error":
            self.done[(record.task_id, record.trial)] = record

    def _end(self, end: dict) -> None:
        self.ends.append(end)
        if end["log"]:
            self._log(end["log"])

    def _cancel_inflight(self) -> None:
        """Cancel the groups still running and wait for them to stop their workers; kill what does not."""
        if not self.inflight:
            return
        for gen in self.inflight:
            self.ray.cancel(gen)
        deadline = time.monotonic() + CANCEL_GRACE
        stubborn = [gen for gen in self.inflight if not self._drain(gen, deadline)]
        for gen in stubborn:
            self.ray.cancel(gen, force=True)  # its Ray worker dies; the zygote then stops that worker's processes
        self.inflight.clear()

    def _drain(self, gen, deadline: float) -> bool:
        while True:
            ready, _ = self.ray.wait([gen], num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            try:
                self.ray.get(next(gen))
            except (StopIteration, self.ray.exceptions.RayError):
                return True

    def _progress(self) -> None:
        if self.on_progress:
            self.on_progress(*self.tally.progress(self.total))

    def _log(self, text: str) -> None:
        self.evaluation.append_log(text)

    def _write_status(self) -> None:
        """The evaluation's status, in the local backend's place and shape (benchmarks read its times)."""
        running = [e["running_at"] for e in self.ends if e["running_at"]]
        status = {
            "state": "candidate_error" if self._candidate_error() else "done",
            "tasks": self.tasks,
            "isolation": self._isolation(),
            "running_at": min(running, default=None),
            "done_at": max((e["done_at"] for e in self.ends if e["done_at"]), default=None),
        }
        self.evaluation.write_status(0, **status)

    def _candidate_error(self) -> Optional[str]:
        return next((e["candidate_error"] for e in self.ends if e["candidate_error"]), None)

    def _isolation(self) -> dict:
        return next((e["isolation"] for e in self.ends if e["isolation"]), {})

    def result(self, run_id: str, duration: float) -> EvalResult:
        req, candidate_error = self.req, self._candidate_error()
        notes = self.notes + [e["worker_note"].replace(e["out_dir"], str(self.evaluation.path)) for e in self.ends if e["worker_note"]]
        note = "; ".join(dict.fromkeys(notes)) or None
        self._progress()
        return eval_result(
            req,
            run_id,
            self.evaluation,
            self.tasks,
            isolation=self._isolation(),
            candidate_error=candidate_error,
            note=note,
            duration=duration,
        )


def open_ray(*, ray_address: str = "", rate_limits: Optional[dict] = None) -> RayBackend:
    """The Ray backend (evolver.kinds.BACKENDS): the cluster at ``ray_address``, or a local Ray instance it starts."""
    return RayBackend(ray_address, rate_limits)
