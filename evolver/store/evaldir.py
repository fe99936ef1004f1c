"""One evaluation's folder: `runs/eval-…/` of `evolver eval`, and each `evals/<name>/` of a run.

    request.json          the EvalRequest; request-<i>.json, worker i's share (local backend)
    status-<i>.json       worker i's state: importing, running, done, listed, usage_error, candidate_error
    claims/               one empty file per simulation a worker has started (when several share the grid)
    sims.jsonl            one SimRecord per finished simulation, each appended with one write()
    trajectories/         tau2's whole simulation, one file each, written before its line in sims.jsonl
    turns/                the model's view of each agent turn (store.turnview), one gzip file per simulation, written with its trajectory
    worker.log            the workers' output
    result-<T>.json       a run's EvalResult at T trials per task (result.json: that of `evolver eval`)

The evaluation side (the worker, the backends) writes it through EvalDir, the loop reuses its
results, the command line reads it. docs/run-directory.md is the contract.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Optional

from pydantic import BaseModel

from evolver.data import EvalRequest, EvalResult, SimRecord, write_bytes_atomic, write_json_atomic, write_text_atomic
from evolver.store.records import read_record
from evolver.store.turnview import TurnView

REQUEST = "request.json"
SIMS = "sims.jsonl"
TRAJECTORIES = "trajectories"
TURNS = "turns"
CLAIMS = "claims"
WORKER_LOG = "worker.log"
RESULT = "result.json"
CHECKOUT = "checkout"  # `evolver eval --ref`: the commit's worktree, while the evaluation runs
LISTING = "tasks"  # `evolver eval`: the task listing made before the embedded model starts


class EvalDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"EvalDir({str(self.path)!r})"

    # -- names ----------------------------------------------------------------------------------
    @property
    def request_file(self) -> Path:
        return self.path / REQUEST

    def shard_request_file(self, shard: int) -> Path:
        return self.path / f"request-{shard}.json"

    def status_file(self, shard: int) -> Path:
        return self.path / f"status-{shard}.json"

    @property
    def claims_dir(self) -> Path:
        return self.path / CLAIMS

    @property
    def sims_file(self) -> Path:
        return self.path / SIMS

    @property
    def trajectories_dir(self) -> Path:
        return self.path / TRAJECTORIES

    @property
    def log_file(self) -> Path:
        return self.path / WORKER_LOG

    def result_file(self, trials: Optional[int] = None) -> Path:
        """result-<trials>.json, what a run keeps of each size it measured; result.json without trials."""
        return self.path / (RESULT if trials is None else f"result-{trials}.json")

    @property
    def checkout_dir(self) -> Path:
        return self.path / CHECKOUT

    def listing(self) -> "EvalDir":
        """Where `evolver eval` lists its tasks (a run lists them in its own evaluation, `tasks`)."""
        return EvalDir(self.path / LISTING)

    def discard(self) -> None:
        """Remove the whole folder: nothing may be left that could pass for a result."""
        shutil.rmtree(self.path, ignore_errors=True)

    # -- the request and the workers --------------------------------------------------------
    def begin(self, req: EvalRequest) -> None:
        """Before any worker starts or resumes: the folder and request.json; the states and claims of
        earlier workers go, so neither their verdict is read nor what they claimed but never finished skipped."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.request_file, req)
        for old in self.path.glob("status-*.json"):
            old.unlink()
        shutil.rmtree(self.claims_dir, ignore_errors=True)

    def write_shard_request(self, req: EvalRequest) -> Path:
        """Worker ``req.shard``'s own request, the file it is started on."""
        path = self.shard_request_file(req.shard)
        write_json_atomic(path, req)
        return path

    def write_status(self, shard: int, state: str, **extra) -> None:
        write_json_atomic(self.status_file(shard), {"state": state, **extra})

    def read_status(self, shard: int) -> dict:
        """Worker ``shard``'s state; {} before it wrote one (or if it cannot be read)."""
        return _read_json(self.status_file(shard))

    def statuses(self) -> list[dict]:
        """Every worker's state, as read now."""
        return [_read_json(path) for path in sorted(self.path.glob("status-*.json"))]

    def open_claims(self) -> None:
        self.claims_dir.mkdir(exist_ok=True)

    def claim(self, task_id: str, trial: int, again: bool = False) -> bool:
        """Take one simulation, first come first served between the workers (O_EXCL); False when another has it.
        ``again``: its second chance after an infrastructure error, claimed apart from its first."""
        name = hashlib.sha1(
            f"{task_id}\0{trial}{chr(0) + 'again' if again else ''}".encode()
        ).hexdigest()  # task ids may hold any character
        try:
            os.close(os.open(self.claims_dir / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        return True

    def claimed(self) -> int:
        """Simulations some worker has started."""
        return len(os.listdir(self.claims_dir))

    def append_log(self, text: str) -> None:
        with open(self.log_file, "a") as fh:
            fh.write(text)

    def log_tail(self, size: int) -> str:
        """The last ``size`` bytes of worker.log; "" when there is none."""
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(max(0, self.log_file.stat().st_size - size))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    # -- simulations ------------------------------------------------------------------------
    def make_trajectories_dir(self) -> None:
        self.trajectories_dir.mkdir(parents=True, exist_ok=True)

    def write_trajectory(self, record: SimRecord, trajectory: BaseModel | str) -> None:
        """A simulation's trajectory, before its line in sims.jsonl, and its name in the record. A record
        that names one already (it came from a Ray node) keeps that file name, never its folder."""
        name = Path(record.trajectory_file).name if record.trajectory_file else f"{record.task_id}__trial{record.trial}.json"
        path = self.trajectories_dir / name
        if isinstance(trajectory, str):
            write_text_atomic(path, trajectory)
        else:
            write_json_atomic(path, trajectory)
        record.trajectory_file = f"{TRAJECTORIES}/{name}"

    def read_trajectory(self, record: SimRecord) -> Optional[str]:
        return (self.path / record.trajectory_file).read_text() if record.trajectory_file else None

    def write_turns(self, record: SimRecord, view: Optional[str | bytes]) -> None:
        """A simulation's turn view, before its line in sims.jsonl, and its name in the record; nothing when there is none.
        ``view``: its JSON text, stored compressed, or the compressed file as another evaluation folder holds it (from a
        Ray node). As with a trajectory, a name a record brings keeps only its file name."""
        if view is None:
            return
        name = Path(record.turns_file).name if record.turns_file else f"{record.task_id}__trial{record.trial}.json.gz"
        (self.path / TURNS).mkdir(exist_ok=True)
        data = view if isinstance(view, bytes) else gzip.compress(view.encode("utf-8"), mtime=0)  # mtime 0: the same view, the same bytes
        write_bytes_atomic(self.path / TURNS / name, data)
        record.turns_file = f"{TURNS}/{name}"

    def read_turns_file(self, record: SimRecord) -> Optional[bytes]:
        """The view's file as stored (compressed). Read by its file name in this evaluation's turns/ only: a record cannot
        send a reader to another evaluation's files."""
        try:
            return (self.path / TURNS / Path(record.turns_file).name).read_bytes() if record.turns_file else None
        except OSError:
            return None

    def read_turns(self, record: SimRecord) -> Optional[TurnView]:
        """The simulation's turn view; None when it has none, or it cannot be read (a damaged file is no evidence)."""
        data = self.read_turns_file(record)
        try:
            return TurnView.model_validate_json(gzip.decompress(data)) if data else None
        except (OSError, EOFError, ValueError):
            return None

    def append_sim(self, record: SimRecord | str) -> None:
        """One finished simulation (a record, or its JSON line as it came): one write() of the whole line,
        so the workers of one evaluation append to the same file and a kill tears at most the last line."""
        line = (record if isinstance(record, str) else record.model_dump_json()) + "\n"
        fd = os.open(self.sims_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def start_sims(self, lines: list[str]) -> int:
        """sims.jsonl holding these records' lines (a Ray group's finished simulations); its size in bytes."""
        data = "".join(line + "\n" for line in lines).encode()
        self.sims_file.write_bytes(data)
        return len(data)

    def records(self) -> list[SimRecord]:
        """Every simulation in sims.jsonl: a torn last line (a worker killed mid-write) is ignored, and
        a later record of the same task and trial (a retried infrastructure error) replaces an earlier one."""
        return read_sim_records(self.sims_file)

    def measured(self) -> dict[tuple[str, int], SimRecord]:
        """The simulations already measured, by (task, trial): an evaluation that resumes skips them.
        An infrastructure error is not measured: it runs again, and its later line wins."""
        return {(r.task_id, r.trial): r for r in self.records() if r.outcome != "infra_error"}

    def lines_written(self) -> int:
        """Lines in sims.jsonl: every simulation that ended, a retried one each time it ran."""
        try:
            with open(self.sims_file, "rb") as fh:
                return sum(1 for _ in fh)
        except FileNotFoundError:
            return 0

    def tail(self, offset: int = 0) -> "SimsTail":
        return SimsTail(self.sims_file, offset)

    def tally(self) -> "SimsTally":
        return SimsTally(self.sims_file)

    # -- results ----------------------------------------------------------------------------
    def result(self, trials: Optional[int] = None) -> Optional[EvalResult]:
        """The finished result of that size (result.json without trials); None when there is none."""
        path = self.result_file(trials)
        return read_record(EvalResult, path) if path.exists() else None

    def write_result(self, result: EvalResult, trials: Optional[int] = None) -> None:
        write_json_atomic(self.result_file(trials), result)

    def keep_result(self, result: EvalResult) -> bool:
        """A run's evaluation ended: its result is kept as result-<T>.json, and reused from then on instead of
        evaluating again, unless a worker was stopped (its result is incomplete: measured again next time)."""
        if result.worker_note:
            return False
        self.write_result(result, result.trials)
        return True

    def result_files(self) -> list[Path]:
        """result-<T>.json of every size measured, smallest first."""
        return sorted(self.path.glob("result-*.json"), key=lambda p: int(p.stem.split("-")[1]))

    def latest_result(self) -> Optional[EvalResult]:
        """The largest finished result; None before it has one."""
        files = self.result_files()
        return read_record(EvalResult, files[-1]) if files else None

    def measured_at(self) -> Optional[float]:
        """When the last result was written; None before the first."""
        return max((p.stat().st_mtime for p in self.result_files()), default=None)

    def summaries(self) -> list[dict]:
        """The summary of every result-<T>.json that can be read (a damaged one is left out)."""
        out = []
        for path in self.result_files():
            try:
                out.append(json.loads(path.read_text())["summary"])
            except (OSError, ValueError, KeyError):
                continue
        return out


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_sim_records(path: Path) -> list[SimRecord]:
    """Read a sims.jsonl (EvalDir.records: its rules)."""
    records: dict[tuple[str, int], SimRecord] = {}
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    for line in data.split(b"\n"):  # only a newline ends a record: a JSON string may hold U+2028 and its kin
        try:
            record = SimRecord.model_validate_json(line)
        except ValueError:
            continue
        records[(record.task_id, record.trial)] = record
    return list(records.values())


class SimsTail:
    """The complete lines appended to a sims.jsonl since the last read, from ``offset`` (bytes) on;
    a line still being written is read next time."""

    def __init__(self, path: Path, offset: int = 0):
        self.path, self.offset = Path(path), offset

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except OSError:
            return []
        whole = chunk.rfind(b"\n") + 1
        self.offset += whole
        return [line.decode() for line in chunk[:whole].split(b"\n") if line]


class SimsTally:
    """Simulations finished so far and their mean reward, as sims.jsonl grows: each read parses
    only the lines appended since the last one (progress is polled several times a second)."""

    def __init__(self, path: Path):
        self.tail = SimsTail(path)
        self.rewards: dict[tuple[str, int], Optional[float]] = {}  # a retried simulation's later record wins

    def read(self) -> tuple[int, Optional[float]]:
        for line in self.tail.read():
            try:
                record = SimRecord.model_validate_json(line)
            except ValueError:
                continue
            self.rewards[(record.task_id, record.trial)] = record.reward
        scored = [r for r in self.rewards.values() if r is not None]  # infrastructure errors have no reward
        return len(self.rewards), (sum(scored) / len(scored) if scored else None)

    def progress(self, total: int) -> tuple[int, int, Optional[float]]:
        """(finished, total, mean reward of the finished), as a backend's on_progress takes them."""
        done, mean = self.read()
        return done, total, mean
