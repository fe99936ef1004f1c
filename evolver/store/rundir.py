"""The run directory: what a run is (run.json), where it stands (state.json), each iteration,
its evaluations (evaldir.EvalDir), proposals and holdout, the event log, and the lock that keeps
two processes from driving one run.

    runs/<run-id>/
      run.json  state.json  iterations/NNN.json  proposals/NNN/  evals/<name>/  log.jsonl
      holdout.json  scan-identifiers.json  worktrees/<name>/  lock  report.html

Every write is atomic, so a run killed at any moment can be resumed. Each record (run.json,
state.json, iterations/NNN.json) carries its schema and is brought up to this evolver's by
named steps when an older one is read (the records and their schemas: evolver.store.runstate);
docs/run-directory.md is the contract.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Optional

from evolver.data import write_json_atomic
from evolver.errors import UsageError
from evolver.store.comparisons import ComparisonDir, TransferDir
from evolver.store.evaldir import EvalDir
from evolver.store.records import read_record
from evolver.store.runstate import IterationRecord, Manifest, RunState

RUNS = "runs"  # in the evaluated repository: every run and evaluation, ignored by git
LOCK_WAIT = 3.0  # seconds a run waits for a holder that is being killed (RunDir.lock)


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
        return (
            f"{self.run_id} was cut off before it recorded its settings; start a new run"
            if self.path.is_dir() and not self.exists()
            else None
        )

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

    def best_label(self, state: Optional[RunState] = None) -> str:
        """The candidate the run's best is ("" the base); a run from before the pool recorded only its iteration."""
        state = state or self.state()
        if state.best_label is not None:
            return state.best_label
        record = self.iteration(state.incumbent) if state.incumbent else None
        return (record.kept or "") if record else ""

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
        # A run driven in a fork of the warm zygote outlives its killed command by the moment the zygote
        # takes to see the command gone and kill it: a resume right after such a kill waits that out.
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
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
        raise UsageError(
            f"no run, comparison or evaluation '{name}' in {runs_dir(repo)}" + (f"; known: {', '.join(known[-5:])}" if known else "")
        )
    found = sorted(
        {
            p.parent
            for pattern in ("evals/*/sims.jsonl", "*/sims.jsonl", "sims.jsonl", "transfers/*/*/*/sims.jsonl")
            for p in folder.glob(pattern)
        }
    )
    return {str(path.relative_to(folder)) or ".": EvalDir(path).records() for path in found}


def list_runs(repo: Path) -> list[RunDir]:
    """Every run folder of a repository (runs/run-*/), newest last; those cut off before their record too."""
    found = [RunDir(Path(repo), path.name) for path in runs_dir(repo).glob("run-*") if path.is_dir()]
    return sorted(found, key=lambda run: (run.path / "run.json" if run.exists() else run.path).stat().st_mtime)


def find_run(repo: Path, run_id: Optional[str]) -> RunDir:
    """A run by id, or the newest one when run_id is None."""
    runs = runs_dir(repo)
    if run_id is None:
        candidates = (
            sorted((p for p in runs.glob("run-*") if (p / "run.json").exists()), key=lambda p: p.stat().st_mtime) if runs.exists() else []
        )
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
