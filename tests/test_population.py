"""The population search (gate_policy "population", the default): its decisions (evolver.evolution.gate.population),
the loop that runs them against a fake backend, and `evolver run` with scripted models through the command line:
a pool of several candidates, a screen that rejects, a gate in two parts, the audit's rollback, resumed after a kill,
and the pool as `history`, `show`, the report and git show it.
"""

from __future__ import annotations

import json

import pytest

from evolver.evolution.gate import GateConfig
from evolver.evolution.gate.population import (
    PopulationConfig,
    draw_parent,
    first_part_holds,
    front,
    minibatch,
    passes_everything,
    pick,
    screen,
)
from evolver.evolution.gate.search import make_policy, recorded_policy
from evolver.store.runstate import slug
from tests.conftest import SCRIPTED_MODELS, git, run_cli
from tests.test_loop import LOOP_ENV, run_id_of, tiny_target
from tests.test_loop_policy import AuditMisses, FakeBackend, run_loop

# -- the decisions ------------------------------------------------------------------------------


def test_the_front_keeps_every_member_that_leads_a_task_and_drops_the_dominated():
    members = {
        "base": {"t1": [1.0], "t2": [0.0], "t3": [0.0]},
        "1a": {"t1": [1.0], "t2": [1.0], "t3": [0.0]},  # leads t1 and t2: dominates base, which leads only t1
        "1b": {"t1": [0.0], "t2": [0.0], "t3": [1.0]},  # alone on t3
        "1c": {"t1": [1.0], "t2": [1.0], "t3": [0.0]},  # the same tasks as 1a: one of the two is dropped
    }
    counts = front(members)
    assert "base" not in counts and counts["1b"] == 1 and len(counts) == 2 and set(counts) & {"1a", "1c"}
    # drawn with weight = tasks led: over many seeds the two-task leader comes about twice as often as 1b
    draws = [draw_parent(members, seed) for seed in range(600)]
    assert set(draws) == set(counts) and 1.5 < draws.count(next(n for n in counts if n != "1b")) / draws.count("1b") < 2.7
    assert draw_parent(members, 7) == draw_parent(members, 7)  # a resumed run draws the same parent
    # a member measured with more trials per task compares by its per-task means; a task nobody measured is no front
    assert front({"base": {"t1": [1.0, 0.0]}, "2": {"t1": [1.0, 1.0], "t9": [None]}}) == {"2": 1}


def test_minibatches_cover_every_task_once_an_epoch_and_are_the_same_for_the_same_seed():
    tasks = [f"a{i}" for i in range(10)]
    first = [minibatch(tasks, seed=3, index=i, size=3) for i in range(4)]  # 12 draws over 10 tasks: one epoch and a bit
    flat = [t for batch in first for t in batch]
    assert all(len(set(b)) == 3 for b in first) and sorted(flat[:9]) == sorted(set(flat[:9])) and set(flat[:10]) == set(tasks)
    assert first == [minibatch(tasks, seed=3, index=i, size=3) for i in range(4)]
    assert first != [minibatch(tasks, seed=4, index=i, size=3) for i in range(4)]
    assert minibatch(["x", "y"], seed=1, index=0, size=5) in (("x", "y"), ("y", "x"))  # never more than there are


def test_the_screen_passes_only_a_child_strictly_better_on_the_tasks_both_sides_measured():
    parent = {"t1": [0.0], "t2": [1.0], "t3": [None]}
    assert screen(parent, {"t1": [1.0], "t2": [1.0], "t3": [0.0]}).passed  # t3 is missing on one side: left out
    tie = screen(parent, {"t1": [1.0], "t2": [0.0]})
    assert not tie.passed and tie.tasks == 2 and tie.reason.startswith("Screened out")
    assert not screen(parent, {"t4": [1.0]}).passed and screen(parent, {"t4": [1.0]}).reason.startswith("Undecided")
    assert passes_everything({"t1": [1.0], "t2": [1.0, None]}) and not passes_everything({"t1": [1.0], "t2": [0.0]})
    # the first part of the gate: a child goes on unless more than the margin below its parent there
    parent_gate = {f"g{i}": [1.0 if i < 6 else 0.0] for i in range(10)}
    assert first_part_holds(parent_gate, {f"g{i}": [1.0 if i < 6 else 0.0] for i in range(10)}, 0.05).passed
    assert not first_part_holds(parent_gate, {f"g{i}": [1.0 if i < 5 else 0.0] for i in range(10)}, 0.05).passed
    assert first_part_holds(parent_gate, {f"g{i}": [1.0 if i < 5 else 0.0] for i in range(10)}, 0.1).passed
    assert pick({"base": {"t": [0.5]}, "1a": {"t": [1.0]}, "1b": {"t": [1.0]}}) == "1a"  # the earlier on a tie


def test_the_population_policy_is_recorded_and_rebuilt_as_recorded():
    policy = make_policy("population", GateConfig(alpha=0.1))
    assert policy.population == PopulationConfig() and policy.audit.alpha == 0.1 and policy.reference_trials == 1
    assert recorded_policy(json.loads(json.dumps(policy.to_json())), {}) == policy
    assert make_policy("audited", GateConfig()).population is None


# -- the loop, against a fake backend -----------------------------------------------------------


def pool_of(loop) -> list[tuple[str, str]]:
    return [(m.label, m.parent) for m in loop.state.pool]


def test_children_screened_beside_their_parent_join_the_pool_and_the_best_is_audited(tmp_path, monkeypatch):
    backend = FakeBackend()
    loop = run_loop(tmp_path, monkeypatch, "exact+worse,thorough+note1", backend, iterations=2, gate_policy="population", candidates=2)
    first, second = loop.run.iterations()
    assert first.parent_label == "base" and len(first.minibatch) == 3 and first.evidence == "analysis-001-d0"
    by = {c.label: c for r in (first, second) for c in r.candidates}
    # the worse patch (every task failed) is screened out before any gate trial; the fix runs the gate in two parts
    assert by["1b"].status == "rejected" and by["1b"].reason.startswith("Screened out") and not by["1b"].gate_part
    names = [name for name, _ in backend.evaluations]
    assert "iter-001b-gate" not in names and {"iter-001a-screen", "iter-001a-gate", "iter-001a-gate2"} <= set(names)
    assert by["1a"].status == "accepted" and by["1a"].reason.startswith("Joined the pool") and by["1a"].gate_part["passed"]
    # the second iteration's parent is drawn from the front; what joined is a member with its parent
    assert second.parent_label in {"base", "1a"} and ("1a", "base") in pool_of(loop)
    assert {label for label, _ in pool_of(loop)} == {c.label for c in by.values() if c.status == "accepted"}
    # the best is the member with the best mean gate score, and the audit judged it against the base
    [audit] = loop.state.audits
    assert audit.label == loop.state.best_label != "" and audit.holds
    assert loop.lineage.commit_of(loop.lineage.best_branch) == loop.state.incumbent_commit == by[audit.label].commit
    assert f"audit-{slug(audit.label)}-best" in names
    # the lineage's own steps never ran: no incumbent beside the candidates, no smoke test (the screen is its first run)
    assert not any(name.endswith(("-incumbent", "-smoke")) or name.startswith("analysis-g1") for name in names)


def test_an_audit_that_does_not_hold_rolls_the_pool_back_to_its_base(tmp_path, monkeypatch):
    loop = run_loop(tmp_path, monkeypatch, "exact", AuditMisses(), iterations=1, gate_policy="population", candidates=1)
    [audit] = loop.state.audits
    assert audit.label == "1" and not audit.holds
    assert loop.state.incumbent == 0 and loop.state.best_label == "" and loop.state.incumbent_commit == loop.manifest.base_commit
    assert [m.label for m in loop.state.pool] == ["1"]  # the member stays in the pool: only the run's best moved
    assert loop.lineage.commit_of(loop.lineage.best_branch) == loop.manifest.base_commit


def test_a_parent_that_passes_every_minibatch_task_is_not_asked_for_children(tmp_path, monkeypatch):
    class Perfect(FakeBackend):
        def rate(self, task, text):
            return 1.0 if "analysis" in self.current else super().rate(task, text)

        def evaluate(self, req, run_id, **kwargs):
            from pathlib import Path

            self.current = Path(req.out_dir).name
            return super().evaluate(req, run_id, **kwargs)

    loop = run_loop(tmp_path, monkeypatch, "exact", Perfect(), iterations=1, gate_policy="population", candidates=2)
    [record] = loop.run.iterations()
    assert record.status == "no_patch" and "passed every task of 3 minibatch(es)" in record.reason
    assert {c.status for c in record.candidates} == {"no_patch"} and not any(c.title or c.responses for c in record.candidates)
    assert loop.state.consecutive_rejections == 1  # it kept nothing: the stall rule counts it


# -- the command line ---------------------------------------------------------------------------

# On the tiny domain (3 analysis, 6 gate tasks): the worse patch fails everything; "some" and "other" each keep one more
# analysis title and one more gate title exact, so both pass their screen and join the pool, and neither is shown better
# than the base by the audit (one gate task of six, four trials at most): the run is rolled back to its base.
POP_ENV = {**LOOP_ENV, "EVOLVER_SCRIPT": "tests.scripts.loop_cases:policy_script", "EVOLVER_TEST_PROPOSALS": "worse+some+other,note1"}
POP_ARGS = ["--iterations", "2", "--candidates", "3", "--no-holdout", "--concurrency", "8", "--proposer", "oneshot", *SCRIPTED_MODELS]


@pytest.fixture(scope="module")
def pop_run(tmp_path_factory):
    repo = tiny_target(tmp_path_factory.mktemp("population") / "target")
    proc = run_cli(["run", str(repo), *POP_ARGS], env=POP_ENV, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return repo, run_id_of(repo), proc


@pytest.mark.slow
def test_run_from_the_command_line_shows_the_pool_in_history_show_the_report_and_git(pop_run):
    repo, run_id, proc = pop_run
    history = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"], env=POP_ENV).stdout)
    rows = {r["candidate"]: r for r in history["candidates"]}
    assert rows["1a"]["verdict"] == "rejected" and rows["1a"]["reason"].startswith("Screened out") and rows["1a"]["gate_candidate"] is None
    assert [rows[c]["verdict"] for c in ("1b", "1c")] == ["joined", "joined"] and {rows[c]["parent"] for c in ("1b", "1c")} == {"base"}
    assert {rows[c]["parent"] for c in ("2a", "2b", "2c")} <= {"base", "1b", "1c"}
    assert any(
        line.startswith("population policy: the pool is the base and 2 member(s): 1b (from base), 1c (from base)")
        for line in history["policy"]
    )
    # the pool's pick, the first of two equal means, is audited and not shown better: the run ends at its base
    [audit] = history["audits"]
    assert audit["label"] == "1b" and not audit["holds"] and not any(r["is_best"] for r in rows.values())
    assert "audit of candidate 1b after" in proc.stdout and "rolled back to the base" in proc.stdout
    assert f"best: evolver/{run_id}/best (the base" in proc.stdout
    shown = json.loads(run_cli(["show", run_id, "1b", "--repo", str(repo), "--json"], env=POP_ENV).stdout)
    assert (
        shown["joined"] and not shown["best"] and shown["parent"] == "base" and shown["screen"]["passed"] and shown["gate_part"]["passed"]
    )
    assert (
        shown["evidence"].startswith("screen: 3 against its parent's 2 over 3 analysis task(s)")
        and "rolled back to the base" in shown["evidence"]
    )
    assert "Keep titles ending in 1 or 3 exact." in shown["diff"]
    table = run_cli(["show", run_id, "1", "--repo", str(repo)], env=POP_ENV).stdout
    assert "3 candidates from base, joined the pool: 1b, 1c" in table
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"], env=POP_ENV).stdout)
    assert status["gate_policy"] == "population" and status["best"]["label"] == "base"
    assert [(m["label"], m["parent"]) for m in status["pool"]] == [("base", ""), ("1b", "base"), ("1c", "base")]
    # git: each candidate's commit names its parent, its note what the pool made of it; best is the base's commit
    assert "Evolver-Parent: base" in git(repo, "log", "-1", "--format=%B", f"evolver/{run_id}/iter-001b")
    assert "evolver joined the pool" in git(repo, "notes", "show", f"evolver/{run_id}/iter-001b")
    assert "evolver rejected: Screened out" in git(repo, "notes", "show", f"evolver/{run_id}/iter-001a")
    assert git(repo, "rev-parse", f"evolver/{run_id}/best") == git(repo, "rev-parse", "main")
    markdown = run_cli(["report", run_id, "--repo", str(repo), "--markdown"], env=POP_ENV)
    assert markdown.returncode == 0 and "The best's path from the base: base." in markdown.stdout
    assert "| 1b | some |" in markdown.stdout and markdown.stdout.count("| joined |") == 2
    html = (repo / "runs" / run_id / "report.html").read_text()
    assert 'id="pool-tree"' in html and "<b>1b</b>" in html and "<b>1c</b>" in html and "audit: rolled back to the base" in html


@pytest.mark.slow
def test_rollback_takes_a_member_of_the_pool_by_its_label(pop_run):
    repo, run_id, _ = pop_run
    bad = run_cli(["rollback", run_id, "--to", "1a", "--reason", "try", "--repo", str(repo)], env=POP_ENV)
    assert bad.returncode == 2 and "'1a' is not a member of run" in bad.stderr and "members: 1b, 1c" in bad.stderr
    ok = run_cli(["rollback", run_id, "--to", "1c", "--reason", "taking the other one anyway", "--repo", str(repo)], env=POP_ENV)
    assert ok.returncode == 0 and "best now points at candidate 1c" in ok.stdout
    status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"], env=POP_ENV).stdout)
    assert status["best"]["label"] == "1c"
    assert git(repo, "rev-parse", f"evolver/{run_id}/best") == git(repo, "rev-parse", f"evolver/{run_id}/iter-001c")


@pytest.mark.slow
def test_the_screen_reuses_the_proposers_try_of_the_very_agent_it_submitted(tmp_path):
    repo = tiny_target(tmp_path / "target")
    env = {**LOOP_ENV, "EVOLVER_SCRIPT": "tests.scripts.loop_cases:investigator_script"}
    proc = run_cli(
        ["run", str(repo), "--iterations", "1", "--candidates", "1", "--no-holdout", "--concurrency", "8", *SCRIPTED_MODELS],
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = run_id_of(repo)
    shown = json.loads(run_cli(["show", run_id, "1", "--repo", str(repo), "--json"], env=env).stdout)
    [tried] = shown["tries"]  # the failing task it read, with the fix: the agent it submitted
    assert shown["status"] == "accepted" and shown["screen"]["reused"] == 1 and shown["screen"]["passed"]
    run = repo / "runs" / run_id
    minibatch = json.loads((run / "iterations" / "001.json").read_text())["minibatch"]
    screened = [json.loads(line)["task_id"] for line in (run / "evals" / "iter-001-screen" / "sims.jsonl").read_text().splitlines()]
    # the minibatch's other tasks ran; the tried one did not run again
    assert len(tried["tasks"]) == 1 and sorted(screened + tried["tasks"]) == sorted(minibatch) and len(screened) == 2
    assert not (repo / "runs" / run_id / "evals" / "iter-001-smoke").exists()  # the screen was its first run: no smoke test


def test_dry_run_prices_the_population_search(tmp_path):
    repo = tiny_target(tmp_path / "target")
    dry = run_cli(["run", str(repo), "--dry-run", *POP_ARGS[:2], "--candidates", "2", *POP_ARGS[4:]], env=POP_ENV)
    assert dry.returncode == 0, dry.stderr
    # 3 analysis and 6 gate tasks, no holdout, the one-shot proposer (no tries). At most: the baseline (3 analysis + the
    # base's 6 gate trials), then per iteration 3 minibatches of 3 for the parent and, per child, its screen (3) and every
    # gate task (6), then the audit's 2 x 6 x 4: 9 + 2 x (9 + 2 x 9) + 48 = 111. Expected: 1.25 minibatches, and of the
    # gate 0.3 x (3 + 0.65 x 3) a child, and the audit's first looks (2 x 6 x 1.5): 9 + 2 x (3.75 + 2 x 4.485) + 18 = 53.
    assert "about 53 simulations expected, at most 111;" in dry.stderr and "; 4 proposal(s) at most" in dry.stderr
    assert not list((repo / "runs").glob("run-*"))
