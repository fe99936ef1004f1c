"""A run killed at any moment, from its first second on, is resumed to the end an uninterrupted run
reaches: the same candidates, verdicts, charges and best tree. Through the command line: SIGKILL of
the `evolver run` process group, then `evolver run --resume`.

A tiny grid (tests/scripts/tiny_domain.py: 3 analysis and 6 gate tasks) and scripted LLMs: one iteration
of two candidates, a worse patch and the fix. The uninterrupted run goes on in the background while one
run is killed at each moment in turn, each kill landing in a later step than the last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SCRIPTED_MODELS, run_cli
from tests.test_loop import final_state, processes_in, tiny_target

ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:policy_script", "EVOLVER_TEST_PROPOSALS": "worse+exact"}
ARGS = ["--iterations", "1", "--candidates", "2", "--gate-stages", "1", "--proposer", "oneshot", *SCRIPTED_MODELS]


def _start(repo: Path, *args: str) -> subprocess.Popen:
    """`evolver run` in a process group of its own, so a kill takes every process it started."""
    return subprocess.Popen([sys.executable, "-m", "evolver", "run", str(repo), *args], env={**os.environ, **ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _run_folders(repo: Path) -> list[Path]:
    return sorted((repo / "runs").glob("run-*")) if (repo / "runs").is_dir() else []


def _evaluation(name: str, lines: int):
    """The moment an evaluation of the run has written ``lines`` simulations."""
    def reached(repo: Path) -> bool:
        return any(p.read_text().count("\n") >= lines for p in (repo / "runs").glob(f"run-*/evals/{name}/sims.jsonl"))
    return reached


def _exists(pattern: str):
    return lambda repo: bool(list((repo / "runs").glob(pattern))) if (repo / "runs").is_dir() else False


# Each moment is a step the run had not reached at the last kill, so every kill lands in a new place.
MOMENTS = [
    ("its first second", None),
    ("its folder appeared", _exists("run-*")),
    ("it chose its tasks", _exists("run-*/scan-identifiers.json")),  # (a new run lists them before its folder appears)
    ("it measures the baseline", _evaluation("analysis-g0", 1)),
    ("it proposes", _exists("run-*/iterations/001.json")),  # git adds the worktrees
    ("it gates the candidates", _evaluation("iter-001b-gate", 3)),
]


def _simulations(evaluation: Path) -> list[tuple[str, int]]:
    return [(r["task_id"], r["trial"]) for r in map(json.loads, (evaluation / "sims.jsonl").read_text().splitlines())]


@pytest.mark.slow
def test_a_run_killed_at_any_moment_resumes_to_where_an_uninterrupted_one_ends(tmp_path):
    reference_repo = tiny_target(tmp_path / "reference")
    reference = _start(reference_repo, *ARGS)
    repo = tiny_target(tmp_path / "killed")
    for moment, reached in MOMENTS:
        [run] = _run_folders(repo) or [None]
        controller = _start(repo, *(["--resume", run.name] if run else ARGS))
        started, deadline = time.monotonic(), time.monotonic() + 300
        while controller.poll() is None and time.monotonic() < deadline:
            if (time.monotonic() - started >= 1.0) if reached is None else reached(repo):
                break
            time.sleep(0.05)
        assert controller.poll() is None, f"the run ended before {moment}: {controller.stderr.read()[-2000:]}"
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
        while processes_in(repo) and time.monotonic() < deadline:  # the daemon stops the killed run's workers
            time.sleep(0.1)
        assert not processes_in(repo), f"workers outlived the run killed when {moment}"
        # What is left is no run, or one that `runs` and `status` show as resumable: never a folder without its record.
        folders = _run_folders(repo)
        assert len(folders) <= 1 and all((f / "run.json").is_file() and (f / "state.json").is_file() for f in folders), moment
        if moment == "its first second" and not folders:
            continue
        rows = json.loads(run_cli(["runs", "--repo", str(repo), "--json"]).stdout)
        assert [(r["run_id"], r["status"]) for r in rows] == [(folders[0].name, "dead")], moment
    [run] = _run_folders(repo)
    # A kill inside `git branch` or `git notes` leaves its lock file, and git then refuses that ref for good.
    git_dir = repo / ".git"
    left = [git_dir / "refs" / "heads" / "evolver" / run.name / "best.lock", git_dir / "refs" / "notes" / "commits.lock"]
    for lock in left:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text("0" * 40 + "\n")
    resumed = run_cli(["run", str(repo), "--resume", run.name], env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not any(lock.exists() for lock in left) and "removed refs/heads/evolver/" in resumed.stdout + resumed.stderr
    assert reference.wait(timeout=600) == 0, reference.stderr.read()[-3000:]
    [reference_run] = _run_folders(reference_repo)
    want, got = final_state(reference_repo, reference_run.name), final_state(repo, run.name)
    assert [(title, verdict) for title, verdict, _, _ in want["candidates"]] == [("worse", "rejected"), ("exact", "accepted")]
    assert got["candidates"] == want["candidates"] and got["branches"] == want["branches"]
    assert got["trees"] == want["trees"] and got["trees"]["best"] == got["trees"]["iter-001b"]
    assert got["usage"] == want["usage"] and got["decided"] == want["decided"] == [1]  # each simulation charged once
    for name in ("iter-001a-gate", "iter-001b-gate"):  # and none that had finished ran again
        keys = _simulations(run / "evals" / name)
        assert len(keys) == len(set(keys)) and sorted(keys) == sorted(_simulations(reference_run / "evals" / name)), name


def test_a_folder_cut_off_before_its_record_is_named_so(tmp_path):
    """An evolver before the record came first could leave runs/RUN/ holding only evals/."""
    repo = tmp_path
    (repo / "runs" / "run-20261120-101010-abcd" / "evals" / "tasks").mkdir(parents=True)
    said = "run-20261120-101010-abcd was cut off before it recorded its settings; start a new run"
    for command in (["run", str(repo), "--resume", "run-20261120-101010-abcd"], ["status", "run-20261120-101010-abcd", "--repo", str(repo)]):
        proc = run_cli(command)
        assert proc.returncode == 2 and proc.stderr.strip() == f"evolver: error: {said}", (command, proc.stderr)
    listed = run_cli(["runs", "--repo", str(repo), "--json"])
    assert json.loads(listed.stdout) == [{"run_id": "run-20261120-101010-abcd", "status": "cut off", "reason": said}]
    table = run_cli(["runs", "--repo", str(repo)])
    assert table.returncode == 0 and "cut off before it recorded its settings" in table.stdout
