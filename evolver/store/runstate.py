"""The run directory: what a run is (run.json), where it stands (state.json), each iteration,
its evaluations (evaldir.EvalDir), proposals and holdout, the event log, and the lock that keeps
two processes from driving one run.

    runs/<run-id>/
      run.json  state.json  iterations/NNN.json  proposals/NNN/  evals/<name>/  log.jsonl
      holdout.json  scan-identifiers.json  worktrees/<name>/  lock  report.html

Every write is atomic, so a run killed at any moment can be resumed. Each record (run.json,
state.json, iterations/NNN.json) carries its schema and is brought up to this evolver's by
named steps when an older one is read; docs/run-directory.md is the contract.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import string
import time
from pathlib import Path
from typing import Iterable, Literal, Optional

from pydantic import BaseModel, Field

from evolver.data import RateTally, RoleModel, RoleUsage, SimRecord, add_tallies, write_json_atomic
from evolver.errors import UsageError
from evolver.store.comparisons import ComparisonDir, TransferDir
from evolver.store.evaldir import EvalDir
from evolver.store.records import Versioned, read_record

IterationStatus = Literal[
    "proposing", "no_patch", "refused", "invalid", "evaluating", "accepted", "rejected", "undecided",
]
FINAL_STATUSES = ("no_patch", "refused", "invalid", "accepted", "rejected", "undecided")


RUNS = "runs"  # in the evaluated repository: every run and evaluation, ignored by git
MANIFEST_SCHEMA = 5
STATE_SCHEMA = 3
ITERATION_SCHEMA = 2


def _manifest_v1_to_v2(data: dict) -> dict:
    """v1 recorded the embedded server's address among the settings (it is learnt at run time now,
    never a setting), predates the user-role adapter (a v1 run ran its local user without it) and
    the proposer setting (a v1 run proposed with one completion over the digest, and goes on so)."""
    config = {k: v for k, v in data.get("config", {}).items() if k != "local_api_base"}
    return {**data, "config": {"local_user_adapter": False, "proposer": "oneshot", **config}}


def _state_v1_to_v2(data: dict) -> dict:
    """v1 is state.json as evolver wrote it before the file carried a schema: the same fields, kept
    as they are (fields added before the schema, like `charged` or `updated_at`, have defaults)."""
    return dict(data)


def _iteration_v1_to_v2(data: dict) -> dict:
    """v1 is an iteration record as evolver wrote it before the file carried a schema: the same fields,
    kept as they are (its candidates' `investigation`, added with the proposers, defaults to empty)."""
    return dict(data)


def _manifest_v2_to_v3(data: dict) -> dict:
    """v2 predates per-role model arguments (reasoning efforts, the agent_args ... judge_args tables)
    and the learnings file: a v2 run sent no such argument and read no earlier learnings, and goes on so.
    (An evolver that knows only v2 refuses a v3 run rather than meet settings it cannot take.)"""
    none = {f"{role}_reasoning_effort": "" for role in ("agent", "user", "meta")}
    none.update({f"{role}_args": {} for role in ("agent", "user", "meta", "judge")}, learnings_file="")
    return {**data, "config": {**none, **data.get("config", {})}, "schema": 3}


def _manifest_v3_to_v4(data: dict) -> dict:
    """v3 predates configured rate limits (rate_limits): a v3 run configured none, and goes on learning each
    provider's limit from its answers, as every run does for a model it has no limit for."""
    return {**data, "config": {"rate_limits": {}, **data.get("config", {})}}


def _manifest_v4_to_v5(data: dict) -> dict:
    """v4 predates the gate policy (gate_policy): a v4 run gated every decision on its own, measured a reference
    for every new incumbent and audited nothing, and goes on so (its policy is rebuilt from its `gate`)."""
    return {**data, "config": {"gate_policy": "per-decision", **data.get("config", {})}}


def _state_v2_to_v3(data: dict) -> dict:
    """v2 predates the end-of-run audit: a v2 run was audited by nothing."""
    return {"audits": [], **data}


# Named steps from each older schema to the next; a run is opened through all it needs.
MANIFEST_MIGRATIONS = {1: _manifest_v1_to_v2, 2: _manifest_v2_to_v3, 3: _manifest_v3_to_v4, 4: _manifest_v4_to_v5}
STATE_MIGRATIONS = {1: _state_v1_to_v2, 2: _state_v2_to_v3}
ITERATION_MIGRATIONS = {1: _iteration_v1_to_v2}


class Manifest(Versioned):
    """What the run is (run.json): the first file of its folder, written before anything else, and
    written again once its tasks are chosen."""

    SCHEMA, MIGRATIONS, WHAT = MANIFEST_SCHEMA, MANIFEST_MIGRATIONS, "run.json"

    run_id: str
    created: float
    repo: str
    base_commit: str
    base_branch: Optional[str]
    config: dict
    versions: dict[str, str]
    models: dict[str, RoleModel]
    analysis_tasks: list[str]
    gate_tasks: list[str]
    holdout_tasks: list[str]
    split_note: str
    gate: dict
    policy: dict = Field(default_factory=dict)  # the gate policy (gate.search.Policy); empty in a v4 run: per-decision around `gate`

    @property
    def tasks_chosen(self) -> bool:
        """False for a run killed while it listed its tasks (a run has two gate tasks at least): `--resume` chooses them."""
        return bool(self.gate_tasks)


class BestChange(BaseModel):
    iteration: int
    commit: str
    reason: str
    at: float


class RunState(Versioned):
    """Where the run stands (state.json)."""

    SCHEMA, MIGRATIONS, WHAT = STATE_SCHEMA, STATE_MIGRATIONS, "state.json"

    status: Literal["running", "interrupted", "paused", "finished"] = "running"  # paused: the meta-LLM stayed down
    stop_reason: Optional[str] = None
    iterations_target: int
    next_iteration: int = 1
    incumbent: int = 0  # iteration number of the incumbent; 0 is the base
    incumbent_commit: str
    generation: int = 0  # bumps when the incumbent changes: fresh reference trials, fresh seeds
    consecutive_rejections: int = 0
    decisions: int = 0  # candidates that reached the gate's final word
    usage: dict[str, RoleUsage] = Field(default_factory=dict)
    rate_limits: dict[str, RateTally] = Field(default_factory=dict)  # per provider endpoint and model, as usage is per role
    best_history: list[BestChange] = Field(default_factory=list)
    # The end-of-run audits of the best against the base (audited policy): what was audited, each look, the outcome.
    audits: list[dict] = Field(default_factory=list)
    elapsed: float = 0.0  # seconds spent driving the run, summed over resumes
    updated_at: float = 0.0  # when the driver last wrote this file (status adds the time since, while it runs)
    current_step: str = ""
    # Evaluation name -> {simulation: fingerprint} already in `usage`: each one is charged once,
    # and saved in the same write as the usage it added, so no kill can lose or double it.
    charged: dict[str, dict[str, str]] = Field(default_factory=dict)


class CandidateRecord(BaseModel):
    """One proposal of an iteration: its patch, branch, and how far it got."""

    label: str  # "3" when the iteration has one candidate; "3a", "3b", ... when it has several
    status: IterationStatus = "proposing"
    title: str = ""
    rationale: str = ""
    edits: list[dict] = Field(default_factory=list)
    responses: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    branch: Optional[str] = None
    commit: Optional[str] = None
    reason: str = ""
    findings: list[str] = Field(default_factory=list)  # the static scan's, one line each: path:line: rule: detail
    investigation: dict = Field(default_factory=dict)  # what the proposer did: turns, tools, edits, tries, transcript (proposers.Outcome.stats)
    verdicts: list[dict] = Field(default_factory=list)
    gate_candidate: Optional[float] = None


class IterationRecord(Versioned):
    """One iteration: its candidates, all from the same parent, and the one kept, if any."""

    SCHEMA, MIGRATIONS, WHAT = ITERATION_SCHEMA, ITERATION_MIGRATIONS, "the iteration record"

    iteration: int
    parent: int
    parent_commit: str
    generation: int
    status: IterationStatus = "proposing"  # the furthest any candidate got; "accepted" when one was kept
    reason: str = ""
    candidates: list[CandidateRecord] = Field(default_factory=list)
    kept: Optional[str] = None  # the label of the kept candidate
    gate_incumbent: Optional[float] = None  # the incumbent measured beside the candidates (or its reference, before)
    gate_stages: list[dict] = Field(default_factory=list)  # the gate's decision over the set, stage by stage
    analysis: Optional[float] = None  # the kept candidate's analysis score, once measured
    usage: dict[str, RoleUsage] = Field(default_factory=dict)  # every role, all candidates together
    # Per provider endpoint and model: permits, 429s and seconds waited for the rate limit (evolver.ratelimit), meta-LLM included.
    rate_limits: dict[str, RateTally] = Field(default_factory=dict)
    charged: dict[str, dict[str, str]] = Field(default_factory=dict)  # as RunState.charged, for this iteration's evaluations

    def candidate(self, label: str) -> CandidateRecord:
        return next(c for c in self.candidates if c.label == label)

    @property
    def winner(self) -> Optional[CandidateRecord]:
        return self.candidate(self.kept) if self.kept else None


def slug(label: str) -> str:
    """A candidate's label as file and branch names use it: "3" -> "003", "3b" -> "003b"."""
    digits = label.rstrip(string.ascii_lowercase)
    return f"{int(digits):03d}{label[len(digits):]}"


def charge(holder: RunState | IterationRecord, name: str, simulations: Iterable[SimRecord]) -> None:
    """Add to ``holder`` (the run, or the iteration whose evaluation ``name`` is) the usage of every simulation
    it has not been charged for yet. Each is charged once, whatever reuses it later: gate stages that grow one
    evaluation, an evaluation measured again after an interruption; a retried infrastructure error is a new
    simulation, charged again. The caller saves ``holder`` before the evaluation's result is kept, so no kill
    can lose or double a charge."""
    charged = holder.charged.setdefault(name, {})
    for sim in simulations:
        key, mark = f"{sim.task_id}#{sim.trial}", _fingerprint(sim)
        if charged.get(key) == mark:
            continue
        charged[key] = mark
        for role, usage in sim.usage.items():
            holder.usage[role] = holder.usage.get(role, RoleUsage()).add(usage)
        add_tallies(holder.rate_limits, sim.rate_limits)


def _fingerprint(sim: SimRecord) -> str:
    """Tells one run of a simulation from another (a retry after an infrastructure error)."""
    return hashlib.sha1(sim.model_dump_json().encode()).hexdigest()[:16]


def runs_dir(repo: Path) -> Path:
    """Where a repository's runs and evaluations live."""
    return Path(repo) / RUNS


def eval_run_dir(repo: Path, run_id: str) -> EvalDir:
    """The folder of one `evolver eval` (runs/eval-…/): one evaluation, laid out as each of a run's."""
    return EvalDir(runs_dir(repo) / run_id)


class RunDir:
    def __init__(self, repo: Path, run_id: str):
        self.repo = Path(repo)
        self.run_id = run_id
        self.path = runs_dir(self.repo) / run_id

    # -- paths ---------------------------------------------------------------
    def evaluation(self, name: str) -> EvalDir:
        """One evaluation of the run, evals/<name>/ (analysis-g0, reference-g0, iter-003-gate, ...)."""
        return EvalDir(self.path / "evals" / name)

    def evaluations(self) -> list[EvalDir]:
        """Every evaluation the run has made or begun, by name."""
        folder = self.path / "evals"
        return [EvalDir(p) for p in sorted(folder.iterdir()) if p.is_dir()] if folder.exists() else []

    def worktree(self, name: str) -> Path:
        return self.path / "worktrees" / name

    def iteration_file(self, n: int) -> Path:
        return self.path / "iterations" / f"{n:03d}.json"

    @property
    def identifiers_file(self) -> Path:
        """Task-data identifiers of the run's domain, for the static scan (never shown to the meta-LLM)."""
        return self.path / "scan-identifiers.json"

    @property
    def prior_learnings_file(self) -> Path:
        """The learnings_file's text as the run started (what its proposer reads before the run's own learnings)."""
        return self.path / "prior-learnings.md"

    def proposal_dir(self, slug: str) -> Path:
        """One candidate's proposal ("003", or "003b" in an iteration of several): what the meta-LLM saw
        and did (digest.md or transcript.json, interrupted-N.json of sessions a kill cut off), its scratch copy."""
        return self.path / "proposals" / slug

    @property
    def log_file(self) -> Path:
        return self.path / "log.jsonl"

    @property
    def holdout_file(self) -> Path:
        return self.path / "holdout.json"

    @property
    def report_file(self) -> Path:
        return self.path / "report.html"

    @property
    def rate_limits_file(self) -> Path:
        return self.path / "rate_limits.json"

    def save_rate_limits(self, lanes: dict) -> None:
        """The driver's rate limiter as it is now (evolver.ratelimit's snapshot, per lane), for `evolver status`."""
        write_json_atomic(self.rate_limits_file, {"at": time.time(), "lanes": lanes})

    def rate_limits(self) -> dict:
        """The last snapshot the driver wrote ({"at": when, "lanes": {...}}); {} when there is none or it is unreadable."""
        try:
            found = json.loads(self.rate_limits_file.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) and isinstance(found.get("lanes"), dict) else {}

    def transfer(self, transfer_id: str) -> "TransferDir":
        """One `evolver transfer` of the run: a comparison per pair of kept steps, and transfer.json."""
        return TransferDir(self.path / "transfers" / transfer_id)

    def transfers(self) -> list[dict]:
        """Every finished transfer of the run (transfer.json), oldest first."""
        folder = self.path / "transfers"
        return [TransferDir(p).read() for p in sorted(folder.iterdir()) if (p / TransferDir.FILE).exists()] if folder.is_dir() else []

    # -- reading and writing ------------------------------------------------
    def exists(self) -> bool:
        return (self.path / "run.json").exists()

    def cut_off(self) -> Optional[str]:
        """Why nothing can resume a folder with no record (left by an evolver before the record came first); None for a run."""
        return f"{self.run_id} was cut off before it recorded its settings; start a new run" if self.path.is_dir() and not self.exists() else None

    def create(self, manifest: Manifest, state: RunState) -> None:
        """The run's folder, appearing at once with its record (run.json and state.json): a kill at any moment
        leaves either no run or one that `--resume` continues. Everything else lands after."""
        staging = runs_dir(self.repo) / f".{self.run_id}.starting"  # beside it, so the rename is atomic; hidden from run-*
        staging.mkdir(parents=True)
        try:
            write_json_atomic(staging / "run.json", manifest)
            write_json_atomic(staging / "state.json", state)
            staging.rename(self.path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def discard(self) -> None:
        """Remove the whole run: one that failed to start must not be left to resume."""
        shutil.rmtree(self.path, ignore_errors=True)

    def manifest(self) -> Manifest:
        return read_record(Manifest, self.path / "run.json")

    def state(self) -> RunState:
        return read_record(RunState, self.path / "state.json")

    def save_manifest(self, manifest: Manifest) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path / "run.json", manifest)

    def save_state(self, state: RunState) -> None:
        write_json_atomic(self.path / "state.json", state)

    def iteration(self, n: int) -> Optional[IterationRecord]:
        path = self.iteration_file(n)
        return read_record(IterationRecord, path) if path.exists() else None

    def iterations(self) -> list[IterationRecord]:
        folder = self.path / "iterations"
        return [read_record(IterationRecord, p) for p in sorted(folder.glob("*.json"))] if folder.exists() else []

    def save_iteration(self, record: IterationRecord) -> None:
        self.iteration_file(record.iteration).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.iteration_file(record.iteration), record)

    def identifiers(self) -> frozenset[str]:
        """The domain's task-data identifiers, for the static scan; empty when the run has none recorded."""
        path = self.identifiers_file
        return frozenset(json.loads(path.read_text())) if path.exists() else frozenset()

    def save_identifiers(self, identifiers: list[str]) -> None:
        write_json_atomic(self.identifiers_file, identifiers)

    def holdout(self) -> Optional[dict]:
        """{"base": mean reward, "best": mean reward} on the sealed holdout; None before the run measured it."""
        return json.loads(self.holdout_file.read_text()) if self.holdout_file.exists() else None

    def save_holdout(self, scores: dict) -> None:
        write_json_atomic(self.holdout_file, scores)

    def logged(self, event: str, **match) -> bool:
        """Whether log.jsonl already has this event (so a resumed step does not write it twice)."""
        try:
            lines = self.log_file.read_text().splitlines()
        except OSError:
            return False
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == event and all(entry.get(k) == v for k, v in match.items()):
                return True
        return False

    def log(self, event: str, **data) -> None:
        line = json.dumps({"at": time.time(), "event": event, **data})
        with open(self.log_file, "a") as fh:
            fh.write(line + "\n")

    # -- the lock -------------------------------------------------------------
    def lock(self):
        """Hold an exclusive lock on the run for the life of the returned file object."""
        self.path.mkdir(parents=True, exist_ok=True)
        fh = open(self.path / "lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise UsageError(f"run {self.run_id} is being driven by {holder}; wait for it or stop it first") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        return fh

    def is_locked(self) -> bool:
        path = self.path / "lock"
        if not path.exists():
            return False
        with open(path) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def comparison_dir(repo: Path, compare_id: str) -> ComparisonDir:
    """The folder of one `evolver compare` (runs/compare-…/)."""
    return ComparisonDir(runs_dir(repo) / compare_id)


def measured(repo: Path, name: str) -> dict[str, list]:
    """Every evaluation a run, a comparison or an evaluation (runs/<name>/) holds, by its folder's path inside: its records."""
    folder = runs_dir(repo) / name
    if not RUN_ID.fullmatch(name) or not folder.is_dir():
        known = sorted(p.name for p in runs_dir(repo).iterdir() if p.is_dir()) if runs_dir(repo).is_dir() else []
        raise UsageError(f"no run, comparison or evaluation '{name}' in {runs_dir(repo)}" + (f"; known: {', '.join(known[-5:])}" if known else ""))
    found = sorted({p.parent for pattern in ("evals/*/sims.jsonl", "*/sims.jsonl", "sims.jsonl", "transfers/*/*/*/sims.jsonl")
                    for p in folder.glob(pattern)})
    return {str(path.relative_to(folder)) or ".": EvalDir(path).records() for path in found}


def list_runs(repo: Path) -> list[RunDir]:
    """Every run folder of a repository (runs/run-*/), newest last; those cut off before their record too."""
    found = [RunDir(Path(repo), path.name) for path in runs_dir(repo).glob("run-*") if path.is_dir()]
    return sorted(found, key=lambda run: (run.path / "run.json" if run.exists() else run.path).stat().st_mtime)


def find_run(repo: Path, run_id: Optional[str]) -> RunDir:
    """A run by id, or the newest one when run_id is None."""
    runs = runs_dir(repo)
    if run_id is None:
        candidates = sorted((p for p in runs.glob("run-*") if (p / "run.json").exists()), key=lambda p: p.stat().st_mtime) if runs.exists() else []
        if not candidates:
            raise UsageError(f"no runs in {runs}; start one with `evolver run`")
        return RunDir(repo, candidates[-1].name)
    known = sorted(p.name for p in runs.glob("run-*")) if runs.exists() else []
    hint = f"; known runs: {', '.join(known[-5:])}" if known else "; start one with `evolver run`"
    if not RUN_ID.fullmatch(run_id):  # a path ("../elsewhere") is no run id: it would name branches git refuses
        raise UsageError(f"'{run_id}' is not a run id (a name under runs/, like run-20261125-201805-8fc2){hint}")
    run = RunDir(repo, run_id)
    if run.cut_off():
        raise UsageError(run.cut_off())
    if not run.exists():
        raise UsageError(f"unknown run id '{run_id}'{hint}")
    run.manifest()  # a damaged run.json says so in one line here, whatever the command goes on to read
    return run
