"""What a run tells while it runs and after: cost per role (unknown prices shown as unknown),
`evolver status` and `evolver runs` read from the run's files, and a run whose output goes to a
file says something at every phase and at least every --log-interval seconds."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evolver.data import RoleUsage, SimRecord, cost_text
from evolver.store.evaldir import SimsTally
from tests.conftest import LINEAGE, SCRIPTED_MODELS, run_cli
from tests.test_loop import make_target

ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:policy_script", "EVOLVER_TEST_PROPOSALS": "exact"}
QUICK = ["--iterations", "1", "--gate-stages", "1", "--no-holdout", "--concurrency", "4", *LINEAGE, *SCRIPTED_MODELS]


def test_cost_per_role_says_unknown_for_unpriced_tokens_never_zero():
    priced = RoleUsage(prompt_tokens=1000, completion_tokens=100, cost=0.0125)
    unpriced = RoleUsage(prompt_tokens=5000, completion_tokens=700, cost=0.0)  # a local model: tokens, no price
    idle = RoleUsage()
    assert priced.priced and not unpriced.priced and idle.priced
    assert cost_text([priced]) == "$0.0125"
    assert cost_text([unpriced]) == "unknown"
    assert cost_text([priced, unpriced]) == "$0.0125 + unknown"
    assert cost_text([priced, idle, priced.add(priced)]) == "$0.0375"
    assert cost_text([]) == "$0.0000"


def _start(repo, extra_env: dict, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "evolver", "run", str(repo), *QUICK],
        env={**os.environ, **ENV, **extra_env},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def _lock_holder(repo: Path) -> int | None:
    for lock in (repo / "runs").glob("run-*/lock"):
        words = lock.read_text().split()
        if words[:1] == ["pid"] and len(words) == 2:
            return int(words[1])
    return None


def _kept_waiting(path: str) -> float:
    """Seconds the thread ``path`` (/proc/PID/task/TID) has spent runnable but waiting for a CPU (schedstat)."""
    return int(Path(path, "schedstat").read_text().split()[1]) / 1e9


@pytest.mark.slow
def test_output_to_a_file_has_a_line_at_every_phase_and_at_least_every_interval(tmp_path):
    # The tiny grid (3 analysis, 6 gate tasks): every phase, and still seconds of each at this latency.
    repo = make_target(tmp_path / "target", "evolver_tiny", "tests.scripts.tiny_domain")
    proc = _start(repo, {"EVOLVER_LOG_INTERVAL": "1", "EVOLVER_SCRIPTED_LATENCY": "0.2", "EVOLVER_BUDGET_TOKENS": "90000000"})
    # Each line's arrival, and the time a busy machine had kept waiting until then the run's main thread (which the
    # line-writing thread needs, for the GIL) and this reader: a delay the run did not choose is not held against it.
    # The driver is the process the run's lock names: the command's own, or a fork of the warm daemon it was handed to.
    reader, driver, since = f"/proc/self/task/{threading.get_native_id()}", None, 0.0
    arrivals, waited = [], 0.0
    for line in proc.stderr:
        if driver is None and (holder := _lock_holder(repo)):
            driver = f"/proc/{holder}/task/{holder}"
            with contextlib.suppress(OSError):
                since = _kept_waiting(driver)
        with contextlib.suppress(OSError):  # the run has just ended: nothing more kept it waiting
            waited = _kept_waiting(reader) + (_kept_waiting(driver) - since if driver else 0.0)
        arrivals.append((time.monotonic() - waited, line.rstrip()))
    assert driver is not None and int(driver.split("/")[2]) != os.getpid()
    assert proc.wait(timeout=60) == 0, "\n".join(text for _, text in arrivals[-20:])
    texts = [text for _, text in arrivals]
    # (the default policy screens the candidate before its one configured stage: two stages in all)
    for phase in (
        "measuring the baseline",
        "iteration 1: proposing 1 candidate",
        "iteration 1: smoke test",
        "iteration 1: gate stage 1/2",
        "iteration 1: gate stage 2/2",
        "audit: iteration 1, the run's best, against the base",
    ):
        assert any(phase in t for t in texts), phase
    started = next(i for i, t in enumerate(texts) if "measuring the baseline" in t)
    times = [at for at, _ in arrivals[started:]]
    assert times[-1] - times[0] > 8  # long enough for the interval to matter
    assert max(b - a for a, b in zip(times, times[1:])) <= 3.0  # 1 s interval, checked every second
    assert any("simulations done" in t for t in texts)  # lines said because time passed, not because a phase changed
    # Such a line names each evaluation in flight, how far it is and its mean reward so far,
    # and, once something was spent, the tokens per role against the run's budget.
    assert any(re.search(r"iter-001-\w+ \d+/\d+  mean reward \d\.\d\d", t) for t in texts), texts
    assert any(re.search(r"agent [\d,]+ tok .*, [\d,]+ of 90,000,000 tokens budget", t) for t in texts), texts


def test_progress_reads_only_new_lines_counts_a_retried_simulation_once_and_leaves_infra_errors_out_of_the_mean(tmp_path):
    path = tmp_path / "sims.jsonl"
    tally = SimsTally(path)
    assert tally.read() == (0, None)  # no file yet

    def line(task, trial, outcome, reward):
        return SimRecord(task_id=task, trial=trial, outcome=outcome, reward=reward).model_dump_json() + "\n"

    path.write_text(line("a", 0, "ok", 1.0) + line("b", 0, "infra_error", None))
    assert tally.read() == (2, 1.0)
    with open(path, "a") as fh:  # b's retry succeeds; c's line is still being written
        fh.write(line("b", 0, "ok", 0.0) + line("c", 0, "ok", 1.0)[:20])
    assert tally.read() == (2, 0.5)
    with open(path, "a") as fh:
        fh.write(line("c", 0, "ok", 1.0)[20:])
    done, mean = tally.read()
    assert (done, round(mean, 4)) == (3, 0.6667)


@pytest.mark.slow
def test_status_advances_while_a_run_runs_and_says_dead_after_a_kill(tmp_path):
    repo = make_target(tmp_path / "target")
    log = (tmp_path / "run.log").open("w")  # a pipe nobody reads would stall the run once full
    proc = _start(repo, {"EVOLVER_SCRIPTED_LATENCY": "0.2"}, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((repo / "runs").glob("run-*/evals/*/sims.jsonl")):
        time.sleep(0.2)
    run_id = next((repo / "runs").glob("run-*")).name

    def status() -> dict:
        return json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)

    first = status()
    time.sleep(2)
    second = status()
    assert first["status"] == second["status"] == "running" and second["step"]
    assert second["elapsed_seconds"] >= first["elapsed_seconds"] + 1.5  # the clock moves while the driver works
    assert 0 < second["simulations_done"] <= second["simulations_planned_at_most"]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log.close()
    dead = status()
    assert dead["status"] == "dead" and dead["step"] is None and dead["eta_seconds_at_most"] is None
    shown = run_cli(["status", run_id, "--repo", str(repo)]).stdout
    assert "dead" in shown and "None" not in shown and "{" not in shown
    assert "scripted/agent" in shown and "simulations" in shown
    [listed] = json.loads(run_cli(["runs", "--repo", str(repo), "--json"]).stdout)
    assert listed["run_id"] == run_id and listed["status"] == "dead"
