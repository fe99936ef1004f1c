"""A run killed at any moment, from its first second on, is resumed to the end an uninterrupted run
reaches: the same candidates, verdicts, charges and best tree. Through the command line: SIGKILL of
the `evolver run` process group, then `evolver run --resume`.

A tiny grid (tests/scripts/tiny_domain.py: 3 analysis and 6 gate tasks) and scripted LLMs: one iteration
of the default search, the population, with two candidates, a worse patch and the fix: the worse one is
screened out, the fix runs the gate's two parts, joins the pool and is audited. The uninterrupted run goes on in
the background while one run is killed at each moment in turn. Each kill is checked to have landed in a later
step than the last (by what the run had recorded when it died), and no resume may run a simulation again that had
finished before a kill: its line in sims.jsonl must be the one written then, never a second or a rewritten one.
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


def _start(repo: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`evolver run` in a process group of its own, so a kill takes every process it started."""
    return subprocess.Popen(
        [sys.executable, "-m", "evolver", "run", str(repo), *args],
        env={**os.environ, **ENV, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _run_folders(repo: Path) -> list[Path]:
    return sorted((repo / "runs").glob("run-*")) if (repo / "runs").is_dir() else []


def _evaluation(name: str, lines: int):
    """The moment an evaluation of the run has written ``lines`` simulations."""

    def reached(repo: Path) -> bool:
        return any(p.read_text().count("\n") >= lines for p in (repo / "runs").glob(f"run-*/evals/{name}/sims.jsonl"))

    return reached


def _committed(repo: Path) -> int:
    """How many of the run's candidates were answered and committed (their iteration records' commits)."""
    records = [json.loads(p.read_text()) for f in _run_folders(repo) for p in f.glob("iterations/*.json")]
    return sum(bool(c.get("commit")) for record in records for c in record["candidates"])


def _chose(repo: Path) -> bool:
    """The run recorded its split (run.json's gate tasks): listing the tasks and keeping the scan's identifiers come before."""
    return any(json.loads((f / "run.json").read_text()).get("gate_tasks") for f in _run_folders(repo) if (f / "run.json").is_file())


# Each moment is a step the run had not reached at the last kill, so every kill lands in a new place. Four are held
# there, being a few milliseconds long: the new run's preflight, before its folder (EVOLVER_SCRIPTED_HOLD: its first
# model call waits), its first ref update, after its folder and before its split (a git hook that waits), its split,
# before the baseline's first simulation ends (its simulations' model calls wait, the resumed preflight passes), and
# its parent's minibatch, before a proposal is answered (the meta model's calls wait).
MOMENTS = [  # (moment, what holds the run there, whether it reached it)
    ("it checks its models, before its folder", "model", lambda repo, hold: any((hold / "model").glob("call-*"))),
    ("its folder appeared, before its split", "ref", lambda repo, hold: (hold / "ref" / "waiting").exists()),
    ("it chose its tasks", "simulation", lambda repo, hold: _chose(repo) and any((hold / "simulation").glob("call-*"))),
    ("it measures the baseline", None, lambda repo, hold: _evaluation("analysis-g0", 1)(repo)),
    (
        "its parent runs a minibatch",
        "meta",
        lambda repo, hold: _evaluation("analysis-001-d0", 1)(repo) and any((hold / "meta").glob("call-*")),
    ),  # git adds its worktree
    ("it proposes", None, lambda repo, hold: _committed(repo) > 0),
    ("it screens the candidates", None, lambda repo, hold: _evaluation("iter-001b-screen", 1)(repo)),
    ("it gates the fix", None, lambda repo, hold: _evaluation("iter-001b-gate2", 1)(repo)),
    ("it audits the pool's best", None, lambda repo, hold: _evaluation("audit-001b-best", 1)(repo)),
]
HOOK = """#!/bin/sh
# the test holds the run in its ref update while {folder}/held is there
while [ -e '{folder}/held' ]; do touch '{folder}/waiting'; sleep 0.05; done
"""


def _hold(kind: str, repo: Path, hold: Path) -> dict:
    """Hold the run at a moment too short to catch (MOMENTS): the environment its controller needs for it."""
    (hold / kind).mkdir()
    (hold / kind / "held").write_text({"simulation": "simulations", "meta": "meta"}.get(kind, ""))
    if kind in ("model", "simulation", "meta"):
        return {"EVOLVER_SCRIPTED_HOLD": str(hold / kind)}
    hook = repo / ".git" / "hooks" / "reference-transaction"
    hook.write_text(HOOK.format(folder=hold / kind))
    hook.chmod(0o755)
    return {}


def _release(kind: str, repo: Path, hold: Path) -> None:
    (hold / kind / "held").unlink()
    (repo / ".git" / "hooks" / "reference-transaction").unlink(missing_ok=True)


def _lines(repo: Path) -> dict[str, list[str]]:
    """Every evaluation's simulations that finished, as sims.jsonl holds them: scored or failed by the candidate (an
    infrastructure error, a worker killed with its run among them, is run again by design)."""
    return {
        p.parent.name: [line for line in p.read_text().splitlines() if json.loads(line)["outcome"] != "infra_error"]
        for p in sorted((repo / "runs").glob("run-*/evals/*/sims.jsonl"))
    }


def _progress(repo: Path) -> tuple:
    """How far a killed run had got, by what it recorded: its folder, its split, its iteration records, its committed
    candidates, its finished simulations. A kill that lands in a new step leaves more of it than the kill before."""
    folders = _run_folders(repo)
    if not folders:
        return (0,)
    return (
        1,
        _chose(repo),
        len(list(folders[0].glob("iterations/*.json"))),
        _committed(repo),
        sum(len(lines) for lines in _lines(repo).values()),
    )


def _key(line: str) -> tuple[str, int]:
    record = json.loads(line)
    return record["task_id"], record["trial"]


@pytest.mark.slow
def test_a_run_killed_at_any_moment_resumes_to_where_an_uninterrupted_one_ends(tmp_path):
    reference_repo = tiny_target(tmp_path / "reference")
    reference = _start(reference_repo, *ARGS)
    repo = tiny_target(tmp_path / "killed")
    hold = tmp_path / "hold"
    hold.mkdir()
    landed, finished = [], {}  # where each kill left the run; every simulation line a kill found finished
    for moment, held, reached in MOMENTS:
        [run] = _run_folders(repo) or [None]
        assert not reached(repo, hold), f"the run had reached the moment when {moment} before it was resumed for it"
        env = _hold(held, repo, hold) if held else {}
        controller = _start(repo, *(["--resume", run.name] if run else ARGS), env=env)
        deadline = time.monotonic() + 300
        while controller.poll() is None and time.monotonic() < deadline and not reached(repo, hold):
            time.sleep(0.05)
        assert controller.poll() is None, f"the run ended before {moment}: {controller.stderr.read()[-2000:]}"
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
        assert reached(repo, hold), f"the run never reached the moment when {moment}"
        if held:
            _release(held, repo, hold)
        while processes_in(repo) and time.monotonic() < deadline:  # the daemon stops the killed run's workers
            time.sleep(0.1)
        assert not processes_in(repo), f"workers outlived the run killed when {moment}"
        landed.append(_progress(repo))
        assert landed == sorted(set(landed)), f"the kill when {moment} landed no further than the one before: {landed}"
        for name, lines in _lines(repo).items():
            finished.setdefault(name, set()).update(lines)
        # What is left is no run, or one that `runs` and `status` show as resumable: never a folder without its record.
        folders = _run_folders(repo)
        assert len(folders) <= 1 and all((f / "run.json").is_file() and (f / "state.json").is_file() for f in folders), moment
        if not folders:
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
    # No resume ran a finished simulation again: each line a kill found is there as it was written, and no evaluation
    # holds a finished simulation twice (the usage compared below would not tell).
    final = _lines(repo)
    for name, lines in finished.items():
        assert lines <= set(final[name]), f"{name}: a simulation finished before a kill was run again"
    for name, lines in final.items():
        keys = [_key(line) for line in lines]
        assert len(keys) == len(set(keys)), f"{name} ran a finished simulation twice"
    assert reference.wait(timeout=600) == 0, reference.stderr.read()[-3000:]
    [reference_run] = _run_folders(reference_repo)
    want, got = final_state(reference_repo, reference_run.name), final_state(repo, run.name)
    assert [(title, verdict) for title, verdict, _, _ in want["candidates"]] == [("worse", "rejected"), ("exact", "joined")]
    assert got["candidates"] == want["candidates"] and got["branches"] == want["branches"]
    assert got["trees"] == want["trees"] and got["trees"]["best"] == got["trees"]["iter-001b"]
    assert got["usage"] == want["usage"] and got["decided"] == want["decided"] == [1]  # each simulation charged once
    for name in ("analysis-001-d0", "iter-001a-screen", "iter-001b-screen", "iter-001b-gate", "iter-001b-gate2", "audit-001b-best"):
        assert sorted(map(_key, final[name])) == sorted(map(_key, _lines(reference_repo)[name])), name  # the uninterrupted run's


def test_a_folder_cut_off_before_its_record_is_named_so(tmp_path):
    """An evolver before the record came first could leave runs/RUN/ holding only evals/."""
    repo = tmp_path
    (repo / "runs" / "run-20261120-101010-abcd" / "evals" / "tasks").mkdir(parents=True)
    said = "run-20261120-101010-abcd was cut off before it recorded its settings; start a new run"
    for command in (
        ["run", str(repo), "--resume", "run-20261120-101010-abcd"],
        ["status", "run-20261120-101010-abcd", "--repo", str(repo)],
    ):
        proc = run_cli(command)
        assert proc.returncode == 2 and proc.stderr.strip() == f"evolver: error: {said}", (command, proc.stderr)
    listed = run_cli(["runs", "--repo", str(repo), "--json"])
    assert json.loads(listed.stdout) == [{"run_id": "run-20261120-101010-abcd", "status": "cut off", "reason": said}]
    table = run_cli(["runs", "--repo", str(repo)])
    assert table.returncode == 0 and "cut off before it recorded its settings" in table.stdout
