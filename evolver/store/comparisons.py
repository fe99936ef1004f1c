"""A comparison's folder (`evolver compare`: runs/<compare-id>/) and a transfer's (`evolver transfer`:
runs/<run>/transfers/<transfer-id>/, a comparison per pair of kept steps): what they hold and where.

    runs/compare-…/            a/ and b/: each arm's evaluation (store.evaldir); checkout-a/, checkout-b/
                               while a ref is checked out; tasks/: the task listing; comparison.json
    runs/run-…/transfers/ID/   base-best/ (or one folder per pair): a comparison as above; transfer.json
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from evolver.data import write_json_atomic
from evolver.errors import UsageError
from evolver.store.evaldir import EvalDir


class _RecordDir:
    """A folder with one JSON record (FILE), its task listing, and nothing worth keeping if discarded."""

    FILE = ""

    def __init__(self, path: Path):
        self.path = Path(path)

    def listing(self) -> EvalDir:
        return EvalDir(self.path / "tasks")

    @property
    def file(self) -> Path:
        return self.path / self.FILE

    def save(self, record: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.file, record)

    def discard(self) -> None:
        """Remove the whole folder: a comparison that could not start must leave nothing behind."""
        shutil.rmtree(self.path, ignore_errors=True)


class ComparisonDir(_RecordDir):
    FILE = "comparison.json"

    def arm(self, name: str) -> EvalDir:
        return EvalDir(self.path / name)

    def checkout_dir(self, name: str) -> Path:
        return self.path / f"checkout-{name}"


class TransferDir(_RecordDir):
    FILE = "transfer.json"

    def pair(self, name: str) -> ComparisonDir:
        return ComparisonDir(self.path / name)

    def read(self) -> dict:
        try:
            return json.loads(self.file.read_text())
        except (OSError, ValueError):
            raise UsageError(f"{self.file} is unreadable or corrupt; remove it, or run the transfer again") from None
