"""The README's commands, as the README writes them, through the command line: its main command, and the block
that sets up and evolves a repository of one's own.

The main command's install part is the test environment's own; the evolver command after it runs in a repository set up by
`evolver init` whose evolver.toml names the tiny test domain (on tau2's mock domain the scripted agent passes
every task, and a run stops at its baseline), with the models scripted through EVOLVER_* variables (the README's
command names none: on a user's machine they are the embedded model's, which tests/test_local_model.py runs
through `evolver eval`).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from tests.conftest import ROOT, git, run_cli
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


def own_agent_block() -> list[str]:
    """The commands of the README's "Using it on your own agent" block, in order, without their comments."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Using it on your own agent") :].split("```")[1]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_readmes_own_agent_block_runs_in_order(tmp_path):
    """Each line of the block through the command line, one after another in one repository, as a user types them.
    Two things differ from a user's machine: the domain is the tiny test domain, registered as a user registers
    theirs (the `plugins` setting, here from EVOLVER_PLUGINS), where the block names retail; and the models are
    scripted (a meta-agent that finds the tiny domain's fault). `<run-id>` is the id the run printed."""
    lines = own_agent_block()
    assert lines[0].startswith("cd ") and lines[-1].startswith("git merge evolver/<run-id>/best"), lines
    repo = tmp_path / "my-agent-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "test@example.invalid")
    git(repo, "config", "user.name", "test")
    env = {**SCRIPTED, "EVOLVER_SCRIPT": "tests.scripts.loop_cases:investigator_script", "EVOLVER_PLUGINS": "tests.scripts.tiny_domain"}
    run_id = None
    for line in lines[1:]:
        line = line.replace("<run-id>", run_id or "<run-id>")
        words = shlex.split(line)
        if words[0] == "evolver":
            args = ["evolver_tiny" if w == "retail" else w for w in words[1:]]
            proc = run_cli(args, cwd=repo, env=env, timeout=900)
            assert proc.returncode == 0, (line, proc.stderr[-3000:])
            if args[0] == "init":
                assert (repo / "agent" / "agent.py").is_file() and (repo / "evolver.toml").is_file()
            elif args[0] == "eval":
                assert "evolver_tiny" in proc.stdout + proc.stderr
            elif args[0] == "run":
                [run] = (repo / "runs").glob("run-*")
                run_id = run.name
                assert f"adopt it with `git merge evolver/{run_id}/best`" in proc.stdout, proc.stdout[-2000:]
            elif args[0] == "history":
                assert run_id in proc.stdout and "best" in proc.stdout
        else:  # git, as the block writes it
            for part in line.split(" && "):
                subprocess.run(shlex.split(part), cwd=repo, check=True, capture_output=True, text=True)
    assert run_id is not None
    # The merge brought the run's best, a changed agent/, into the user's branch.
    assert git(repo, "rev-parse", "HEAD:agent") == git(repo, "rev-parse", f"evolver/{run_id}/best:agent")
    assert git(repo, "rev-parse", "HEAD:agent") != git(repo, "rev-parse", "ORIG_HEAD:agent")
