"""Confine the process that runs a candidate's agent code (an LLM wrote it: hostile until proven otherwise).

Why these mechanisms (all in the Linux kernel, reached through maintained bindings):

- Landlock (`landlock` on PyPI), for files: the process may read the Python
  standard library, site-packages minus tau2's task data, evolver's own package,
  the system's shared libraries and its copy of the candidate's agent/; it may
  write only its scratch directory. Nothing else exists for it: not the run
  directory, the repository or its .git, the user's home, /proc, the
  zygote's socket. Unprivileged, stackable, no set-up outside the process.
  Landlock only grants, so leaving tau2's data out of a granted folder takes a
  rule for every other entry beside it (about 570 rules, 5-6 ms per process);
  where the process has its own mount namespace an empty read-only tmpfs is
  mounted over the data instead, and the folders are granted whole (about 10
  rules). Either way the data is out of reach.
- seccomp (`pyseccomp`, on the system's libseccomp), for what Landlock does not
  cover: no new processes (fork, exec, clone without CLONE_THREAD; threads stay
  allowed), no sockets at all (so no network and no connection to any local
  service; the channel to the evaluator is inherited), no signals to other
  processes, no ptrace or reading other processes' memory, no namespace,
  mount, bpf, io_uring or keyring calls.
- user + mount + network + IPC namespaces where the kernel allows them (an extra
  layer: even a socket, if one were made, would see only a down loopback; the
  mount namespace carries the tmpfs over tau2's data, and a bounded tmpfs as
  the scratch directory, so the candidate's writes are limited in all and stay in
  memory the trusted side never reads; without that mount the scratch is read-only,
  since a folder on disk bounds each file, never their sum).
- resource limits: address space (memory) above what the process already maps,
  CPU seconds, file size, open files, no core dumps.

bubblewrap was the other candidate: it needs a Debian package, and exec'ing a
fresh interpreter per simulation would pay tau2's 3-5 s import every time; here
a warm, keyless zygote forks the agent process and it confines itself before it
imports a line of candidate code.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import resource
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from evolver.evaluation.sandbox_refusals import landlock_refusal, namespace_refusal, seccomp_filters_in_force, userns_sysctls

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
PR_SET_PDEATHSIG = 1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8

# Denied outright: process creation and replacement, sockets, other processes' memory,
# namespaces and mounts, and kernel interfaces an agent never needs.
DENIED_SYSCALLS = (
    "fork",
    "vfork",
    "execve",
    "execveat",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "kcmp",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",  # no signals at all (abort() still ends the process)
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "mknod",
    "mknodat",
    "personality",
    "ioperm",
    "iopl",
    "swapon",
    "reboot",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "acct",
    "quotactl",
    "syslog",
)

SYSTEM_LIBS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo")


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 1024  # address space on top of what the forked process already maps
    cpu_seconds: int = 600
    file_mb: int = 64
    open_files: int = 256
    scratch_mb: int = 64  # the scratch directory in all, where it can be a tmpfs of its own (a mount namespace)


class SandboxUnavailable(RuntimeError):
    """The mechanisms are missing here; the message says which and what to do."""


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> Optional[str]:
    """None when the sandbox can be set up on this system, else one line saying what is missing."""
    if not sys.platform.startswith("linux"):
        return f"the agent sandbox needs Linux (Landlock and seccomp); this is {sys.platform}"
    try:
        import landlock

        ctypes.set_errno(0)  # the binding reads ctypes' errno, not the call's result: a stale one would read as a refusal
        abi = landlock.landlock_abi_version()
    except ImportError:
        return "the 'landlock' package is not installed; reinstall evolver"
    except OSError as exc:
        return landlock_refusal(exc.errno, seccomp_filters_in_force())
    if abi < 1:
        return "Landlock is not available in this kernel"
    try:
        import pyseccomp

        pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    except (ImportError, OSError, RuntimeError) as exc:
        return f"seccomp filters cannot be built ({exc}); install libseccomp (Debian: apt-get install libseccomp2)"
    return None


def require_sandbox(cfg) -> None:
    """Refuse to run candidate code where it cannot be confined, unless the user gave up the sandbox
    by flag (``cfg.unsafe_no_sandbox`` of an evolver.config.Config)."""
    if cfg.unsafe_no_sandbox:
        return
    reason = unavailable_reason()
    if reason:
        from evolver.errors import UsageError

        raise UsageError(
            f"{reason}; unconfined, candidate code could read your keys and files and forge its score: "
            "run where the sandbox works, or pass --unsafe-no-sandbox to accept that risk"
        )


@functools.lru_cache(maxsize=1)
def hidden_paths() -> tuple[Path, ...]:
    """What a confined agent process must never read, wherever it is installed: tau2's task
    data (the expected actions and answers live there), and any packages folder inside the
    standard library that this interpreter does not use (another tau2 could be there)."""
    from tau2.utils.utils import DATA_DIR

    used = {p.resolve() for p in _site_packages()}
    unused = [root / name for root in _stdlib_roots() for name in ("site-packages", "dist-packages")]
    return (Path(DATA_DIR).resolve(), *(p.resolve() for p in unused if p.is_dir() and p.resolve() not in used))


def _stdlib_roots() -> list[Path]:
    return [Path(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")]  # in a venv, platstdlib holds its site-packages


def _site_packages() -> list[Path]:
    return [Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


@functools.lru_cache(maxsize=1)
def readable_roots() -> tuple[Path, ...]:
    """The folders an agent process reads, hidden paths and all; the same for every agent
    process, so computed once, in the zygote, before it forks."""
    import evolver

    paths = [Path(p) for p in SYSTEM_LIBS] + _stdlib_roots() + _site_packages() + [Path(evolver.__file__).parent]
    return distinct(paths)


@functools.lru_cache(maxsize=2)
def _grants(hidden_by_mount: bool) -> tuple[Path, ...]:
    """The read grants: the roots whole when a mount hides what must stay hidden; otherwise
    every root with the hidden paths cut out, entry by entry along the way to each."""
    roots, hidden = readable_roots(), hidden_paths()
    if hidden_by_mount:
        return roots
    return distinct(p for root in roots for p in excluding(root, hidden))


def excluding(root: Path, hidden: tuple[Path, ...]) -> list[Path]:
    if root in hidden:
        return []
    if not any(root in h.parents for h in hidden):
        return [root]
    return [p for entry in root.iterdir() for p in excluding(entry.resolve(), hidden)]


def distinct(paths) -> tuple[Path, ...]:
    seen: dict[Path, None] = {}
    for p in paths:
        p = Path(p).resolve()
        if p.exists():
            seen.setdefault(p)
    return tuple(seen)


def confine(extra_readable: list[Path], scratch: Path, limits: Limits) -> dict:
    """Confine this process for good: it may then read the libraries and ``extra_readable``,
    and write ``scratch``. Call it single-threaded, before any candidate code runs.
    Returns what is in force, for result.json."""
    reason = unavailable_reason()
    if reason:
        raise SandboxUnavailable(reason)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the zygote gone, nothing of ours runs on
    _set_limits(limits)
    ids = os.getuid(), os.getgid()  # as the parent namespace knows them; unmapped, the new one shows 65534
    namespaces, refused = _unshare(libc)
    hidden_by_mount = "mount" in namespaces and _mount_over(libc, hidden_paths())
    scratch_bounded = "mount" in namespaces and _map_own_ids(*ids) and _mount_scratch(libc, scratch, limits.scratch_mb)
    readable = _grants(hidden_by_mount) + tuple(p for p in extra_readable if p.exists())
    abi = _landlock(readable, scratch, writable=scratch_bounded)
    _seccomp_filter().load()
    return {
        "mode": "sandbox",
        "landlock_abi": abi,
        "seccomp": True,
        "namespaces": namespaces,
        **({"namespaces_refused": refused} if refused else {}),
        "task_data_hidden_by": "tmpfs mount" if hidden_by_mount else "landlock",
        "scratch": f"tmpfs of {limits.scratch_mb} MiB" if scratch_bounded else "directory, read-only (no tmpfs to bound it)",
        "limits": asdict(limits),
        "readable_paths": len(readable),
    }


def _vm_size() -> int:
    with open("/proc/self/statm") as fh:  # its first field is VmSize, in pages
        return int(fh.read().split()[0]) * resource.getpagesize()


def _set_limits(limits: Limits) -> None:
    mib = 1024 * 1024
    memory = _vm_size() + limits.memory_mb * mib
    for kind, value in (
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_FSIZE, limits.file_mb * mib),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(kind, (value, value))


def _unshare(libc) -> tuple[list[str], Optional[str]]:
    """New user, mount, network and IPC namespaces when the kernel allows them unprivileged
    (without the mount namespace if only that is refused); else none, and the line that says why."""
    for flags, names in ((CLONE_NEWNS, ["mount"]), (0, [])):
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | flags) == 0:
            return ["user", *names, "net", "ipc"], None
    return [], namespace_refusal(ctypes.get_errno(), seccomp_filters_in_force(), userns_sysctls())


def _mount_over(libc, paths: tuple[Path, ...]) -> bool:
    """An empty read-only tmpfs over each path, in this process's own mount namespace
    (nothing outside it sees the mounts; seccomp and Landlock then forbid unmounting)."""
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    for path in paths:
        if path.is_dir() and libc.mount(b"none", str(path).encode(), b"tmpfs", flags, b"size=4k,mode=555") != 0:
            return False
    return True


def _map_own_ids(uid: int, gid: int) -> bool:
    """Map this process's own uid and gid into its new user namespace (what an unprivileged process
    may do): a tmpfs mounted there can then create files owned by it (unmapped, they fail with
    EOVERFLOW). Access to everything outside is unchanged: the kernel checks the same ids."""
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    except OSError:
        return False
    return True


def _mount_scratch(libc, scratch: Path, size_mb: int) -> bool:
    """A tmpfs of ``size_mb`` over the scratch directory, so that all the candidate writes, in every
    file together, is bounded (the file-size limit bounds one file): a disk filled by one candidate
    would fail the evaluations running beside it. The process then works inside the mount."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"none", str(scratch).encode(), b"tmpfs", flags, f"size={size_mb}m,mode=700".encode()) != 0:
        return False
    os.chdir(scratch)  # the working directory still named the folder beneath the mount
    return True


def _landlock(readable: list[Path], scratch: Path, writable: bool) -> int:
    """``writable``: the scratch is a bounded tmpfs. A folder on disk is granted for reading only: the
    file-size limit bounds each file, and files without number would fill the disk the evaluations share."""
    import landlock
    from landlock import FSAccess

    read_dir, read_file = FSAccess.READ_FILE | FSAccess.READ_DIR, FSAccess.READ_FILE
    # The binding judges its calls by ctypes' errno, not by their results: a refused unshare
    # or mount before this would read as Landlock's own failure.
    ctypes.set_errno(0)
    ruleset = landlock.Ruleset()  # handles every access right this kernel knows: all denied unless granted
    for path in readable:
        ruleset.allow(path, rules=read_dir if path.is_dir() else read_file)
    ruleset.allow(Path(scratch), rules=FSAccess.all() if writable else read_dir)
    for dev in ("/dev/null", "/dev/urandom"):
        ruleset.allow(dev, rules=FSAccess.READ_FILE | FSAccess.WRITE_FILE)
    ruleset.apply()
    return landlock.landlock_abi_version()


def prepare() -> None:
    """Do once, in the zygote, what is the same for every agent process it will fork."""
    if unavailable_reason() is None:
        _grants(True)
        _grants(False)
        _seccomp_filter()


@functools.lru_cache(maxsize=1)
def _seccomp_filter():
    """The filter, built once (libseccomp's context is plain memory: a fork inherits it)."""
    import pyseccomp as sc

    deny = sc.ERRNO(errno.EPERM)
    f = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(deny, name)
        except (OSError, ValueError, RuntimeError):  # not a syscall on this architecture
            pass
    # Threads are clone(CLONE_THREAD ...); anything else makes a process.
    f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    # clone3 hides its flags in memory a filter cannot read: say it does not exist, and
    # the C library falls back to clone for threads.
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    return f
