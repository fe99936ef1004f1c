"""Candidates that cannot change a simulation cost none; the worker never guesses a trial number."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from evolver.cli.scaffold import init_repo
from evolver.evolution import patch
from evolver.evolution.noop import inert_edit_reason

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = re.findall(r"```\n(TITLE:.*?)```", (ROOT / "Harness.md").read_text(), re.S)[1:]  # H2, H3, H4, H5


def _pair(tmp_path: Path, proposal: str, switch: str | None = None) -> tuple[Path, Path]:
    parent, candidate = tmp_path / "parent", tmp_path / "candidate"
    init_repo(parent)
    init_repo(candidate)
    patch.apply_edits(candidate, patch.parse_proposal(proposal).edits)
    if switch:
        for root in (parent, candidate):  # on in both: the patch itself does not switch it
            toml = root / "agent" / "harness.toml"
            toml.write_text(toml.read_text().replace(f"{switch} = false", f"{switch} = true"))
    return parent, candidate


@pytest.mark.parametrize("example, layer", [(0, "h2_action_realization"), (2, "h4_trajectory_regulation")])
def test_edits_only_inside_a_layer_that_is_off_are_refused(tmp_path, example, layer):
    parent, candidate = _pair(tmp_path, EXAMPLES[example])
    reason = inert_edit_reason(parent, candidate)
    assert reason and layer in reason and "switch the layer on" in reason


@pytest.mark.parametrize("example, layer", [(0, "h2_action_realization"), (2, "h4_trajectory_regulation")])
def test_the_same_edits_count_when_the_layer_is_on(tmp_path, example, layer):
    parent, candidate = _pair(tmp_path, EXAMPLES[example], switch=layer)
    assert inert_edit_reason(parent, candidate) is None


@pytest.mark.parametrize("example", [1, 3])  # H3 and H5 switch their layer on in the same patch
def test_a_patch_that_switches_its_layer_on_counts(tmp_path, example):
    assert inert_edit_reason(*_pair(tmp_path, EXAMPLES[example])) is None


def test_a_skill_without_h5_is_refused_and_a_prompt_edit_always_counts(tmp_path):
    skill = "TITLE: t\nRATIONALE: r\nFILE: agent/skills/new-skill.md\n<<<<<<< SEARCH\n=======\n# New\n\nUse when asked.\n>>>>>>> REPLACE\n"
    assert "h5_procedural_skills" in inert_edit_reason(*_pair(tmp_path / "a", skill))
    prompt = (
        "TITLE: t\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\nTry to be helpful and always follow the policy."
        "\n=======\nTry to be helpful, brief, and always follow the policy.\n>>>>>>> REPLACE\n"
    )
    assert inert_edit_reason(*_pair(tmp_path / "b", prompt)) is None


def test_a_comment_or_a_docstring_is_refused(tmp_path):
    # the embedded 1.5B's whole fix in the README's main job: a comment among the imports
    comment = (
        "TITLE: t\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\nfrom pathlib import Path\n=======\n"
        "# Add the missing required information\nfrom pathlib import Path\n>>>>>>> REPLACE\n"
    )
    assert "only comments, layout or a docstring" in inert_edit_reason(*_pair(tmp_path / "a", comment))
    docstring = (
        "TITLE: t\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\n"
        '    """A tau2 local agent; tau2 builds one per simulation."""\n=======\n'
        '    """A tau2 local agent, one per simulation."""\n>>>>>>> REPLACE\n'
    )
    assert "only comments, layout or a docstring" in inert_edit_reason(*_pair(tmp_path / "b", docstring))


def test_the_worker_reads_the_trial_from_tau2_and_never_guesses(tmp_path):
    from evolver.data import EvalRequest, RoleModel
    from evolver.evaluation.worker.recorder import Recorder

    role = RoleModel(model="scripted/agent")
    req = EvalRequest(
        checkout=str(tmp_path), out_dir=str(tmp_path / "out"), domain="mock", trials=3, seed=300, agent=role, user=role, judge=role
    )
    recorder = Recorder(req, run_task=None, total=3)

    def _run(task, trial, seed, progress_str):  # shaped like tau2's run_tasks._run
        return recorder._trial("t", seed, sys._getframe(0))

    assert [_run(None, n, 12345, "") for n in (2, 0, 1)] == [2, 0, 1]  # whatever the seed says

    def elsewhere():
        return recorder._trial("t", 12345, sys._getframe(0))

    with pytest.raises(RuntimeError, match="cannot tell which trial"):
        elsewhere()  # no _run frame and a seed tau2 never drew: stop, do not write trial 0


def test_a_renamed_h2_helper_is_still_inside_h2(tmp_path):
    """The layers come from the code, not a table of names: a helper renamed by the patch stays in its layer."""
    rename = (
        "TITLE: t\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\n"
        "    matches = [t for t in schemas if squash(t) == squash(name)]\n=======\n"
        "    matches = [t for t in schemas if squashed(t) == squashed(name)]\n>>>>>>> REPLACE\n"
        "FILE: agent/agent.py\n<<<<<<< SEARCH\ndef squash(name: str) -> str:\n=======\n"
        "def squashed(name: str) -> str:\n>>>>>>> REPLACE\n"
    )
    reason = inert_edit_reason(*_pair(tmp_path / "off", rename))
    assert reason and "h2_action_realization" in reason
    assert inert_edit_reason(*_pair(tmp_path / "on", rename, switch="h2_action_realization")) is None
