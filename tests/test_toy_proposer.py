"""A new proposer kind is one file and one registry entry (evolver.kinds.PROPOSERS): tests/scripts/toy_proposer.py
registers one and runs `evolver run --proposer toy` through the command line, with nothing else of evolver changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT, run_cli
from tests.test_loop import tiny_target
from tests.test_readme import SCRIPTED


def toy_evolver(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.scripts.toy_proposer", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **SCRIPTED, "PYTHONPATH": str(ROOT)},
    )


def test_a_fourth_proposer_kind_runs_from_the_command_line(tmp_path):
    repo = tiny_target(tmp_path / "target")
    # Without its registry entry the kind does not exist: one line, exit 2, nothing run.
    plain = run_cli(["run", str(repo), "--proposer", "toy", "--iterations", "1"], env=SCRIPTED)
    assert plain.returncode == 2 and "toy" in plain.stderr and not list(repo.glob("runs/run-*")), plain.stderr[-2000:]
    helped = toy_evolver("run", "--help")
    assert "toy: the same fixed edit every time" in " ".join(helped.stdout.split())  # its docs line, from the entry
    proc = toy_evolver("run", str(repo), "--proposer", "toy", "--iterations", "1", "--candidates", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run] = (repo / "runs").glob("run-*")
    history = json.loads(run_cli(["history", run.name, "--repo", str(repo), "--json"]).stdout)
    [cand] = history["candidates"]
    assert cand["title"] == "Keep the user's exact title" and cand["verdict"] != "no_patch", cand
    assert json.loads((run / "run.json").read_text())["config"]["proposer"] == "toy"
