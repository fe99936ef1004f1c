"""Confine the process that runs a candidate's agent code (an LLM wrote it: hostile until proven otherwise).

Why these mechanisms (all in the Linux kernel, reached through maintained bindings):

- Landlock (`landlock` on PyPI), for files: the process may read the Python
  standard library, site-packages minus tau2's task data, evolver's own package,
  the system's shared libraries and its copy of the candidate's agent/; it may
  write only its scratch directory. Nothing else exists for it: not the run
  directory, the repository or its .git, the user's home, /proc, the
  zygote's socket. Unprivileged, stackable, no set-up outside the process.
- seccomp (`pyseccomp`, on the system's libseccomp), for what Landlock does not
  cover: no new processes (fork, exec, clone without CLONE_THREAD; threads stay
  allowed), no sockets at all (so no network and no connection to any local
  service; the channel to the evaluator is inherited), no signals to other
  processes, no ptrace or reading other processes' memory, no namespace,
  mount, bpf, io_uring or keyring calls.
- user + network + IPC namespaces where the kernel allows them (an extra layer:
  even a socket, if one were made, would see only a down loopback).
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
import resource
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD = 0x00010000
PR_SET_PDEATHSIG = 1

# Denied outright: process creation and replacement, sockets, other processes' memory,
# namespaces and mounts, and kernel interfaces an agent never needs.
DENIED_SYSCALLS = (
    "fork", "vfork", "execve", "execveat",
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp",
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",  # no signals at all (abort() still ends the process)
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "mknod", "mknodat", "personality", "ioperm", "iopl", "swapon", "reboot",
    "init_module", "finit_module", "delete_module", "kexec_load", "acct", "quotactl", "syslog",
)

SYSTEM_LIBS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo")


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 1024  # address space on top of what the forked process already maps
    cpu_seconds: int = 600
    file_mb: int = 64
    open_files: int = 256


class SandboxUnavailable(RuntimeError):
    """The mechanisms are missing here; the message says which and what to do."""


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> Optional[str]:
    """None when the sandbox can be set up on this system, else one line saying what is missing."""
    if not sys.platform.startswith("linux"):
        return f"the agent sandbox needs Linux (Landlock and seccomp); this is {sys.platform}"
    try:
        import landlock

        abi = landlock.landlock_abi_version()
    except ImportError:
        return "the 'landlock' package is not installed; reinstall evolver"
    except OSError as exc:
        return f"Landlock is not available in this kernel ({exc.strerror or exc}); it needs Linux 5.13+ with Landlock enabled (lsm=landlock)"
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

        raise UsageError(f"{reason}; unconfined, candidate code could read your keys and files and forge its score: "
                         "run where the sandbox works, or pass --unsafe-no-sandbox to accept that risk")


def readable_paths(extra: list[Path]) -> list[Path]:
    """What a confined agent process may read: the interpreter's libraries, site-packages
    without tau2's data (task answers live there), evolver's package and ``extra``."""
    return _base_readable() + [p for p in extra if p.exists()]


@functools.lru_cache(maxsize=1)
def _base_readable() -> list[Path]:
    """The same for every agent process: computed once, in the zygote, before it forks."""
    import evolver

    paths: list[Path] = [Path(p) for p in SYSTEM_LIBS]
    sites = {Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()}
    for key in ("stdlib", "platstdlib"):  # in a venv, platstdlib holds its site-packages
        root = Path(sysconfig.get_paths()[key])
        if root.is_dir():
            paths += [e for e in root.iterdir() if e.name not in ("site-packages", "dist-packages")]
    for site in sorted(sites):
        paths += _without_tau2_data(site)
    paths.append(Path(evolver.__file__).resolve().parent)
    seen, out = set(), []
    for p in paths:
        if p.exists() and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _without_tau2_data(site: Path) -> list[Path]:
    """Every entry of site-packages; inside tau2, every entry but its data folder
    (Landlock only grants, so a folder is opened up entry by entry to leave one out)."""
    out = []
    for entry in site.iterdir():
        if entry.name == "tau2" and entry.is_dir():
            out += [e for e in entry.iterdir() if e.name != "data"]
        else:
            out.append(entry)
    return out


def confine(readable: list[Path], scratch: Path, limits: Limits) -> dict:
    """Confine this process for good. Call it single-threaded, before any candidate code runs.
    Returns what is in force, for result.json."""
    reason = unavailable_reason()
    if reason:
        raise SandboxUnavailable(reason)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the zygote gone, nothing of ours runs on
    _set_limits(limits)
    namespaces = _unshare(libc)
    abi = _landlock(readable, scratch)
    _seccomp_filter().load()
    return {
        "mode": "sandbox",
        "landlock_abi": abi,
        "seccomp": True,
        "namespaces": namespaces,
        "limits": asdict(limits),
        "readable_paths": len(readable),
    }


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


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


def _unshare(libc) -> list[str]:
    """New user, network and IPC namespaces when the kernel allows them unprivileged."""
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC) == 0:
        return ["user", "net", "ipc"]
    return []


def _landlock(readable: list[Path], scratch: Path) -> int:
    import landlock
    from landlock import FSAccess

    read_dir, read_file = FSAccess.READ_FILE | FSAccess.READ_DIR, FSAccess.READ_FILE
    ruleset = landlock.Ruleset()  # handles every access right this kernel knows: all denied unless granted
    for path in readable:
        ruleset.allow(path, rules=read_dir if path.is_dir() else read_file)
    ruleset.allow(Path(scratch), rules=FSAccess.all())
    for dev in ("/dev/null", "/dev/urandom"):
        ruleset.allow(dev, rules=FSAccess.READ_FILE | FSAccess.WRITE_FILE)
    ruleset.apply()
    return landlock.landlock_abi_version()


def prepare() -> None:
    """Do once, in the zygote, what is the same for every agent process it will fork."""
    if unavailable_reason() is None:
        _base_readable()
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
