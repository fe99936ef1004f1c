"""The loop's policy, branch by branch, against a fake evaluation backend.

The backend (evolver.evaluation.backends.Backend) is the loop's only way to simulations, so
a fake one that scores each task from the candidate's instruction text lets
these tests run the real loop, git lineage, proposer (scripted meta-LLM), gate
and run store in seconds: what is kept, what becomes the parent, when the run
stops, what an undecided iteration does to the stall rule, which of several
good candidates wins.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rich.console import Console

from evolver.cli.start import new_run, start_run
from evolver.config_load import load_config
from evolver.data import EvalResult, RoleUsage, SimRecord
from evolver.evaluation.backends import TaskListing
from evolver.evaluation.metrics import summarize
from tests.conftest import git, run_cli
from tests.scripts.loop_cases import EXACT, THOROUGH, TRANSFER

TASKS = [f"task_{i:02d}" for i in range(60)]


def _uniform(*key) -> float:
    return int(hashlib.sha256(repr(key).encode()).hexdigest()[:8], 16) / 16**8


class FakeBackend:
    """Each task passes with a base rate of its own, raised or lowered by markers in the agent's
    instruction. Draws depend on task, trial and seed only (common random numbers), so a better
    agent never loses a simulation the worse one wins."""

    name = "fake"

    def __init__(self, base: float = 0.4, infra_marker: str | None = None):
        self.base, self.infra_marker = base, infra_marker
        self.evaluations: list[tuple[str, int]] = []  # (evaluation name, seed)

    def rate(self, task: str, text: str) -> float:
        rate = min(1.0, self.base + 0.4 * _uniform(task))
        if TRANSFER in text:
            return 0.0
        return min(1.0, rate + 0.25 * (EXACT in text) + 0.45 * (THOROUGH in text))

    def evaluate(self, req, run_id, *, timeout, on_progress=None, outage: bool = False) -> EvalResult:
        """``outage``: this evaluation's simulations all hit infrastructure errors (others at once are untouched)."""
        text = (Path(req.checkout) / "agent" / "agent.py").read_text()
        Path(req.out_dir).mkdir(parents=True, exist_ok=True)
        self.evaluations.append((Path(req.out_dir).name, req.seed))
        infra = outage or (self.infra_marker is not None and self.infra_marker in text)
        records = []
        for trial in range(req.trials):
            for task in req.task_ids:
                if infra:
                    records.append(SimRecord(task_id=task, trial=trial, outcome="infra_error", error="fake outage"))
                    continue
                passed = _uniform(task, trial, req.seed) < self.rate(task, text)
                records.append(
                    SimRecord(
                        task_id=task,
                        trial=trial,
                        seed=req.seed,
                        outcome="ok",
                        reward=float(passed),
                        usage={"agent": RoleUsage(prompt_tokens=100, completion_tokens=10, cost=0.001)},
                    )
                )
        return EvalResult(
            run_id=run_id,
            checkout=req.checkout,
            domain=req.domain,
            split=req.split,
            task_ids=list(req.task_ids),
            trials=req.trials,
            seed=req.seed,
            max_steps=req.max_steps,
            models={"agent": req.agent, "user": req.user, "judge": req.judge},
            summary=summarize(records, len(req.task_ids), req.trials, 0.0),
            simulations=records,
        )

    def list_tasks(self, req) -> TaskListing:
        return TaskListing(tasks=TASKS)

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


def run_loop(tmp_path, monkeypatch, proposals: str, backend: FakeBackend | None = None, script: str = "policy_script", **settings):
    """A whole run, in-process; returns the loop (its run directory and state are on disk)."""
    from evolver.cli.scaffold import init_repo

    monkeypatch.setenv("EVOLVER_SCRIPT", f"tests.scripts.loop_cases:{script}")
    monkeypatch.setenv("EVOLVER_TEST_PROPOSALS", proposals)
    repo = tmp_path / "target"
    init_repo(repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    # A lineage unless the test says otherwise (the population search has tests/test_population.py).
    cfg = load_config(
        repo,
        {
            "agent_model": "scripted/agent",
            "user_model": "scripted/user",
            "judge_model": "scripted/judge",
            "meta_model": "scripted/meta",
            "domain": "fake",
            "holdout": "off",
            "gate_stages": ["1", "2"],
            "gate_policy": "audited",
            "candidates": 1,
            **settings,
        },
        environ={},
    )
    backend = backend or FakeBackend()
    loop = start_run(
        new_run(repo, cfg, "run-policy", backend, allow_dirty=False, dry_run=False, console=Console(quiet=True)),
        cfg,
        backend,
        Console(quiet=True),
    )
    loop.drive()
    return loop


def statuses(loop) -> list[tuple[str, str]]:
    return [(c.label, c.status) for r in loop.run.iterations() for c in r.candidates]


def test_per_decision_a_kept_candidate_becomes_the_parent_and_is_measured_afresh(tmp_path, monkeypatch):
    backend = FakeBackend()
    loop = run_loop(tmp_path, monkeypatch, "exact,note1", backend, iterations=2, gate_policy="per-decision")
    assert statuses(loop) == [("1", "accepted"), ("2", "rejected")]
    first, second = loop.run.iterations()
    assert second.parent == 1 and second.parent_commit == first.winner.commit
    assert loop.lineage.commit_of(loop.lineage.best_branch) == first.winner.commit
    # the new incumbent's reference is measured again, with fresh seeds, not reused from its own gate
    seeds = dict(backend.evaluations)
    assert seeds["reference-g1"] == seeds["reference-g0"] + 1000
    assert loop.state.audits == [] and not any(name.startswith("audit-") for name in seeds)  # no audit under this policy


class AuditMisses(FakeBackend):
    """The candidates' markers do nothing in the audit's evaluations: a keep that does not hold when measured again."""

    auditing = False

    def rate(self, task: str, text: str) -> float:
        return super().rate(task, text if not self.auditing else "")

    def evaluate(self, req, run_id, **kwargs):
        self.auditing = Path(req.out_dir).name.startswith("audit-")
        return super().evaluate(req, run_id, **kwargs)


def test_audited_the_best_is_audited_against_the_base_and_stands_when_shown_better(tmp_path, monkeypatch):
    backend = FakeBackend()
    loop = run_loop(tmp_path, monkeypatch, "exact,note1", backend, iterations=2)
    assert statuses(loop) == [("1", "accepted"), ("2", "rejected")]
    names = [name for name, _ in backend.evaluations]
    assert "reference-g1" not in names  # no fresh reference for a kept candidate: its history serves
    assert loop.run.iteration(2).gate_stages[0]["verdicts"]["2"]["reason"].startswith(("Screened out", "Continue"))
    [audit] = loop.state.audits
    assert audit.best == 1 and audit.holds and audit.reason.startswith("Better")
    assert {"audit-001-base", "audit-001-best"} <= set(names)
    assert loop.state.incumbent == 1 and loop.lineage.commit_of(loop.lineage.best_branch) == loop.run.iteration(1).winner.commit
    shown = run_cli(["show", "run-policy", "1", "--repo", str(loop.run.repo)])
    assert shown.returncode == 0 and "evidence: " in shown.stdout and "the run's audit against the base: it stands" in shown.stdout


def test_audited_an_audit_that_does_not_hold_rolls_the_run_back_to_its_base_and_says_why(tmp_path, monkeypatch):
    loop = run_loop(tmp_path, monkeypatch, "exact", AuditMisses(), iterations=1)
    assert statuses(loop) == [("1", "accepted")]
    [audit] = loop.state.audits
    assert not audit.holds and audit.looks
    assert loop.state.incumbent == 0 and loop.state.incumbent_commit == loop.manifest.base_commit
    assert loop.lineage.commit_of(loop.lineage.best_branch) == loop.manifest.base_commit
    assert loop.state.best_history[-1].reason.startswith("audit: iteration 1 not shown better than the base")
    history = run_cli(["history", "run-policy", "--repo", str(loop.run.repo)])
    assert history.returncode == 0 and "rolled back to the base" in history.stdout
    # A user may still take the lineage the audit did not confirm: rollback says what the audit made of it.
    back = run_cli(["rollback", "run-policy", "--to", "1", "--reason", "taking it anyway", "--repo", str(loop.run.repo)])
    assert back.returncode == 0 and "note: the run's audit of iteration 1 rolled it back" in back.stdout


def test_the_stall_rule_stops_the_run(tmp_path, monkeypatch):
    loop = run_loop(tmp_path, monkeypatch, "worse", iterations=6, stall=2)
    # the second is the first again: refused inside the proposal, no simulation spent
    assert statuses(loop) == [("1", "rejected"), ("2", "no_patch")]
    assert loop.state.status == "finished" and "2 consecutive candidates were not kept" in loop.state.stop_reason


def test_a_session_that_never_submits_is_told_by_its_turns_not_by_answers(tmp_path, monkeypatch):
    """The investigating proposer has no one-shot answers: "no valid patch after 0 answer(s)" misled the README's first run."""
    loop = run_loop(tmp_path, monkeypatch, "", script="busy_meta", iterations=1, proposer="agent", proposer_turns=2)
    [cand] = loop.run.iteration(1).candidates
    assert (cand.status, cand.reason) == ("no_patch", "no valid patch: no candidate submitted: used all 2 turns")


def test_a_candidate_identical_to_a_sibling_is_refused_unmeasured(tmp_path, monkeypatch):
    """Proposals drawn at once cannot see each other: the loop compares their trees before it measures."""
    loop = run_loop(tmp_path, monkeypatch, "exact+exact", iterations=1, candidates=2)
    assert statuses(loop) == [("1a", "accepted"), ("1b", "refused")]
    [record] = loop.run.iterations()
    assert record.candidates[1].reason == "its agent/ is identical to candidate 1a's (evaluating): nothing new to measure"


def test_an_undecided_iteration_neither_counts_nor_resets_the_stall(tmp_path, monkeypatch):
    backend = FakeBackend(infra_marker="Note 1")
    loop = run_loop(tmp_path, monkeypatch, "worse,note1,note2", backend, iterations=6, stall=2)
    assert statuses(loop) == [("1", "rejected"), ("2", "undecided"), ("3", "rejected")]
    assert "2 consecutive candidates were not kept" in loop.state.stop_reason


def test_of_two_good_candidates_the_better_one_is_kept(tmp_path, monkeypatch):
    loop = run_loop(tmp_path, monkeypatch, "exact+thorough", iterations=1, candidates=2)
    [record] = loop.run.iterations()
    assert record.kept == "1b" and record.status == "accepted"
    loser = record.candidate("1a")
    assert loser.status == "rejected" and "Screened out" in loser.reason and "behind 1b" in loser.reason
    assert loop.state.incumbent == 1 and loop.state.incumbent_commit == record.candidate("1b").commit
    assert loop.state.decisions == 1  # one decision over the set: alpha bounds keeping any no-op of the two


def test_the_dollar_budget_stops_the_run(tmp_path, monkeypatch):
    loop = run_loop(tmp_path, monkeypatch, "worse,note1,note2", iterations=10, budget_usd=0.2, stall=0)
    assert "budget reached" in loop.state.stop_reason
    assert len(loop.run.iterations()) < 10


def test_a_baseline_that_passes_everything_ends_the_run_at_once(tmp_path, monkeypatch):
    loop = run_loop(tmp_path, monkeypatch, "exact", FakeBackend(base=1.0), iterations=3)
    assert loop.run.iterations() == [] and "already passes every gate task" in loop.state.stop_reason


def test_after_a_keep_the_new_analysis_is_measured_once_for_all_candidates(tmp_path, monkeypatch):
    backend = FakeBackend()
    loop = run_loop(tmp_path, monkeypatch, "exact+thorough,note1+note2", backend, iterations=2, candidates=2)
    assert loop.run.iteration(1).kept == "1b"
    names = [name for name, _ in backend.evaluations]
    assert names.count("analysis-g1") == 1  # not once per candidate thread, racing in one directory
    seen = [json.loads((loop.run.proposal_dir(f"002{x}") / "transcript.json").read_text())["messages"][1]["content"] for x in "ab"]
    assert all("failed simulation(s)" in text for text in seen)  # both proposals were shown the new analysis
