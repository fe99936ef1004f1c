"""`evolver run` end to end: scripted meta-LLM and agent, real tau2, real git, real subprocesses.

The scripted meta-LLM proposes in turn: a patch with a syntax error, a patch
outside agent/, a patch that makes the agent worse, and a patch that fixes a
failure. The test domain (tests/scripts/gen_domain.py) has 40 gate tasks, so
the gate's default settings can accept the fix honestly.
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

from tests.conftest import LINEAGE, SCRIPTED_MODELS, git, run_cli

LOOP_ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:script"}
# The one-shot proposer: its verdicts reach the loop unfiltered (the investigating one would make the
# meta-LLM fix a syntax error or a path outside agent/ before they ever became candidates).
RUN_ARGS = ["--iterations", "4", "--concurrency", "8", "--holdout", "--proposer", "oneshot", *LINEAGE, *SCRIPTED_MODELS]
EXPECTED = [
    ("Break the state class", "invalid"),
    ("Edit the optimizer", "refused"),
    ("Transfer everyone", "rejected"),
    ("Keep the user's exact title", "accepted"),
]


def make_target(path: Path, domain: str = "evolver_gen", plugin: str = "tests.scripts.gen_domain") -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "test@example.invalid")
    git(path, "config", "user.name", "test")
    assert run_cli(["init", str(path)]).returncode == 0
    config = (path / "evolver.toml").read_text().replace('domain = "mock"', f'domain = "{domain}"\nplugins = ["{plugin}"]')
    (path / "evolver.toml").write_text(config)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "init")
    return path


def tiny_target(path: Path) -> Path:
    """A target on tests/scripts/tiny_domain.py's 9 tasks (3 analysis, 6 gate): for runs whose story does not need 40 gate tasks."""
    return make_target(path, "evolver_tiny", "tests.scripts.tiny_domain")


def run_id_of(repo: Path) -> str:
    runs = [p.name for p in (repo / "runs").glob("run-*")]
    assert len(runs) == 1, runs
    return runs[0]


def final_state(repo: Path, run_id: str) -> dict:
    """What must match between an uninterrupted run and a killed-and-resumed one."""
    history = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"], env=LOOP_ENV).stdout)
    prefix = f"evolver/{run_id}/"
    branches = sorted(
        b.strip().removeprefix(prefix) for b in git(repo, "branch", "--list", f"{prefix}*", "--format=%(refname:short)").split()
    )
    trees = {b: git(repo, "rev-parse", f"{prefix}{b}^{{tree}}").strip() for b in branches}
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"], env=LOOP_ENV).stdout)
    log = [json.loads(line) for line in (repo / "runs" / run_id / "log.jsonl").read_text().splitlines()]
    return {
        "candidates": [(c["title"], c["verdict"], c["gate_candidate"], c["gate_incumbent"]) for c in history["candidates"]],
        "branches": branches,
        "trees": trees,
        "usage": status["usage"],
        "decided": [e["iteration"] for e in log if e["event"] == "decided"],
    }


def processes_in(repo: Path) -> list[int]:
    """Processes working in the repository (the workers of an evaluation run in its checkouts): only what a
    test's own run started, whatever else runs on the machine."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "cwd").startswith(str(repo)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    repo = make_target(tmp_path_factory.mktemp("loop") / "target")
    head_before = git(repo, "rev-parse", "HEAD")
    proc = run_cli(["run", str(repo), *RUN_ARGS], env=LOOP_ENV, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return repo, run_id_of(repo), head_before, proc


@pytest.fixture(scope="module")
def finished_state(finished_run) -> dict:
    """The uninterrupted run's final state, read once (before test_rollback_moves_best_and_is_recorded moves its best)."""
    repo, run_id, _, _ = finished_run
    return final_state(repo, run_id)


@pytest.mark.slow
def test_verdicts_branches_and_best(finished_run, finished_state):
    repo, run_id, _, proc = finished_run
    state = finished_state
    assert [(t, v) for t, v, _, _ in state["candidates"]] == EXPECTED
    # invalid and refused patches cost no evaluation and get no branch
    assert state["branches"] == ["best", "iter-003", "iter-004"]
    assert git(repo, "rev-parse", f"evolver/{run_id}/best").strip() == git(repo, "rev-parse", f"evolver/{run_id}/iter-004").strip()
    worse, fix = state["candidates"][2], state["candidates"][3]
    assert worse[2] == 0.0 and fix[2] == 1.0 and fix[3] == 0.5
    assert "does not parse" in json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["candidates"][0]["reason"]
    assert "adopt it with `git merge" in proc.stdout
    assert "noise floor: with 40 gate tasks and 4 trial(s) per task the gate resolves effects of about" in proc.stderr  # audited: 1, 2, 4
    assert "below the noise floor" not in proc.stderr  # no minimum effect was asked for
    manifest = json.loads((repo / "runs" / run_id / "run.json").read_text())
    holdout = manifest["holdout_tasks"]
    assert len(holdout) == 1 and len(manifest["analysis_tasks"]) == 7  # sealed from the 8 train tasks
    assert not set(holdout) & set(manifest["analysis_tasks"] + manifest["gate_tasks"])
    scores = json.loads((repo / "runs" / run_id / "holdout.json").read_text())
    assert scores["best"] == 1.0 and scores["base"] == (0.0 if int(holdout[0][-2:]) % 2 else 1.0)
    analysed = {p.name.split("__")[0] for p in (repo / "runs" / run_id / "evals").glob("analysis-*/trajectories/*.json")}
    assert analysed and not analysed & set(holdout)  # the meta-LLM's material never includes the holdout


@pytest.mark.slow
def test_git_log_tells_the_story(finished_run):
    repo, run_id, _, _ = finished_run
    log = git(repo, "log", "-1", f"evolver/{run_id}/iter-004")
    assert "Keep the user's exact title" in log and "Pattern 1: create_task got a garbled title" in log
    assert f"Evolver-Run: {run_id}" in log and "Evolver-Iteration: 4" in log and "Evolver-Parent: base" in log
    assert "evolver accepted: Accepted: +50.0 points" in log  # the verdict, as a git note
    assert "evolver rejected: Screened out" in git(repo, "log", "-1", f"evolver/{run_id}/iter-003")  # one trial alone, against the base's
    diff = git(repo, "diff", f"evolver/{run_id}/iter-004~1", f"evolver/{run_id}/iter-004", "--stat")
    assert "agent/agent.py" in diff and "1 file changed" in diff


@pytest.mark.slow
def test_users_branch_and_working_tree_are_untouched(finished_run):
    repo, run_id, head_before, _ = finished_run
    assert git(repo, "rev-parse", "HEAD") == head_before
    assert git(repo, "branch", "--show-current").strip() == "main"
    assert git(repo, "status", "--porcelain") == ""  # runs/ is ignored, no stray files
    assert "Use the exact title" not in (repo / "agent" / "agent.py").read_text()
    assert git(repo, "worktree", "list").count("\n") == 1  # finished candidates' worktrees are gone


@pytest.mark.slow
def test_history_table_show_and_status(finished_run):
    repo, run_id, _, _ = finished_run
    table = run_cli(["history", run_id, "--repo", str(repo)])
    assert table.returncode == 0
    for title, verdict in EXPECTED:
        assert title in table.stdout and verdict in table.stdout
    shown = json.loads(run_cli(["show", run_id, "4", "--repo", str(repo), "--json"]).stdout)
    assert "+Use the exact title the user gives." in shown["diff"]
    assert len(shown["flips"]) == 20 and all(f["incumbent"] == 0.0 and f["candidate"] == 1.0 for f in shown["flips"])
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)
    assert status["status"] == "finished" and status["best"]["iteration"] == 4
    assert status["decisions"] == 2 and status["expected_false_keeps"] == pytest.approx(2 * 0.2)  # the audited policy's lenient gate
    [audit] = status["audits"]  # the run's last word: the best against the base, side by side
    assert (
        status["gate_policy"] == "audited" and audit["best"] == 4 and audit["holds"] and audit["reason"].startswith("Better: +50.0 points")
    )
    assert "audit of iteration 4 after" in table.stdout and "the best stands" in table.stdout
    digest = (repo / "runs" / run_id / "proposals" / "001" / "digest.md").read_text()
    assert "create_task(user_id, title)" in digest and "Code Audit" not in digest  # procedures, not data


@pytest.mark.slow
def test_show_turns_prints_a_simulation_as_the_model_saw_it_and_the_report_links_each_failed_analysis_one(finished_run):
    repo, run_id, _, _ = finished_run
    run = repo / "runs" / run_id
    manifest = json.loads((run / "run.json").read_text())
    failed = next(t for t in manifest["analysis_tasks"] if int(t[-2:]) % 2)  # the base agent garbles odd titles
    shown = run_cli(["show", run_id, "1", "--turns", failed, "--repo", str(repo)])
    assert shown.returncode == 0, shown.stderr
    assert f"{failed} trial 0 in analysis-g0: reward 0.00" in shown.stdout and "the harness changed: nothing" in shown.stdout
    assert "turn 1 of 2" in shown.stdout and "the model answered: tool call(s) create_task(" in shown.stdout
    gate = json.loads(run_cli(["show", run_id, "4", "--turns", manifest["gate_tasks"][0], "--json", "--repo", str(repo)]).stdout)
    assert gate["evaluation"] == "iter-004-gate" and gate["view"]["turns"] and gate["changes"] == []  # recorded for a person, too
    holdout = run_cli(["show", run_id, "base", "--turns", manifest["holdout_tasks"][0], "--repo", str(repo)])
    assert holdout.returncode == 0 and " in holdout-" in holdout.stdout
    assert run_cli(["report", run_id, "--repo", str(repo)]).returncode == 0
    table = (run / "report.html").read_text().split('id="failed-analysis-table"')[1].split("</table>")[0]
    assert f"evolver show {run_id} 1 --turns {failed}" in table
    assert not any(t in table for t in manifest["gate_tasks"] + manifest["holdout_tasks"])


@pytest.mark.slow
def test_a_proposer_reads_the_analysis_folder_and_nothing_of_the_gate(finished_run, monkeypatch):
    """Every simulation is recorded, gate and holdout ones too (for a person); what a proposer reads comes
    from the analysis evaluation's folder alone, the folder the loop hands its Evidence."""
    from evolver.data import EvalResult
    from evolver.evolution.evidence import Evidence

    repo, run_id, _, _ = finished_run
    evals = repo / "runs" / run_id / "evals"
    assert list((evals / "iter-004-gate" / "turns").glob("*.json.gz")) and list((evals / "reference-g0" / "turns").glob("*.json.gz"))
    analysis = EvalResult.model_validate_json(next((evals / "analysis-g0").glob("result-*.json")).read_text())
    read: list[Path] = []
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read.append(self) or original(self, *a, **k))
    evidence = Evidence(analysis, evals / "analysis-g0", parent=repo)
    shown = [
        evidence.failures(),
        evidence.search("create"),
        *(evidence.trajectory(label) + evidence.turn(label) for label in evidence.labels.values()),
    ]
    assert all(shown) and any("turn 1 of" in text for text in shown)
    runs = [p for p in read if evals in p.parents]
    assert runs and all((evals / "analysis-g0") in p.parents for p in runs), sorted({p.parent.parent.name for p in runs})


@pytest.mark.slow
def test_rollback_moves_best_and_is_recorded(finished_run, tmp_path):
    repo, run_id, _, _ = finished_run
    proc = run_cli(["rollback", run_id, "--to", "base", "--reason", "regressed in production", "--repo", str(repo)])
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", f"evolver/{run_id}/best") == git(repo, "rev-parse", "HEAD")
    assert git(repo, "rev-parse", f"evolver/{run_id}/iter-004")  # nothing deleted
    events = [json.loads(line) for line in (repo / "runs" / run_id / "log.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "rollback" and events[-1]["reason"] == "regressed in production"
    back = run_cli(["rollback", run_id, "--to", "4", "--reason", "fixed upstream", "--repo", str(repo)])
    assert back.returncode == 0
    assert git(repo, "rev-parse", f"evolver/{run_id}/best") == git(repo, "rev-parse", f"evolver/{run_id}/iter-004")
    bad = run_cli(["rollback", run_id, "--to", "3", "--reason", "x", "--repo", str(repo)])
    assert bad.returncode == 2 and "not a kept candidate" in bad.stderr


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_final_state(finished_state, tmp_path):
    repo = make_target(tmp_path / "target")
    cmd = [sys.executable, "-m", "evolver", "run", str(repo), *RUN_ARGS]
    controller = subprocess.Popen(cmd, env={**os.environ, **LOOP_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    gate_sims = None
    while time.monotonic() < deadline and controller.poll() is None:
        found = list((repo / "runs").glob("run-*/evals/iter-004-gate/sims.jsonl"))
        if found and found[0].read_text().count("\n") >= 60:  # mid-way through the fix's gate stages
            gate_sims = found[0]
            break
        time.sleep(0.2)
    assert gate_sims is not None and controller.poll() is None, "the run ended before it could be killed"
    run_id = run_id_of(repo)
    second = run_cli(["run", str(repo), "--resume", run_id], env=LOOP_ENV)
    assert second.returncode == 2 and "is being driven by" in second.stderr  # the lock
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    gone = time.monotonic() + 30
    while processes_in(repo) and time.monotonic() < gone:  # the workers notice their controller is gone and exit
        time.sleep(0.1)
    assert not processes_in(repo), "workers outlived the killed run"
    done_before = gate_sims.read_text().count("\n")
    time.sleep(1.5)
    assert gate_sims.read_text().count("\n") == done_before  # no orphan worker still writing
    resumed = run_cli(["run", str(repo), "--resume", run_id], env=LOOP_ENV, timeout=1200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # finished simulations were not run again: every task and trial appears once
    records = [json.loads(line) for line in gate_sims.read_text().splitlines() if line.strip()]
    keys = [(r["task_id"], r["trial"]) for r in records]
    assert len(keys) == len(set(keys)) == 40 * (1 + 4)  # the screen's trial, then the lenient gate's four
    got, want = final_state(repo, run_id), finished_state
    assert got["candidates"] == want["candidates"] and got["branches"] == want["branches"]
    assert got["trees"]["iter-003"] == want["trees"]["iter-003"] and got["trees"]["iter-004"] == want["trees"]["iter-004"]
    assert got["trees"]["best"] == got["trees"]["iter-004"]
    # every simulation charged once and every decision logged once, killed or not
    assert got["usage"] == want["usage"] and got["decided"] == want["decided"] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "setup, args, message",
    [
        ("nogit", [], "is not a git repository"),
        ("noagent", [], "no agent/agent.py"),
        ("dirty", [], "agent/ has uncommitted changes"),
        ("ok", ["--iterations", "0"], "--iterations 0 must be between 1 and 10000"),
        ("ok", ["--resume", "run-nope"], "unknown run id 'run-nope'"),
    ],
)
def test_bad_input_for_run(tmp_path, setup, args, message):
    repo = tmp_path / "target"
    if setup == "nogit":
        repo.mkdir()
        run_cli(["init", str(repo)])
    elif setup == "noagent":
        repo.mkdir()
        git(repo, "init", "-q")
    else:
        make_target(repo)
        if setup == "dirty":
            (repo / "agent" / "agent.py").write_text((repo / "agent" / "agent.py").read_text() + "\n# local edit\n")
    proc = run_cli(["run", str(repo), *RUN_ARGS[2:], *args], env=LOOP_ENV)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not list((repo / "runs").glob("run-*")) if (repo / "runs").exists() else True


@pytest.mark.parametrize(
    "command", [["history", "run-nope"], ["show", "run-nope", "1"], ["rollback", "run-nope", "--to", "base", "--reason", "x"]]
)
def test_unknown_run_id(tmp_path, command):
    proc = run_cli([*command, "--repo", str(tmp_path)])
    assert proc.returncode == 2 and "unknown run id 'run-nope'" in proc.stderr


def test_dry_run_prints_the_estimate_and_writes_nothing(tmp_path):
    repo = make_target(tmp_path / "target")
    before = sorted(p.name for p in (repo / "runs").iterdir())  # fails if runs/ is missing: the check below must not be vacuous
    proc = run_cli(["run", str(repo), "--dry-run", *RUN_ARGS], env=LOOP_ENV)
    assert proc.returncode == 0, proc.stderr
    assert "analysis on tau2's train split, gate on its test split" in proc.stderr
    # The audited policy: baseline 7 + 80 (the base's reference, 2 trials), then 4 x (1 smoke + 40 (the screen) + 2 x 40 x 4
    # (the candidate and the incumbent beside it, the lenient gate's last look) + 7 (a new incumbent's analysis)), then the
    # audit (2 x 40 x 4) and 2 x 1 holdout task x 2 trials. Expected: the gate's usual share (0.56) instead of all of it,
    # and the audit's first looks (2 x 40 x 1.5) instead of its last.
    assert "about 1,092 simulations expected, at most 1,883;" in proc.stderr
    assert "1 analysis tasks sealed as a holdout" in proc.stderr
    assert sorted(p.name for p in (repo / "runs").iterdir()) == before


@pytest.mark.parametrize("local_role, capped", [("meta", False), ("agent", True)])
def test_dry_run_estimate_caps_concurrency_only_for_simulated_roles_on_the_embedded_server(tmp_path, local_role, capped):
    # The embedded server has a slot per simulated role: a local agent or user means one simulation
    # at a time; a local meta-LLM, called between evaluations, changes nothing.
    repo = make_target(tmp_path / "target")
    models = dict(zip(SCRIPTED_MODELS[::2], SCRIPTED_MODELS[1::2]))
    models[f"--{local_role}-model"] = "local"
    args = [
        "run",
        str(repo),
        "--dry-run",
        "--iterations",
        "4",
        "--concurrency",
        "8",
        "--holdout",
        *LINEAGE,
        *[x for kv in models.items() for x in kv],
    ]
    proc = run_cli(args, env=LOOP_ENV)
    assert proc.returncode == 0, proc.stderr
    assert ("concurrency 8 -> 1" in proc.stderr) is capped
    expected = (
        "at 30.00 s of wall clock each (1 at once), about 9.2 h, up to 15.8 h"
        if capped
        else "at 3.75 s of wall clock each (8 at once), about 1.1 h, up to 2.0 h"
    )
    # the bounds of the dry run above plus the investigating proposer's 3 try simulations per iteration
    assert f"about {1_092 + 4 * 3:,} simulations expected, at most {1_883 + 4 * 3:,}; {expected}; 4 proposal(s) at most" in proc.stderr
    assert "starting the embedded model server" not in proc.stderr  # a dry run starts nothing


@pytest.mark.slow
def test_eval_ref_evaluates_a_candidate_without_touching_the_tree(finished_run):
    repo, run_id, _, _ = finished_run
    args = ["eval", str(repo), "--json", *SCRIPTED_MODELS, "--task-ids", "gen_09,gen_11,gen_12,gen_13"]
    kept = run_cli([*args, "--ref", f"evolver/{run_id}/iter-004"], env=LOOP_ENV)
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["avg_reward"] == 1.0
    base = run_cli(args, env=LOOP_ENV)
    assert json.loads(base.stdout)["avg_reward"] == 0.25  # the baseline garbles the odd-numbered titles
    assert git(repo, "status", "--porcelain") == "" and git(repo, "worktree", "list").count("\n") == 1
    bad = run_cli([*args, "--ref", "no-such-branch"], env=LOOP_ENV)
    assert bad.returncode == 2 and "unknown git ref 'no-such-branch'" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_cleanly_and_leaves_a_resumable_run(tmp_path, sig):
    repo = make_target(tmp_path / "target")
    controller = subprocess.Popen(
        [sys.executable, "-m", "evolver", "run", str(repo), *RUN_ARGS],
        env={**os.environ, **LOOP_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    sims = None
    while time.monotonic() < deadline and sims is None:
        found = list((repo / "runs").glob("run-*/evals/reference-g0/sims.jsonl"))
        sims = found[0] if found and found[0].read_text().count("\n") >= 20 else None
        time.sleep(0.1)
    assert sims is not None
    controller.send_signal(sig)
    _, err = controller.communicate(timeout=60)
    assert controller.returncode == 130, err
    run_id = run_id_of(repo)
    assert f"resume with `evolver run --resume {run_id}`" in err
    state = json.loads((repo / "runs" / run_id / "state.json").read_text())
    assert state["status"] == "interrupted"
    count = sims.read_text().count("\n")
    time.sleep(2)
    assert sims.read_text().count("\n") == count  # the workers were stopped with it
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)
    assert status["status"] == "interrupted" and status["iterations_done"] == 0
