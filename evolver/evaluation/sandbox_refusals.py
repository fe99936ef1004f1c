"""Why the kernel, or a container runtime's seccomp profile, refused what the sandbox (evolver.evaluation.sandbox) asked
for, in one line that says how to allow it: Landlock, which it cannot do without, and the namespaces, which it can."""

from __future__ import annotations

import errno
from typing import Optional

LANDLOCK_SYSCALLS = "landlock_create_ruleset, landlock_add_rule and landlock_restrict_self"


def landlock_refusal(err: Optional[int], seccomp_filters: int) -> str:
    """One line: why Landlock's version query failed with ``err``, and what to do. The kernel answers
    ENOSYS (not built in) or EOPNOTSUPP (built in, not enabled), never EPERM: EPERM is a seccomp filter's
    answer, as a container runtime's profile gives for syscalls it does not allow."""
    if err == errno.EPERM:
        return (
            f"Landlock is blocked by the seccomp profile this process runs under (landlock_create_ruleset: EPERM; "
            f"Docker's default allows it from Docker 23.0 on): update the container runtime, or give it a seccomp profile "
            f"that allows {LANDLOCK_SYSCALLS}"
        )
    if err == errno.EOPNOTSUPP:
        return "Landlock is built into this kernel but not enabled (EOPNOTSUPP): add landlock to the kernel's lsm= boot parameter"
    missing = "Landlock is not available in this kernel (ENOSYS); it needs Linux 5.13+ built with Landlock (CONFIG_SECURITY_LANDLOCK)"
    if seccomp_filters:  # a runtime's profile may answer ENOSYS for syscalls it does not know (podman's before containers-common 0.49)
        return (
            f"{missing}, or the seccomp profile this process runs under does not know {LANDLOCK_SYSCALLS}; "
            f"in a container the kernel is the host's, or on macOS and Windows the runtime's VM's (see docs/container.md)"
        )
    return missing


def namespace_refusal(err: int, seccomp_filters: int, sysctl: dict[str, str]) -> str:
    """One line: why unshare(CLONE_NEWUSER | ...) failed with ``err``, and how to allow it. ``sysctl`` holds
    the values of user.max_user_namespaces and kernel.unprivileged_userns_clone where this kernel has them."""
    held = "the sandbox holds without them (Landlock keeps tau2's data out; the scratch is read-only, as nothing would bound it in all)"
    if err == errno.EINVAL:
        return f"no namespaces: this process has threads, and the kernel gives a threaded process no new user namespace; {held}"
    if err == errno.ENOSPC or sysctl.get("user.max_user_namespaces") == "0":
        return f"no namespaces: user namespaces are off here (user.max_user_namespaces is 0); {held}; to allow them: sysctl -w user.max_user_namespaces=10000"
    if err == errno.EPERM and sysctl.get("kernel.unprivileged_userns_clone") == "0":
        return f"no namespaces: unprivileged user namespaces are off here (kernel.unprivileged_userns_clone is 0); {held}; to allow them: sysctl -w kernel.unprivileged_userns_clone=1"
    if err == errno.EPERM and seccomp_filters:
        return (
            f"no namespaces: the seccomp profile this process runs under refuses unshare (EPERM; Docker's default allows it only "
            f"with CAP_SYS_ADMIN); {held}; to allow them, run the container with a seccomp profile that allows unshare (podman's default does)"
        )
    return f"no namespaces: unshare failed ({errno.errorcode.get(err, err)}); {held}"


def seccomp_filters_in_force() -> int:
    """How many seccomp filters this process runs under (a container runtime's, an outer sandbox's), from /proc."""
    try:
        with open("/proc/self/status") as fh:
            status = fh.read()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("Seccomp_filters:"):
            return int(line.split()[1])
    return 0


def userns_sysctls() -> dict[str, str]:
    values = {}
    for name in ("user.max_user_namespaces", "kernel.unprivileged_userns_clone"):
        try:
            with open("/proc/sys/" + name.replace(".", "/")) as fh:
                values[name] = fh.read().strip()
        except OSError:  # not this kernel's (unprivileged_userns_clone is Debian's and Ubuntu's)
            pass
    return values
