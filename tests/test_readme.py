"""The README's main command, as the README writes it, through the command line.

Its install part is the test environment's own; the evolver command after it runs in a repository set up by
`evolver init` whose evolver.toml names the tiny test domain (on tau2's mock domain the scripted agent passes
every task, and a run stops at its baseline), with the models scripted through EVOLVER_* variables (the README's
command names none: on a user's machine they are the embedded model's, which tests/test_local_model.py runs
through `evolver eval`).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.conftest import ROOT, run_cli
from tests.test_loop import tiny_target

SCRIPTED = {
    "EVOLVER_AGENT_MODEL": "scripted/agent",
    "EVOLVER_USER_MODEL": "scripted/user",
    "EVOLVER_JUDGE_MODEL": "scripted/judge",
    "EVOLVER_META_MODEL": "scripted/meta",
    "EVOLVER_SCRIPT": "tests.scripts.loop_cases:script",
}


def main_command() -> list[str]:
    """The arguments of the README's main command, after `.venv/bin/evolver`."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("Run the main job") :].split("```")[1]
    [line] = [ln for ln in block.splitlines() if ln.strip()]
    install, _, evolver = line.partition(".venv/bin/evolver ")
    assert install.startswith("python3 -m venv .venv && .venv/bin/pip install -e '.[local]'"), install
    return shlex.split(evolver)


@pytest.mark.slow
def test_the_readmes_main_command_runs_to_its_end(tmp_path):
    repo = tiny_target(tmp_path / "target")
    args = main_command()
    assert args[0] == "run"
    proc = run_cli([*args, str(repo)], env=SCRIPTED, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^run run-\S+: ", proc.stderr, re.MULTILINE) and "measuring the baseline" in proc.stderr
    assert "best: evolver/run-" in proc.stdout  # the branch to merge, or that there is nothing to merge
    [run] = (repo / "runs").glob("run-*")
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "finished" and state["next_iteration"] == 3, state["stop_reason"]  # the two iterations it asks for
