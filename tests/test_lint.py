"""ruff, as configured in pyproject.toml: the code is linted and formatted (CI runs the suite, so it runs this)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing_to_lint():
    proc = ruff("check", "--output-format", "concise")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


def test_the_code_is_formatted_as_ruff_formats_it():
    proc = ruff("format", "--check")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
