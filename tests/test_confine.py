"""The sandbox's file confinement, probed for real in a fresh process: tau2's task data is out
of reach whether a mount hides it or Landlock's grants leave it out, wherever it is installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolver.evaluation import sandbox

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="the sandbox is not available here")


def probe(mode: str, scratch: Path, *hide: Path, refused: str = "") -> dict:
    """``refused``: syscalls a seccomp filter refuses the probe with EPERM, as a container runtime's profile would."""
    wrap = [sys.executable, "-m", "tests.scripts.under_seccomp", refused, "--"] if refused else []
    proc = subprocess.run(
        [*wrap, sys.executable, "-m", "tests.scripts.confine_probe", mode, str(scratch), *map(str, hide)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the tmpfs lives in the agent's own mount namespace only, never in ours
    assert not [m for m in Path("/proc/self/mounts").read_text().splitlines() if m.startswith("none ") and "tmpfs" in m]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["mount", "landlock", "threaded"])
def test_task_data_is_unreadable_and_the_libraries_are_not(mode, tmp_path):
    out = probe(mode, tmp_path)
    p, iso = out["probes"], out["isolation"]
    assert p["tau2 tasks.json"] in ("FileNotFoundError", "PermissionError")
    assert p["tau2 data listing"] in ("ok: []", "PermissionError")
    assert p["tau2 module"].startswith("ok:") and p["stdlib os.py"].startswith("ok:")
    assert p["home listing"] == "PermissionError" and p["etc passwd"] == "PermissionError"
    if mode == "mount":
        assert iso["task_data_hidden_by"] == "tmpfs mount" and iso["readable_paths"] < 30
        assert "mount" in iso["namespaces"] and "namespaces_refused" not in iso
        # The scratch is a bounded tmpfs of the agent's own: 4 MiB in all here, and what is written
        # there never reaches the folder beneath it, which the trusted side owns.
        assert p["scratch write"].startswith("ok:") and iso["scratch"] == "tmpfs of 4 MiB" and p["scratch 6 MiB in all"] == "OSError"
        assert not list(tmp_path.iterdir())
    else:  # no mount: a folder on disk would bound each file only, so it is read-only
        assert iso["task_data_hidden_by"] == "landlock" and iso["readable_paths"] > 100
        assert iso["scratch"] == "directory, read-only (no tmpfs to bound it)"
        assert p["scratch write"] == p["scratch 6 MiB in all"] == "PermissionError" and not list(tmp_path.iterdir())
    if mode == "threaded":  # no namespaces: the kernel refuses them to a process with threads
        assert iso["namespaces"] == [] and "has threads" in iso["namespaces_refused"]


def test_a_seccomp_profile_that_refuses_unshare_leaves_the_rest_of_the_sandbox(tmp_path):
    # As under Docker's default profile (unshare only with CAP_SYS_ADMIN): no namespaces, result.json says
    # why and how to allow them, and Landlock alone keeps tau2's data and the home folder out.
    out = probe("mount", tmp_path, refused="unshare")
    p, iso = out["probes"], out["isolation"]
    assert iso["namespaces"] == [] and iso["task_data_hidden_by"] == "landlock" and iso["scratch"].startswith("directory")
    assert "seccomp profile" in iso["namespaces_refused"] and "allows unshare" in iso["namespaces_refused"]
    assert p["tau2 tasks.json"] in ("FileNotFoundError", "PermissionError") and p["home listing"] == "PermissionError"
    assert p["tau2 module"].startswith("ok:") and p["scratch write"] == "PermissionError"


@pytest.mark.parametrize("mode", ["mount", "landlock"])
def test_a_folder_inside_a_root_granted_whole_stays_hidden(mode, tmp_path):
    # The standard library is granted whole: a hidden folder inside it must still be out of
    # reach, as tau2's data would be were tau2 installed under /usr/lib or /usr/local/lib.
    json_pkg = Path(json.__file__).resolve().parent
    out = probe(mode, tmp_path, json_pkg)
    assert out["probes"]["hidden file"] in ("FileNotFoundError", "PermissionError")
    assert out["probes"]["hidden listing"] in ("ok: []", "PermissionError")
    assert out["probes"]["stdlib os.py"].startswith("ok:")
