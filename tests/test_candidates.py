"""Several candidates per iteration (`evolver run --candidates 3`), end to end: scripted meta-LLM
and agent, real tau2, git and subprocesses.

The three proposals of iteration 1 are told apart by their digests ("proposal N of 3"): the
fix, a patch that makes the agent worse, and a patch that does not parse. They are evaluated
at once, on their own branches; at most one is kept; history, show, status and rollback
understand the iteration; a run killed mid-iteration resumes to the same end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import SCRIPTED_MODELS, git, run_cli
from tests.test_loop import make_target, run_id_of

pytestmark = pytest.mark.slow  # every test here starts whole runs
ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:candidates_script"}
# The one-shot proposer: its verdicts unfiltered. Two gate stages, not the audited policy's default three: the kill
# below still lands between the screen and the last stage, and each stage costs 40 simulations of each arm.
ARGS = [
    "--iterations",
    "1",
    "--candidates",
    "3",
    "--gate-policy",
    "audited",
    "--gate-stages",
    "1,2",
    "--concurrency",
    "8",
    "--no-holdout",
    "--proposer",
    "oneshot",
    *SCRIPTED_MODELS,
]


def summary(repo: Path, run_id: str) -> dict:
    """What must match between an uninterrupted run and a killed-and-resumed one."""
    record = json.loads((repo / "runs" / run_id / "iterations" / "001.json").read_text())
    prefix = f"evolver/{run_id}/"
    branches = sorted(
        b.strip().removeprefix(prefix) for b in git(repo, "branch", "--list", f"{prefix}*", "--format=%(refname:short)").split()
    )
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"], env=ENV).stdout)
    return {
        "candidates": [(c["label"], c["title"], c["status"], c["gate_candidate"]) for c in record["candidates"]],
        "kept": record["kept"],
        "branches": branches,
        "trees": {b: git(repo, "rev-parse", f"{prefix}{b}^{{tree}}").strip() for b in branches},
        "usage": status["usage"],
        "decisions": status["decisions"],
    }


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    repo = make_target(tmp_path_factory.mktemp("candidates") / "target")
    proc = run_cli(["run", str(repo), *ARGS], env=ENV, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return repo, run_id_of(repo)


def test_one_of_three_is_kept_each_on_its_own_branch(three):
    repo, run_id = three
    got = summary(repo, run_id)
    assert [(label, title, status) for label, title, status, _ in got["candidates"]] == [
        ("1a", "Keep the user's exact title", "accepted"),
        ("1b", "Transfer everyone", "rejected"),
        ("1c", "Break the state class", "invalid"),
    ]
    assert got["kept"] == "1a"
    assert got["branches"] == ["best", "iter-001a", "iter-001b"]  # 1c never parsed: no commit
    assert got["trees"]["best"] == got["trees"]["iter-001a"]
    assert got["decisions"] == 1  # one gate decision over the set of candidates
    digests = {p.parent.name: p.read_text() for p in (repo / "runs" / run_id / "proposals").glob("*/digest.md")}
    assert sorted(digests) == ["001a", "001b", "001c"]
    assert "proposal 2 of 3" in digests["001b"] and "proposal 2 of 3" not in digests["001a"]


def test_the_candidates_are_evaluated_at_once(three):
    repo, run_id = three

    def window(name: str) -> tuple[datetime, datetime]:
        trajectories = [json.loads(p.read_text()) for p in (repo / "runs" / run_id / "evals" / name / "trajectories").glob("*.json")]
        assert trajectories
        return (
            min(datetime.fromisoformat(t["start_time"]) for t in trajectories),
            max(datetime.fromisoformat(t["end_time"]) for t in trajectories),
        )

    a, b = window("iter-001a-gate"), window("iter-001b-gate")
    assert a[0] < b[1] and b[0] < a[1]  # the two gate evaluations overlapped in time


def test_history_show_status_and_rollback_understand_several_candidates(three):
    repo, run_id = three
    rows = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["candidates"]
    assert [(r["candidate"], r["verdict"], r["is_best"]) for r in rows] == [
        ("1a", "accepted", True),
        ("1b", "rejected", False),
        ("1c", "invalid", False),
    ]
    assert rows[0]["cost"] is not None and rows[1]["cost"] is None  # the iteration's cost, once
    table = run_cli(["history", run_id, "--repo", str(repo)]).stdout
    assert "1a *" in table and "1b" in table
    whole = json.loads(run_cli(["show", run_id, "1", "--repo", str(repo), "--json"]).stdout)
    assert whole["kept"] == "1a" and [c["label"] for c in whole["candidates"]] == ["1a", "1b", "1c"]
    one = json.loads(run_cli(["show", run_id, "1b", "--repo", str(repo), "--json"]).stdout)
    assert "+Always transfer the user to a human agent." in one["diff"] and one["kept"] is False
    assert run_cli(["show", run_id, "1", "--repo", str(repo)]).stdout.count("candidate 1") == 3
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)
    assert status["best"]["iteration"] == 1
    assert run_cli(["rollback", run_id, "--to", "base", "--reason", "check", "--repo", str(repo)]).returncode == 0
    assert run_cli(["rollback", run_id, "--to", "1", "--reason", "back", "--repo", str(repo)]).returncode == 0
    assert git(repo, "rev-parse", f"evolver/{run_id}/best") == git(repo, "rev-parse", f"evolver/{run_id}/iter-001a")


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run stopped by Ctrl-C while its candidates' screens run at once: what was seen around the signal.
    The killed-and-resumed test below goes on from this run (one baseline and proposal for both)."""
    repo = make_target(tmp_path_factory.mktemp("interrupted") / "target")
    controller = subprocess.Popen(
        [sys.executable, "-m", "evolver", "run", str(repo), *ARGS],
        env={**os.environ, **ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        files: list[Path] = []
        while time.monotonic() < deadline and controller.poll() is None:
            files = [p for p in (repo / "runs").glob("run-*/evals/iter-001[ab]-gate/sims.jsonl") if p.read_text().count("\n") >= 5]
            if len(files) == 2:
                break
            time.sleep(0.1)
        seen = {"files": files, "at_signal": [p.read_text().count("\n") for p in files], "running": controller.poll() is None}
        if len(files) == 2 and seen["running"]:
            controller.send_signal(signal.SIGINT)
            _, seen["stderr"] = controller.communicate(timeout=60)
            seen["returncode"] = controller.returncode
            seen["counts"] = [p.read_text().count("\n") for p in files]
            time.sleep(2)
            seen["later"] = [p.read_text().count("\n") for p in files]
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
    return repo, seen


def test_ctrl_c_while_candidates_are_evaluated_stops_all_of_them(interrupted):
    repo, seen = interrupted
    files, at_signal = seen["files"], seen["at_signal"]
    # Both mid-screen (1 trial x 40 gate tasks each, then 1a's stages) when the signal comes.
    assert len(files) == 2 and max(at_signal) < 80 and seen["running"], f"the two screens were never seen running at once: {at_signal}"
    assert seen["returncode"] == 130, seen["stderr"]
    assert max(seen["counts"]) < 80, seen["counts"]  # stopped mid-screen, not left to finish it
    assert seen["later"] == seen["counts"]  # both candidates' workers were stopped
    state = json.loads((repo / "runs" / run_id_of(repo) / "state.json").read_text())
    assert state["status"] == "interrupted"


def test_a_run_killed_mid_iteration_resumes_to_the_same_end(three, interrupted):
    """The run that Ctrl-C stopped in its screen is resumed, killed with SIGKILL mid-way through its gate's stages,
    and resumed again: it ends as the uninterrupted run did."""
    repo, seen = interrupted
    assert seen.get("returncode") == 130, "the run to resume was not stopped mid-iteration"
    run_id = run_id_of(repo)
    gate_sims = repo / "runs" / run_id / "evals" / "iter-001a-gate" / "sims.jsonl"
    # mid-way through the gate's stages (40 screen simulations, then 40 and 80 of the stages), and written by this process
    kill_at = max(60, gate_sims.read_text().count("\n") + 10)
    controller = subprocess.Popen(
        [sys.executable, "-m", "evolver", "run", str(repo), "--resume", run_id],
        env={**os.environ, **ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 900
    reached = False
    while time.monotonic() < deadline and controller.poll() is None:
        if gate_sims.read_text().count("\n") >= kill_at:
            reached = True
            break
        time.sleep(0.2)
    assert reached and controller.poll() is None, "the run ended before it could be killed"
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    resumed = run_cli(["run", str(repo), "--resume", run_id], env=ENV, timeout=1200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    keys = [(r["task_id"], r["trial"]) for r in map(json.loads, gate_sims.read_text().splitlines())]
    assert len(keys) == len(set(keys))  # finished simulations were not run again
    original = summary(*three)
    again = summary(repo, run_id)
    assert again["candidates"] == original["candidates"] and again["kept"] == original["kept"]
    assert again["branches"] == original["branches"]
    assert {b: again["trees"][b] for b in ("iter-001a", "iter-001b", "best")} == {
        b: original["trees"][b] for b in ("iter-001a", "iter-001b", "best")
    }
    assert again["usage"] == original["usage"] and again["decisions"] == original["decisions"]
