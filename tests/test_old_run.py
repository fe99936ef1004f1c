"""A run written by an older evolver still opens: `history`, `show` and `status` read it, and
`run --resume` extends it to the end.

tests/fixtures/old_run/run-45de20b.tar.gz holds a whole target repository (its git history, the
run's branches and notes, and runs/) with a run that evolver at commit 45de20b finished: three
iterations (invalid, refused, rejected) on the loop tests' domain with scripted LLMs, written before
run.json, state.json and the iteration records carried a schema (tests/fixtures/old_run/make.sh
made it). It unpacks anywhere: the absolute paths recorded in it (run.json's `repo`, the results'
checkouts) are provenance, never opened.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import git, run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "old_run" / "run-45de20b.tar.gz"
LOOP_ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:script"}  # the scripted LLMs the run was made with
OLD_VERDICTS = ["invalid", "refused", "rejected"]


@pytest.fixture
def old_run(tmp_path) -> tuple[Path, str]:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    repo = tmp_path / "target"
    [run_id] = [p.name for p in (repo / "runs").glob("run-*")]
    return repo, run_id


def _json(*args: str) -> dict:
    proc = run_cli([*args, "--json"], env=LOOP_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _lines(run: Path) -> dict[str, int]:
    return {p.parent.name: len(p.read_bytes().splitlines()) for p in sorted(run.glob("evals/*/sims.jsonl"))}


@pytest.mark.slow
def test_an_old_run_is_shown_and_resumed_to_the_end(old_run):
    repo, run_id = old_run
    run = repo / "runs" / run_id
    written = {name: json.loads((run / name).read_text()) for name in ("run.json", "state.json", "iterations/003.json")}
    assert all("schema" not in record for record in written.values())  # as evolver wrote them before records had one
    assert written["run.json"]["repo"] != str(repo)  # made elsewhere

    history = _json("history", run_id, "--repo", str(repo))
    assert [c["verdict"] for c in history["candidates"]] == OLD_VERDICTS
    assert "Transfer everyone" in run_cli(["history", "--repo", str(repo)]).stdout  # the newest run, as a table
    shown = _json("show", run_id, "3", "--repo", str(repo))
    assert shown["status"] == "rejected" and "agent/agent.py" in shown["diff"] and shown["flips"]
    status = _json("status", run_id, "--repo", str(repo))
    assert (status["status"], status["iterations_done"], status["iterations_target"], status["best"]["iteration"]) == ("finished", 3, 3, 0)
    assert status["decisions"] == 1 and status["simulations_done"] == sum(_lines(run).values())
    before = _lines(run)

    more = run_cli(["run", str(repo), "--resume", run_id, "--iterations", "4"], env=LOOP_ENV)
    assert more.returncode == 0, more.stderr[-3000:]
    history = _json("history", run_id, "--repo", str(repo))
    assert [c["verdict"] for c in history["candidates"]] == [*OLD_VERDICTS, "accepted"]
    status = _json("status", run_id, "--repo", str(repo))
    assert (status["status"], status["stop_reason"], status["iterations_done"], status["best"]["iteration"]) == (
        "finished",
        "completed 4 iteration(s)",
        4,
        4,
    )
    assert git(repo, "rev-parse", f"evolver/{run_id}/best") == git(repo, "rev-parse", f"evolver/{run_id}/iter-004")
    # The old run's evaluations were reused as they were (its baseline is not measured again), and the
    # new iteration measured its own.
    after = _lines(run)
    assert {name: after[name] for name in before} == before
    assert {"iter-004-smoke", "iter-004-gate", "iter-004-incumbent"} <= set(after)
    # What this evolver wrote carries the schema; what it left alone stays as the old one wrote it.
    assert json.loads((run / "state.json").read_text())["schema"] == 4
    assert status["gate_policy"] == "per-decision" and status["audits"] == []  # it resumed with the policy it ran with
    assert json.loads((run / "iterations" / "004.json").read_text())["schema"] == 3
    assert json.loads((run / "iterations" / "003.json").read_text()) == written["iterations/003.json"]
    assert json.loads((run / "run.json").read_text()) == written["run.json"]
