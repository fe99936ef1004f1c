"""Confine a command the command proposer runs (a coding agent: hostile as any LLM's work): it reads the system's
programs and libraries, the /etc entries programs need and this Python, with tau2's task data and evolver's own code
cut out as for an agent process (evolver.evaluation.sandbox), and writes only its workspace; no capability is left."""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from pathlib import Path

from evolver.evaluation import sandbox

PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522

# What an interpreter or a command-line tool needs to start, for a command run confined (confine_command); a
# program installed elsewhere is followed to its folders (program_folders), so /opt is not granted whole.
# /proc is read-only, and what it holds of other processes beyond their command lines (environment, memory,
# maps, open files, working folder) stays out of reach: Landlock refuses a confined process any ptrace-like
# access to a process outside its domain. Claude Code's runtime aborts without /proc/self/maps.
COMMAND_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/proc")
# /etc entry by entry: what programs read there (found by running shells, git, Python, node, curl, Codex CLI and
# Claude Code confined and reading what was refused). Never /etc/shadow, gshadow, sudoers, ssh/ (host keys),
# ssl/private, or any entry not listed.
ETC_GRANTED = (
    "ssl/certs",
    "ssl/openssl.cnf",
    "ssl/cert.pem",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",  # certificates
    "pki/tls/cert.pem",
    "pki/tls/openssl.cnf",
    "pki/ca-trust/extracted",
    "crypto-policies",
    "gnutls",
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "services",
    "protocols",  # names and addresses
    "passwd",
    "group",  # getpwuid: names and home folders, no password hashes (those are in shadow)
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ld.so.preload",  # the dynamic loader
    "localtime",
    "timezone",
    "locale.alias",
    "alternatives",
    "mime.types",
    "magic",
    "gitconfig",
    "terminfo",
    "profile",
    "profile.d",
    "bash.bashrc",
    "os-release",
    "python3*",
)


def etc_grants(etc: Path = Path("/etc")) -> list[Path]:
    """The /etc entries a confined command may read, those present here."""
    return [p for pattern in ETC_GRANTED for p in sorted(etc.glob(pattern))]


def command_grants(extra: tuple[str, ...] = ()) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """What a confined command may read: the system's programs and libraries, the /etc entries programs need,
    this Python and its packages (tau2's task data cut out, as for an agent process), and ``extra`` (where its
    program is installed, the folders you named); and the folders on the way to what is cut out, which it may
    list but not read (a fresh interpreter lists its standard library's folder to import from it)."""
    import evolver

    own = Path(evolver.__file__).parent.resolve()  # evolver's own code is not the command's business
    roots = [Path(p) for p in (*COMMAND_ROOTS, *etc_grants(), sys.prefix, sys.base_prefix, *extra)]
    roots += [p for p in sandbox.readable_roots() if p != own]
    roots = [Path(r).resolve() for r in roots if Path(r).exists()]
    hidden = sandbox.hidden_paths() + (own,)
    readable = sandbox.distinct(p for root in roots for p in sandbox.excluding(root, hidden))
    listable = sandbox.distinct(parent for h in hidden for parent in h.parents if any(parent == r or r in parent.parents for r in roots))
    return readable, listable


def confine_command(readable: tuple[Path, ...], listable: tuple[Path, ...], writable: Path, cpu_seconds: int) -> None:
    """Confine this process (a child about to exec a command, e.g. as subprocess's preexec_fn): it may
    read and run ``readable``, list ``listable``, and read and write ``writable`` only. Not the network:
    the command calls its own model. Its children inherit all of it."""
    import landlock
    from landlock import FSAccess

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(sandbox.PR_SET_PDEATHSIG, 9, 0, 0, 0)  # evolver gone, the command goes too
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctypes.set_errno(0)
    ruleset = landlock.Ruleset()
    run = FSAccess.READ_FILE | FSAccess.READ_DIR | FSAccess.EXECUTE
    for path in readable:
        ruleset.allow(path, rules=run if path.is_dir() else FSAccess.READ_FILE | FSAccess.EXECUTE)
    for path in listable:  # names only: Landlock's READ_DIR lets a folder be listed, never a file in it be read
        ruleset.allow(path, rules=FSAccess.READ_DIR)
    ruleset.allow(Path(writable), rules=FSAccess.all())
    for dev in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/tty"):
        if os.path.exists(dev):
            ruleset.allow(dev, rules=FSAccess.READ_FILE | FSAccess.WRITE_FILE)
    ruleset.apply()  # which also sets no_new_privs: no exec regains a privilege
    _drop_capabilities(libc)


def _drop_capabilities(libc) -> None:
    """No capability left, for good, even where evolver runs as root: uid 0 owns files still, but the command
    cannot load kernel code, mount, reach raw devices or open files by handle, and Landlock alone decides
    what it reads (capabilities are what would let root around it)."""
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past this kernel's last one; EPERM where none is held
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:  # effective, permitted, inheritable (64 bits: twice), all empty
        raise OSError(ctypes.get_errno(), "capset: the command's capabilities could not be dropped")
