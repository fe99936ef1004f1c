"""Results of pure computations kept between processes: the gate's noise floor, seconds of CPU at every
run start and every `--resume`, for inputs that repeat (a resumed run's reference, an agent run again).

A result is keyed by its inputs and by the source of the code that computes it, so a change to either
computes afresh; a file that cannot be read or does not match is computed again and rewritten. Kept in
EVOLVER_CACHE, else $XDG_CACHE_HOME/evolver, else ~/.cache/evolver (beside the embedded model).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

VERSION = 1


def cache_root() -> Path:
    override = os.environ.get("EVOLVER_CACHE")
    if override:
        return Path(override).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evolver"


def remembered(kind: str, inputs: dict, code: Iterable[Path], compute: Callable[[], object]) -> object:
    """``compute()``, or what it returned before for the same JSON ``inputs`` and source files ``code``.
    The value must survive JSON (floats: infinity is stored as null and read back as infinity)."""
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode())
    for path in sorted(code):
        digest.update(path.read_bytes())
    key = digest.hexdigest()
    path = cache_root() / kind / f"{key}.json"
    try:
        record = json.loads(path.read_text())
        if record.get("version") == VERSION and record.get("key") == key:
            value = record["value"]
            return float("inf") if value is None else value
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    value = compute()
    try:  # atomically: runs started at once compute the same value, and none reads half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as fh:
            json.dump({"version": VERSION, "key": key, "value": None if value == float("inf") else value}, fh)
        os.replace(fh.name, path)
    except OSError:  # a read-only or full home: the value is still right, only not kept
        pass
    return value
