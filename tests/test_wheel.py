"""A non-editable install runs `evolver run`: the wheel carries the prompts, Harness.md and the template."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import git

pytestmark = pytest.mark.slow  # it installs evolver's wheel and starts a whole run
ROOT = Path(__file__).resolve().parent.parent

META = '''
from evolver.scripted import Reply, mock_script

PATCH = """TITLE: Keep titles exact
RATIONALE: created tasks had the wrong title
FILE: agent/agent.py
<<<<<<< SEARCH
Try to be helpful and always follow the policy.
=======
Try to be helpful and always follow the policy. Use the exact title the user gives.
>>>>>>> REPLACE
"""


def script(name, messages, tools):
    return Reply(PATCH) if name == "meta" else mock_script(name, messages, tools)
'''


def test_the_wheel_installs_and_runs_a_scripted_evolution(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [wheel] = wheels.glob("evolver-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for packaged in ("evolver/prompts/Harness.md", "evolver/baseline/tau_bench.py", "evolver/evaluation/sandbox.py"):
        assert packaged in names

    def files(folder: str, package: str, suffix: str = "") -> list[str]:
        """The files of a folder of the checkout, as the wheel names them."""
        return [
            f"{package}/{p.relative_to(ROOT / folder)}"
            for p in (ROOT / folder).rglob(f"*{suffix}")
            if p.is_file() and "__pycache__" not in p.parts
        ]

    # setuptools finds the packages: every module of evolver/, the whole template, every prompt in every proposer's folder
    ours = files("evolver", "evolver", ".py") + files("agent/templates", "evolver/baseline") + files("prompts", "evolver/prompts")
    assert sorted(ours) == sorted(
        n for n in names if n.startswith("evolver/") and (n.endswith(".py") or n.startswith(("evolver/baseline/", "evolver/prompts/")))
    )
    venv = tmp_path / "venv"
    # No pip of its own (ensurepip is most of a venv's making): this environment's pip installs into it (--python).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # The dependencies come from this environment's site-packages (offline); evolver itself only from the wheel.
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "wheel_meta.py").write_text(META)
    # No checkout on any path: pip would take its evolver.egg-info for an installed evolver.
    env = {**os.environ, "PYTHONPATH": str(scripts), "EVOLVER_SCRIPT": "wheel_meta:script", "EVOLVER_RUNTIME_DIR": str(tmp_path / "rt")}
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        env=env,
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=600,
    )
    # Run from a neutral directory: the checkout on sys.path would shadow the wheel.
    where = subprocess.run(
        [str(python), "-c", "import evolver; print(evolver.__file__)"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv))  # not the checkout

    target = tmp_path / "target"
    target.mkdir()
    git(target, "init", "-q", "-b", "main")
    git(target, "config", "user.email", "test@example.invalid")
    git(target, "config", "user.name", "test")
    evolver = str(venv / "bin" / "evolver")
    subprocess.run([evolver, "init", str(target)], env=env, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    git(target, "add", "-A")
    git(target, "commit", "-qm", "init")
    # (per-decision: the audited default's screen and end-of-run audit read nothing more from the wheel)
    proc = subprocess.run(
        [
            evolver,
            "run",
            str(target),
            "--iterations",
            "1",
            "--candidates",
            "1",
            "--gate-stages",
            "1",
            "--gate-policy",
            "per-decision",
            "--agent-model",
            "scripted/wrong",
            "--user-model",
            "scripted/user",
            "--judge-model",
            "scripted/judge",
            "--meta-model",
            "scripted/meta",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "iteration 1:" in proc.stderr and "Keep titles exact" in proc.stderr
    subprocess.run([evolver, "daemon", "stop"], env=env, cwd=tmp_path, capture_output=True, timeout=60)
