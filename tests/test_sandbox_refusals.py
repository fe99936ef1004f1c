"""What the sandbox says when a kernel or a container runtime's seccomp profile refuses what it needs:
one line that names what was refused and how to allow it (docs/container.md)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from evolver.evaluation import sandbox
from evolver.evaluation.sandbox_refusals import landlock_refusal, namespace_refusal
from tests.conftest import ROOT, SCRIPTED_MODELS


@pytest.mark.parametrize(
    "err, filters, says",
    [
        (errno.EPERM, 1, ["blocked by the seccomp profile", "Docker 23.0", "landlock_add_rule", "landlock_restrict_self"]),
        (errno.EOPNOTSUPP, 0, ["not enabled", "lsm="]),
        (errno.ENOSYS, 0, ["Linux 5.13+", "CONFIG_SECURITY_LANDLOCK"]),
        (errno.ENOSYS, 2, ["Linux 5.13+", "seccomp profile", "docs/container.md"]),
    ],
)
def test_landlock_refusal_names_the_cause_and_the_remedy(err, filters, says):
    line = landlock_refusal(err, filters)
    assert "\n" not in line and all(s in line for s in says), line
    if err != errno.ENOSYS or not filters:
        assert "docs/container.md" not in line  # a bare kernel without Landlock is no container's doing


@pytest.mark.parametrize(
    "err, filters, sysctl, says",
    [
        (errno.EINVAL, 1, {}, "has threads"),
        (errno.ENOSPC, 0, {"user.max_user_namespaces": "0"}, "sysctl -w user.max_user_namespaces="),
        (errno.EPERM, 0, {"kernel.unprivileged_userns_clone": "0"}, "sysctl -w kernel.unprivileged_userns_clone=1"),
        (errno.EPERM, 1, {"user.max_user_namespaces": "63000"}, "seccomp profile this process runs under refuses unshare"),
        (errno.EPERM, 0, {"user.max_user_namespaces": "63000"}, "unshare failed (EPERM)"),
    ],
)
def test_namespace_refusal_names_the_cause_and_says_what_still_holds(err, filters, sysctl, says):
    line = namespace_refusal(err, filters, sysctl)
    assert "\n" not in line and says in line and "the sandbox holds without them" in line, line


@pytest.mark.skipif(sandbox.unavailable_reason() is not None, reason="the sandbox is not available here")
def test_eval_under_a_profile_that_blocks_landlock_refuses_in_one_line(repo):
    # As in a container of Docker before 23.0, whose default profile answered Landlock's syscalls with EPERM.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.scripts.under_seccomp",
            "landlock_create_ruleset",
            "--",
            sys.executable,
            "-m",
            "evolver",
            "eval",
            str(repo),
            *SCRIPTED_MODELS[:6],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        # No hand-over to a warm zygote another test left running: it runs outside this filter, where a container's
        # zygote would run inside it.
        env={**os.environ, "EVOLVER_ZYGOTE_IDLE": "0"},
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "Landlock is blocked by the seccomp profile" in lines[0] and "landlock_restrict_self" in lines[0]
    assert "--unsafe-no-sandbox" in lines[0] and not list((repo / "runs").iterdir())  # nothing that could pass for a result
