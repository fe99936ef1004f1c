"""Find, start, query and stop the warm worker zygote (evolver.evaluation.zygote) from a controller.

One zygote serves every evolver command of a user that runs the same code: its
socket is named by a fingerprint of the interpreter, PYTHONPATH, the installed
packages and evolver's own source, so an upgrade or an edit starts a fresh
zygote instead of forking stale code. It lives in a private directory:
EVOLVER_RUNTIME_DIR, else $XDG_RUNTIME_DIR/evolver, else /tmp/evolver-<uid>.
EVOLVER_ZYGOTE_IDLE (seconds, default 600) is how long it stays warm without
clients; 0 makes it exit with its last client. The first start for this code
(no log of it in the runtime directory yet) says on stderr why the command
takes longer and that the zygote outlives it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Optional

import evolver
from evolver.errors import UsageError

DEFAULT_IDLE = 600.0
START_TIMEOUT = 300.0  # importing tau2 on a loaded 2-core machine
CONNECTION_ENV = "EVOLVER_ZYGOTE_FD"  # set in a worker by the zygote: its own connection to it, for agent processes


# What the zygote inherits of a client's environment: enough to find Python, evolver and
# its own settings, and nothing that could be a secret (no *_API_KEY, no tokens).
ZYGOTE_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "EVOLVER_RUNTIME_DIR",
    "EVOLVER_ZYGOTE_IDLE",
    "LITELLM_LOCAL_MODEL_COST_MAP",
    "LITELLM_LOG",
)


def zygote_environment() -> dict:
    return {k: os.environ[k] for k in ZYGOTE_ENV if k in os.environ}


def environment_fd(env: dict) -> int:
    """The environment as JSON in an anonymous memory file, so it reaches a child through
    the zygote without the zygote ever reading it."""
    fd = os.memfd_create("evolver-env", os.MFD_CLOEXEC)
    os.write(fd, json.dumps(env).encode())
    return fd


def send_with_fds(sock: socket.socket, message: dict, fds: list[int]) -> None:
    socket.send_fds(sock, [(json.dumps(message) + "\n").encode()], fds)


def runtime_dir() -> Path:
    base = os.environ.get("EVOLVER_RUNTIME_DIR")
    if not base:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        base = str(Path(xdg) / "evolver") if xdg else f"/tmp/evolver-{os.getuid()}"
    path = Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    # Anyone who can write here could answer as the zygote and run code as us.
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UsageError(f"{path} must be a private directory (owned by you, mode 700); fix it or set EVOLVER_RUNTIME_DIR")
    return path


def idle_seconds() -> float:
    raw = os.environ.get("EVOLVER_ZYGOTE_IDLE", "")
    try:
        value = float(raw) if raw else DEFAULT_IDLE
    except ValueError:
        value = -1.0
    if value < 0:
        raise UsageError(f"EVOLVER_ZYGOTE_IDLE={raw!r} is not a number of seconds >= 0; fix or unset it")
    return value


def check_settings() -> None:
    """Bad settings fail before a command writes anything, not at its first evaluation."""
    runtime_dir()
    idle_seconds()


def fingerprint() -> str:
    """What a forked worker's code depends on, cheaply: no imports, a few hundred stat() calls."""
    digest = hashlib.sha256()
    for part in (sys.executable, sys.version, os.environ.get("PYTHONPATH", "")):
        digest.update(part.encode() + b"\0")
    purelib = Path(sysconfig.get_paths()["purelib"])
    # pip adds and removes *.dist-info entries on every install, which changes the directory's mtime.
    digest.update(str(purelib.stat().st_mtime_ns if purelib.exists() else 0).encode())
    for path in sorted(Path(evolver.__file__).resolve().parent.rglob("*.py")):  # the whole package, not this folder
        info = path.stat()
        digest.update(f"{path}:{info.st_mtime_ns}:{info.st_size}\0".encode())
    return digest.hexdigest()[:16]


class Connection:
    """One client connection: JSON lines both ways."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.closed = sock, b"", False

    def send(self, obj: dict) -> None:
        self.sock.sendall((json.dumps(obj) + "\n").encode())

    def receive(self, timeout: Optional[float]) -> list[dict]:
        """Messages that arrive within ``timeout`` seconds (none when it passes)."""
        if self.closed:
            raise RuntimeError("the worker zygote exited; see its log in " + str(runtime_dir()))
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return []
        chunk = self.sock.recv(65536)
        if not chunk:
            self.closed = True
            raise RuntimeError("the worker zygote exited; see its log in " + str(runtime_dir()))
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def expect(self, key: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in self.receive(deadline - time.monotonic()):
                if key in msg:
                    return msg
        raise RuntimeError(f"the worker zygote did not answer ({key}) within {timeout:g} s")

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def _connect(path: Path) -> Optional[Connection]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return Connection(sock)


def socket_path() -> Path:
    """Where this code's zygote listens; beside it, its log (``.log``)."""
    return runtime_dir() / f"zygote-{fingerprint()}.sock"


def connect() -> Connection:
    """A connection to this code's zygote, started if none is running; "ready" already read."""
    directory = runtime_dir()
    idle = idle_seconds()
    path = socket_path()

    def attempt() -> Connection:
        conn = _connect(path)
        if conn is None:
            with open(directory / "start.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one starter; the others connect to what it started
                conn = _connect(path) or _start(path, idle)
        try:
            conn.expect("ready", START_TIMEOUT)
        except BaseException:
            conn.close()
            raise
        return conn

    try:
        return attempt()
    except (RuntimeError, OSError):  # it reached its idle limit just as we connected: once more
        return attempt()


def _start(path: Path, idle: float) -> Connection:
    path.unlink(missing_ok=True)  # a zygote that was killed leaves its socket behind
    if not path.with_suffix(".log").exists():  # no zygote of this code has started here before: say why this command is slow, once
        print(first_start_note(idle), file=sys.stderr, flush=True)
    log = open(path.with_suffix(".log"), "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolver.evaluation.zygote", "--socket", str(path), "--idle", str(idle)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        cwd=path.parent,
        start_new_session=True,
        env=zygote_environment(),  # keyless: agent processes are forked from it
    )
    log.close()
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        conn = _connect(path)
        if conn is not None:
            return conn
        if proc.poll() is not None:
            raise RuntimeError(f"the worker zygote failed to start; see {path.with_suffix('.log')}")
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"the worker zygote did not start within {START_TIMEOUT:g} s; see {path.with_suffix('.log')}")


def first_start_note(idle: float) -> str:
    """What the first start of a zygote for this code tells its user: why this command takes longer, and that the
    zygote outlives it."""
    stays = (
        f"it stays up after this command and exits after {idle:g} s without use (`evolver daemon stop` ends it sooner)"
        if idle
        else "it exits with this command (EVOLVER_ZYGOTE_IDLE=0)"
    )
    return (
        "evolver: starting the worker daemon for this install: the first start imports tau2 and litellm and can take "
        f"20 s or more, later commands start from it in a few seconds; {stays}"
    )


def _ask(path: Path, message: dict, answer: str) -> Optional[dict]:
    """One question to the zygote at ``path``; None when it does not answer."""
    conn = _connect(path)
    if conn is None:
        return None
    try:
        conn.expect("ready", 5)
        conn.send(message)
        return conn.expect(answer, 5)[answer]
    except (RuntimeError, OSError):
        return None
    finally:
        conn.close()


def running() -> list[tuple[Path, dict]]:
    """(socket, status) of every zygote in the runtime directory that answers."""
    current = f"zygote-{fingerprint()}.sock"
    found = []
    for path in sorted(runtime_dir().glob("zygote-*.sock")):
        status = _ask(path, {"status": True}, "status")
        if status is not None:
            found.append((path, {**status, "current": path.name == current}))
    return found


def stop_all() -> int:
    """Ask every zygote to stop: no new clients; each exits once its current clients leave."""
    return sum(_ask(path, {"stop": True}, "stopping") is not None for path, _ in running())


def run_command(argv: list[str], entry: str) -> Optional[int]:
    """Run an evolver command, ``entry``'s main(argv) (a module the zygote imports), in a fork of this
    code's warm zygote, on our own stdin/stdout/stderr, and return its exit code; None when no such
    zygote is running (the caller runs it itself). Ctrl-C and SIGTERM are passed on; if we are
    killed, the zygote kills the command."""
    try:
        if not idle_seconds():  # no warm zygote wanted: EVOLVER_ZYGOTE_IDLE=0 (or 0.0)
            return None
        conn = _connect(socket_path())
        if conn is None:
            return None
        conn.expect("ready", 5)
    except (UsageError, RuntimeError, OSError):
        return None  # the command itself reports bad settings
    env = environment_fd(dict(os.environ))
    send_with_fds(conn.sock, {"command": argv, "entry": entry, "cwd": os.getcwd()}, [0, 1, 2, env])
    os.close(env)
    pid = conn.expect("pid", 60)["pid"]

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    while True:
        try:
            messages = conn.receive(None)
        except RuntimeError:  # the zygote died (killed): the command, now its orphan, goes on to its end
            while _alive(pid):
                time.sleep(0.2)
            print("evolver: the warm daemon exited while it ran this command, so its exit code is unknown", file=sys.stderr)
            return 1
        for msg in messages:
            if msg.get("exit") == pid:
                code = msg["code"]
                return code if code >= 0 else 128 - code  # killed by a signal, as a shell reports it


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


def await_pid(conn: Connection, note, timeout: float) -> int:
    """The pid the zygote answers a fork request with. Every other message of the same read
    (another child's exit, or this one's if it ended at once) goes to ``note``, not lost."""
    deadline, pid = time.monotonic() + timeout, None
    while pid is None and time.monotonic() < deadline:
        for msg in conn.receive(deadline - time.monotonic()):
            if "pid" in msg and pid is None:
                pid = msg["pid"]
            else:
                note(msg)
    if pid is None:
        raise RuntimeError(f"the zygote did not start a process within {timeout:g} s")
    return pid


class WorkerConnection:
    """A worker's own connection to the zygote (handed over at fork): it asks for agent
    processes and learns how they ended. Thread-safe: tau2 runs simulations in threads."""

    def __init__(self, fd: int):
        self.conn = Connection(socket.socket(fileno=fd))
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}

    @classmethod
    def from_environment(cls) -> "WorkerConnection":
        fd = os.environ.pop(CONNECTION_ENV, None)
        if fd is None:
            raise RuntimeError("this worker has no connection to the zygote")
        return cls(int(fd))

    def spawn_agent(self, spec: dict, channel_fd: int) -> int:
        with self.lock:
            send_with_fds(self.conn.sock, {"agent": spec}, [channel_fd])
            return await_pid(self.conn, self._note, 60)

    def exit_code(self, pid: int, timeout: float) -> Optional[int]:
        """The agent's exit code (negative: killed by that signal) once the zygote reaped it, or None."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if pid in self.exits:
                    return self.exits.pop(pid)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                for msg in self.conn.receive(min(left, 0.05)):
                    self._note(msg)

    def _note(self, msg: dict) -> None:
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["code"]
