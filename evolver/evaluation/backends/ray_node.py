"""The node side of the Ray backend (evolver.evaluation.backends.ray): what one Ray task runs on its node.

A Ray task receives the candidate's agent/ as a tar archive, unpacks it into a
temporary directory of its node and runs its group of simulations there with the
local backend: that node's zygote, trusted workers and sandboxed agent processes,
the same code and confinement as on one machine. It streams back each simulation's
record and trajectory the moment the worker writes them, then one closing item.
Nothing it leaves on the node is read by anyone: the driver alone writes the run
directory. This module does not import ray; the driver wraps its functions as Ray tasks.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Optional

from evolver.data import EvalRequest, SimRecord
from evolver.errors import UsageError
from evolver.evaluation import zygote_client
from evolver.evaluation.backends.local import LocalBackend
from evolver.store.evaldir import EvalDir

LOG_TAIL = 64 * 1024  # bytes of a group's worker.log sent back with its closing item
POLL = 0.1  # seconds between looks at the group's sims.jsonl


def pack_agent(checkout: Path) -> bytes:
    """The checkout's agent/ as a tar archive: folders, regular files, and links that stay inside
    agent/ (sent as links, as worker.stage_candidate copies them); __pycache__ is left out."""
    root = checkout / "agent"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(root, arcname="agent", recursive=False)
        for folder, subfolders, files in os.walk(root):  # links to folders are listed, never followed
            subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
            for name in [*subfolders, *sorted(files)]:
                path = Path(folder) / name
                arcname = str(path.relative_to(checkout))
                _check_packable(path, arcname)
                tar.add(path, arcname=arcname, recursive=False)
    return buffer.getvalue()


def _check_packable(path: Path, arcname: str) -> None:
    if path.is_symlink():
        target = os.path.normpath(os.path.join(os.path.dirname(arcname), os.readlink(path)))
        if os.path.isabs(target) or not target.startswith("agent" + os.sep):
            raise UsageError(f"{path} links outside agent/: a Ray node has nothing there; replace the link with the file")
    elif not (path.is_file() or path.is_dir()):
        raise UsageError(f"{path} is neither a file nor a folder: it cannot be sent to a Ray node")


def unpack_agent(archive: bytes, checkout: Path) -> None:
    checkout.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        # The "data" filter refuses absolute names, names and links that leave the folder, and devices:
        # the archive comes from the driver, but the names in it are the candidate's.
        tar.extractall(checkout, filter="data")


def run_group(job: dict, archive: bytes, environment: dict, limiter=None) -> Iterator[dict]:
    """Run one group (job: the sub-request, the records of its simulations already finished, the
    wall-clock limit and the configured rate limits) and yield {"record": line, "trajectory": text or None, "turns": bytes or None}
    per simulation as it ends, {"note": text} for the person running it, then {"end": {...}} (or
    {"usage_error": message}). ``limiter``: the cluster's rate limiter (a Ray actor), which the group's
    workers reach through a relay in this process. Cancelling the Ray task stops the group's workers."""
    _keep_zygote_warm()
    notes: list[str] = []
    relay = None
    if limiter is not None:
        from evolver.evaluation.backends.ray_limits import RemoteLimiter

        relay = RemoteLimiter(limiter, job.get("rate_limits"), say=notes.append)
    with tempfile.TemporaryDirectory(prefix="evolver-group-") as tmp:
        checkout, out = Path(tmp) / "checkout", Path(tmp) / "out"
        unpack_agent(archive, checkout)
        out.mkdir()
        # The worker skips what sims.jsonl already holds, exactly as when a local evaluation resumes.
        offset = EvalDir(out).start_sims([line.rstrip("\n") for line in job["done"]])
        req = EvalRequest.model_validate(job["request"]).model_copy(update={"checkout": str(checkout), "out_dir": str(out)})
        yield from _stream(req, job["timeout"], {**os.environ, **environment}, offset, relay, notes)


def list_tasks(request: dict, environment: dict) -> dict:
    """The task ids, splits and task-data identifiers a request selects, resolved by a worker on this node."""
    _keep_zygote_warm()
    with tempfile.TemporaryDirectory(prefix="evolver-list-") as tmp:
        req = EvalRequest.model_validate(request).model_copy(update={"checkout": tmp, "out_dir": str(Path(tmp) / "out")})
        with LocalBackend({**os.environ, **environment}) as backend:
            try:
                listing = backend.list_tasks(req)
            except UsageError as exc:
                return {"usage_error": str(exc)}
    return {"tasks": listing.tasks, "splits": listing.splits, "identifiers": listing.identifiers}


def _stream(req: EvalRequest, timeout: float, environment: dict, offset: int, limiter=None, notes: Optional[list] = None) -> Iterator[dict]:
    """The local evaluation runs in a thread; this generator, in the Ray task's own thread, forwards
    what it writes (and ``notes`` as they come). A cancel arrives here (as an exception at a yield or a
    wait) and stops it."""
    backend = LocalBackend(environment, limiter)
    notes = [] if notes is None else notes
    outcome: dict = {}

    def evaluate() -> None:
        try:
            outcome["result"] = backend.evaluate(req, "ray-group", timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - handed to the generator, which reports or re-raises it
            outcome["error"] = exc

    runner = threading.Thread(target=evaluate, name="group", daemon=True)
    runner.start()
    evaluation = EvalDir(req.out_dir)
    tail = evaluation.tail(offset)
    try:
        while runner.is_alive():
            runner.join(POLL)
            yield from _finished(evaluation, tail.read())
            while notes:
                yield {"note": notes.pop(0)}
        yield from _finished(evaluation, tail.read())
        while notes:
            yield {"note": notes.pop(0)}
        yield _closing(outcome, evaluation)
    finally:
        backend.cancel()  # a no-op once the evaluation ended; otherwise its workers are stopped
        runner.join()
        backend.close()


def _finished(evaluation: EvalDir, lines: list[str]) -> Iterator[dict]:
    """The group's newly finished simulations, each line with its trajectory and turn view (written before its line)."""
    for line in lines:
        record = SimRecord.model_validate_json(line)
        yield {"record": line, "trajectory": evaluation.read_trajectory(record), "turns": evaluation.read_turns_file(record)}


def _closing(outcome: dict, evaluation: EvalDir) -> dict:
    error = outcome.get("error")
    if isinstance(error, UsageError):
        return {"usage_error": str(error)}
    if error is not None:
        raise error  # the driver counts the group as failed and sends its unfinished simulations again
    result = outcome["result"]
    statuses = evaluation.statuses()
    return {
        "end": {
            "candidate_error": result.candidate_error,
            "worker_note": result.worker_note,
            "isolation": result.isolation,
            "running_at": min((s["running_at"] for s in statuses if "running_at" in s), default=None),
            "done_at": max((s["done_at"] for s in statuses if "done_at" in s), default=None),
            "out_dir": str(evaluation.path),
            "log": evaluation.log_tail(LOG_TAIL),
        }
    }


_warm: Optional[zygote_client.Connection] = None


def _keep_zygote_warm() -> None:
    """Hold one connection to this node's zygote for the life of this Ray worker process, so that it
    stays warm between groups. Where evolver started the Ray instance it runs with
    EVOLVER_ZYGOTE_IDLE=0, so it then exits with the last Ray worker that used it."""
    global _warm
    if _warm is not None:
        try:
            _warm.receive(0)  # raises once that zygote has gone
        except (RuntimeError, OSError):
            _warm = None
    if _warm is None:
        _warm = zygote_client.connect()
