"""How a run stops and goes on: the stall rule, budgets, the clock, undecided candidates, resuming,
split flags, --allow-dirty, the stale reference. Quick runs (one trial per gate task) on the tiny
domain (tests/scripts/tiny_domain.py: 3 analysis and 6 gate tasks, the loop tests' tasks), where the
scripted baseline fails half the gate; scripted LLMs. What these tests check is how a run stops and
goes on, which does not depend on the size of the gate."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import LINEAGE, SCRIPTED_MODELS, git, run_cli
from tests.test_loop import make_target, tiny_target

LOOP_ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:script"}
QUICK = [
    "--gate-stages",
    "1",
    "--no-holdout",
    "--proposer",
    "oneshot",
    *LINEAGE,
    *SCRIPTED_MODELS,
]  # the loop_cases patches reach the loop as they are


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return tiny_target(tmp_path / "target")


def _run_id(repo: Path) -> str:
    [run] = [p.name for p in (repo / "runs").glob("run-*")]
    return run


def _status(repo: Path, run_id: str) -> dict:
    return json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)


def _verdicts(repo: Path, run_id: str) -> list[str]:
    return [c["verdict"] for c in json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["candidates"]]


@pytest.mark.slow
def test_the_stall_rule_stops_after_n_iterations_that_kept_nothing(repo):
    proc = run_cli(["run", str(repo), "--iterations", "5", "--stall", "2", *QUICK], env=LOOP_ENV)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = _run_id(repo)
    assert _verdicts(repo, run_id) == ["invalid", "refused"]
    status = _status(repo, run_id)
    assert status["status"] == "finished" and "2 consecutive" in status["stop_reason"] and status["iterations_done"] == 2
    assert (
        f"best: evolver/{run_id}/best (the base: no candidate was kept, nothing to merge)" in proc.stdout and "git merge" not in proc.stdout
    )


@pytest.mark.slow
def test_an_undecided_iteration_neither_counts_nor_resets_the_stall(repo):
    env = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:outage_script"}
    proc = run_cli(["run", str(repo), "--iterations", "3", "--stall", "3", *QUICK], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = _run_id(repo)
    assert _verdicts(repo, run_id) == ["invalid", "refused", "undecided"]
    state = json.loads((repo / "runs" / run_id / "state.json").read_text())
    assert state["consecutive_rejections"] == 2 and state["decisions"] == 0
    assert _status(repo, run_id)["stop_reason"] == "completed 3 iteration(s)"


@pytest.mark.parametrize(
    "flags, reason, more",
    [
        (["--budget-tokens", "1"], "token budget reached", ["--budget-tokens", "0"]),
        (["--max-hours", "0.00001"], "wall-clock limit of 1e-05 h reached", ["--max-hours", "1"]),
    ],
)
@pytest.mark.slow
def test_budget_and_clock_stop_right_after_the_baseline_and_the_run_can_be_extended(repo, flags, reason, more, tmp_path):
    """And the resume that stops at once reads the noise floor back from evolver's cache (simulating it costs
    seconds of CPU at every start: about 11 s for 40 gate tasks) instead of simulating it again."""
    env = {**LOOP_ENV, "EVOLVER_CACHE": str(tmp_path / "cache")}
    proc = run_cli(["run", str(repo), "--iterations", "2", *flags, *QUICK], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = _run_id(repo)
    status = _status(repo, run_id)
    assert reason in status["stop_reason"] and status["iterations_done"] == 0 and status["status"] == "finished"
    [kept] = (tmp_path / "cache" / "noise-floor").glob("*.json")
    record = json.loads(kept.read_text())
    assert record["version"] == 1 and 0 < record["value"] < 1 and f"about {record['value'] * 100:.1f} points" in proc.stderr
    kept.write_text(json.dumps({**record, "value": 0.4321}))  # what the resume prints is what the cache holds
    same = run_cli(["run", str(repo), "--resume", run_id], env=env)  # the limit still holds: it stops at once
    status = _status(repo, run_id)
    assert same.returncode == 0 and reason in status["stop_reason"] and status["iterations_done"] == 0
    assert "the gate resolves effects of about 43.2 points" in same.stderr
    extended = run_cli(["run", str(repo), "--resume", run_id, *more], env=LOOP_ENV)
    assert extended.returncode == 0, extended.stderr[-2000:]
    status = _status(repo, run_id)
    assert (
        status["stop_reason"] == "completed 2 iteration(s)"
        and status["iterations_done"] == 2
        and _verdicts(repo, run_id) == ["invalid", "refused"]
    )
    recorded = json.loads((repo / "runs" / run_id / "run.json").read_text())["config"]
    assert recorded[more[0][2:].replace("-", "_")] == json.loads(more[1])  # a later --resume keeps the new limit


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory):
    """A run of one iteration, resumed as it is (refused: it is finished), then extended to two once the
    reference it measured at the start is stale: the two tests below check the same run."""
    repo = tiny_target(tmp_path_factory.mktemp("extended") / "target")
    env = {**LOOP_ENV, "EVOLVER_REFERENCE_MAX_HOURS": "0.5"}  # recorded in the run's settings
    first = run_cli(["run", str(repo), "--iterations", "1", *QUICK], env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    run = repo / "runs" / _run_id(repo)
    assert "reference_stale" not in (run / "log.jsonl").read_text()  # not within the run: the limit is half an hour
    again = run_cli(["run", str(repo), "--resume", run.name], env=LOOP_ENV)
    # An hour passes: the reference's results (their time is when it was measured) are now older than the limit.
    # (A limit of seconds and a sleep would let a busy machine make the reference stale within the first run.)
    hour_ago = time.time() - 3600
    for result in (run / "evals" / "reference-g0").glob("result-*.json"):
        os.utime(result, (hour_ago, hour_ago))
    more = run_cli(["run", str(repo), "--resume", run.name, "--iterations", "2"], env=LOOP_ENV)
    return repo, run, again, more


@pytest.mark.slow
def test_resuming_with_more_iterations_extends_a_finished_run(extended_run):
    repo, run, again, more = extended_run
    assert again.returncode == 2 and "is finished" in again.stderr
    assert more.returncode == 0, more.stderr[-2000:]
    assert _verdicts(repo, run.name) == ["invalid", "refused"] and _status(repo, run.name)["iterations_done"] == 2


@pytest.mark.slow
def test_a_stale_reference_is_measured_again_before_the_next_candidate(extended_run):
    _, run, _, more = extended_run
    assert more.returncode == 0, more.stderr[-2000:]
    events = [json.loads(line)["event"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert "reference_stale" in events[events.index("resumed") :]
    # a new generation for each stale reference (a busy machine can make one stale within a run, too): fresh seeds
    # and a fresh measurement of the incumbent before it is compared again
    generation = json.loads((run / "state.json").read_text())["generation"]
    assert events.count("reference_stale") == generation >= 1 and (run / "evals" / f"analysis-g{generation}").is_dir()


def test_allow_dirty_runs_from_head_and_says_so(repo):
    agent = repo / "agent" / "agent.py"
    agent.write_text(agent.read_text() + "\n# not committed\n")
    refused = run_cli(["run", str(repo), "--dry-run", *QUICK], env=LOOP_ENV)
    assert refused.returncode == 2 and "uncommitted changes" in refused.stderr
    allowed = run_cli(["run", str(repo), "--dry-run", "--allow-dirty", *QUICK], env=LOOP_ENV)
    assert allowed.returncode == 0 and "this run starts from HEAD and does not include them" in allowed.stderr
    assert git(repo, "status", "--porcelain").strip() == "M agent/agent.py"  # the user's change is left alone


def test_split_flags_choose_what_the_meta_llm_sees_and_what_the_gate_decides_on(tmp_path):
    repo = make_target(tmp_path / "target")  # the 48-task domain: its train split has 8 tasks
    proc = run_cli(
        ["run", str(repo), "--dry-run", "--analysis-split", "test", "--gate-split", "train", "--no-holdout", *SCRIPTED_MODELS], env=LOOP_ENV
    )
    assert proc.returncode == 0, proc.stderr
    assert "analysis split 'test', gate split 'train'" in proc.stderr
    same = run_cli(["run", str(repo), "--dry-run", "--analysis-split", "train", "--gate-split", "train", *SCRIPTED_MODELS], env=LOOP_ENV)
    assert same.returncode == 2 and "share 8 task(s)" in same.stderr


def test_tasks_lists_ids_quietly():
    proc = run_cli(["tasks", "mock"])
    assert proc.returncode == 0 and proc.stderr == ""
    ids = proc.stdout.split()
    assert len(ids) == 9 and "create_task_1" in ids
    assert run_cli(["tasks", "mock", "--split", "base"]).stdout.split() == ids


@pytest.mark.slow
def test_gate_flags_on_a_run_are_recorded_and_used(repo):
    proc = run_cli(
        [
            "run",
            str(repo),
            "--iterations",
            "3",
            "--candidates",
            "1",
            "--gate-policy",
            "per-decision",
            "--gate-stages",
            "1,2",
            "--gate-alpha",
            "0.1",
            "--gate-min-effect",
            "0.05",
            "--no-holdout",
            *SCRIPTED_MODELS,
        ],
        env=LOOP_ENV,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = repo / "runs" / _run_id(repo)
    gate = json.loads((run / "run.json").read_text())["gate"]
    assert gate["alpha"] == 0.1 and gate["stages"] == [1, 2] and gate["min_effect"] == 0.05
    assert json.loads((run / "run.json").read_text())["policy"]["name"] == "per-decision"
    rejected = json.loads((run / "iterations" / "003.json").read_text())  # "Transfer everyone": worse
    assert rejected["status"] == "rejected" and len(rejected["candidates"][0]["verdicts"]) <= 2
    status = _status(repo, run.name)
    assert status["decisions"] == 1 and status["expected_false_keeps"] == pytest.approx(0.1)  # one decision at alpha 0.1


@pytest.mark.slow
def test_the_dollar_budget_stops_the_run_and_costs_are_counted(repo):
    env = {**LOOP_ENV, "EVOLVER_SCRIPTED_PRICE": "1.0"}  # $1 per 1,000 tokens: the baseline alone costs dollars
    proc = run_cli(["run", str(repo), "--iterations", "2", "--budget-usd", "0.5", *QUICK], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = _status(repo, _run_id(repo))
    assert "budget reached" in status["stop_reason"] and status["iterations_done"] == 0
    assert status["cost"] >= 0.5 and status["usage"]["agent"]["cost"] > 0 and status["usage"]["user"]["cost"] > 0


@pytest.mark.slow
def test_a_candidate_identical_to_an_earlier_one_costs_no_simulation(repo):
    """The one-shot meta-LLM is told, and answers again; a meta-LLM that cannot let go is out of answers."""
    env = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:repeating_script"}
    proc = run_cli(["run", str(repo), "--iterations", "2", *QUICK], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = repo / "runs" / _run_id(repo)
    assert _verdicts(repo, run.name) == ["rejected", "no_patch"]
    second = json.loads((run / "iterations" / "002.json").read_text())["candidates"][0]
    assert len(second["responses"]) == 3 and second["reason"].startswith(
        "no valid patch after 3 answer(s): it makes agent/ the same as candidate 1's, which was rejected"
    ), second["reason"]
    assert not (run / "evals" / "iter-002-smoke").exists() and not (run / "evals" / "iter-002-gate").exists()
