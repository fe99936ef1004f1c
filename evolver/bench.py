"""Evaluate a checkout on tau2 through a worker subprocess (the controller side).

The controller never imports the candidate's code: it writes request.json,
starts `python -m evolver.worker`, watches sims.jsonl for progress, enforces
the wall-clock limit, and turns what the worker left on disk into an EvalResult.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from evolver.data import EvalRequest, EvalResult, SimRecord, read_sim_records, write_json_atomic
from evolver.errors import UsageError
from evolver.metrics import summarize

Progress = Callable[[int, int], None]  # (finished simulations, total simulations)


def check_api_base(url: str) -> None:
    """Fail fast, in one line, when an OpenAI-compatible server is not there."""
    try:
        urllib.request.urlopen(url.rstrip("/") + "/models", timeout=5)
    except urllib.error.HTTPError:
        return  # it answered: reachable (it may want a key for /models)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"cannot reach the API base {url} ({reason}); start the server or fix --api-base") from None


def _read_status(out: Path) -> dict:
    try:
        return json.loads((out / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _stop(proc: subprocess.Popen) -> None:
    """Stop the worker and everything it started (it leads its own process group)."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _run_worker(req: EvalRequest, timeout: float, on_tick: Optional[Callable[[], None]] = None) -> tuple[dict, Optional[str], int]:
    """Run one worker to the end or the time limit. Returns (status.json, why it was stopped, exit code)."""
    out = Path(req.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "request.json", req)
    (out / "status.json").unlink(missing_ok=True)  # a resumed evaluation must not read the last worker's verdict
    started = time.monotonic()
    note = None
    with open(out / "worker.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "evolver.worker", str(out / "request.json")],
            cwd=req.checkout, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while proc.poll() is None:
                if time.monotonic() - started > timeout:
                    note = f"the worker was stopped at the wall-clock limit of {timeout:g} s"
                    _stop(proc)
                    break
                if on_tick:
                    on_tick()
                time.sleep(0.2)
        except BaseException:  # Ctrl-C or the controller dying: leave no worker behind
            _stop(proc)
            raise
    status = _read_status(out)
    if status.get("state") == "usage_error":
        raise UsageError(status["message"])
    return status, note, proc.returncode


def list_tasks(req: EvalRequest, timeout: float = 600) -> tuple[list[str], dict[str, list[str]]]:
    """The task ids a request selects, and the domain's splits (resolved by tau2 in a worker)."""
    status, note, code = _run_worker(req.model_copy(update={"list_only": True}), timeout)
    if status.get("state") != "listed":
        raise RuntimeError(note or f"listing tasks failed (worker exit code {code}); see {Path(req.out_dir) / 'worker.log'}")
    return status["tasks"], status.get("splits") or {}


def evaluate(
    req: EvalRequest,
    run_id: str,
    *,
    timeout: float,
    on_progress: Optional[Progress] = None,
) -> EvalResult:
    """Evaluate; simulations already on disk in req.out_dir are kept, not run again."""
    out = Path(req.out_dir)
    started = time.monotonic()

    def tick() -> None:
        if on_progress:
            on_progress(_count_lines(out / "sims.jsonl"), len(_read_status(out).get("tasks") or []) * req.trials)

    status, note, code = _run_worker(req, timeout, tick)
    state = status.get("state")
    candidate_error = status.get("message") if state == "candidate_error" else None
    if state == "importing" and note:
        candidate_error = f"agent/agent.py did not finish importing within {timeout:g} s"
    if state not in ("done", "candidate_error", "importing") and not note:
        note = f"the worker exited with code {code} before finishing; see {out / 'worker.log'}"
    task_ids = status.get("tasks") or []
    records = _complete(read_sim_records(out / "sims.jsonl"), task_ids, req.trials, candidate_error, note)
    if on_progress:
        on_progress(len(records), len(task_ids) * req.trials)
    return EvalResult(
        run_id=run_id, checkout=req.checkout, domain=req.domain, split=req.split,
        task_ids=task_ids, trials=req.trials, seed=req.seed, max_steps=req.max_steps,
        models={"agent": req.agent, "user": req.user, "judge": req.judge},
        harness=_harness_switches(Path(req.checkout)),
        candidate_error=candidate_error, worker_note=note,
        summary=summarize(records, len(task_ids), req.trials, time.monotonic() - started),
        simulations=records,
    )


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def _complete(records, task_ids, trials, candidate_error, note) -> list[SimRecord]:
    """One record per task x trial: the worker's, or a stand-in saying why it is missing."""
    have = {(r.task_id, r.trial): r for r in records}
    full = []
    for trial in range(trials):
        for task in task_ids:
            rec = have.get((task, trial))
            if rec is None and candidate_error:
                rec = SimRecord(task_id=task, trial=trial, outcome="failed", reward=0.0, termination_reason="agent_error", error=candidate_error)
            elif rec is None:
                rec = SimRecord(task_id=task, trial=trial, outcome="infra_error", termination_reason="infra_error", error=note or "not run")
            full.append(rec)
    return full


def _harness_switches(checkout: Path) -> dict:
    """Which harness layers were on (agent/harness.toml), so every score says so."""
    import tomllib

    path = checkout / "agent" / "harness.toml"
    try:
        return tomllib.loads(path.read_text()) if path.exists() else {}
    except tomllib.TOMLDecodeError:
        return {"error": "agent/harness.toml is not valid TOML"}
