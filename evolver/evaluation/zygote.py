"""A warm worker factory: imports tau2 and litellm once, then forks one fresh worker per evaluation.

    python -m evolver.evaluation.zygote --socket PATH [--idle SECONDS]

Importing tau2 and litellm takes 4-7 s on 2 cores, longer than a small
evaluation. The zygote pays it once and then serves every controller (each
`evolver eval` and `evolver run`) on a Unix socket; it exits after ``--idle``
seconds without clients or workers (0: as soon as the last client leaves).
evolver.evaluation.zygote_client finds or starts it. Each worker is a fresh fork that has
never imported a candidate, so candidate code still runs only in its own
process, with its own process group, killable by the controller.

The zygote holds no secret: it is started with a short allowlist of
environment variables (zygote_client.zygote_environment), and a client's
environment, API keys included, travels to its child as a memfd that the
zygote passes on unread. So an agent process, forked from it, finds no key
anywhere in its memory.

Protocol, one JSON object per line on a client's connection:
  zygote -> client   {"ready": true, "pid": N} on connect
  client -> zygote   {"request": path, "log": path, "cwd": dir} with one fd, the
                     client's environment as JSON in a memfd: a trusted evaluation worker
                     {"command": [args], "entry": module, "cwd": dir} with the client's stdin,
                     stdout, stderr and environment memfd passed along (SCM_RIGHTS): an
                     `evolver` command (evolver.cli.launch), run by ``module``'s main(args) in a
                     fork that has its imports done already
                     {"agent": spec} with one fd, its end of a socketpair: an agent process
                     that confines itself and runs one simulation's candidate code
                     (evolver.evaluation.agent_host)
  zygote -> client   {"pid": N}, then {"exit": N, "code": C} when that child ends
  client -> zygote   {"status": true}  ->  {"status": {...}}
  client -> zygote   {"stop": true}: no new clients; exit once the current ones leave

A command's entry is named by its client (an evolver.* module with main(argv) and,
optionally, preload()), so that this evaluation-side process does not import the
command line: the zygote imports the entry, and what its preload() imports, once,
at the first command, and every later command forks warm.

A client that disconnects (it finished, or was killed) takes its workers with
it: the zygote kills their process groups, so a killed controller leaves no
worker writing into a run directory that a resumed controller will use.
The zygote runs no threads (fork from a threaded process is unsafe).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import re
import select
import signal
import socket
import sys
import time

from evolver.evaluation.zygote_client import CONNECTION_ENV


def _read_env(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    with os.fdopen(fd, "rb") as fh:
        return json.loads(fh.read())


def _child(req: dict, inherited: list[int], fds: list[int]) -> None:
    """In the fork: own process group; then an agent process (evolver.evaluation.agent_host), or, in the
    client's directory and environment, a worker (output to its log) or an evolver command
    (on the client's own stdin/out/err)."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    for fd in inherited:  # the zygote's sockets and pipes are not the child's business
        os.close(fd)
    code = 1
    if "agent" in req:
        null = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        try:
            from evolver.evaluation import agent_host

            code = agent_host.serve(fds[0], req["agent"])
        finally:
            os._exit(code)
    if "command" in req:
        stdio, env_fd = fds[:3], fds[3]
    else:
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stdio, env_fd = [os.open(os.devnull, os.O_RDONLY), log, log], fds[0]
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(_read_env(env_fd))
    if "request" in req:
        os.environ[CONNECTION_ENV] = str(fds[1])
    try:
        if "command" in req:
            sys.argv = ["evolver", *req["command"]]
            code = importlib.import_module(req["entry"]).main(req["command"])
        else:
            from evolver.evaluation import worker

            code = worker.main([req["request"]])
    except SystemExit as exc:  # argparse's own exits (--help, usage errors)
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    except BaseException:  # noqa: BLE001 - report and exit; never return into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Client:
    def __init__(self, conn: socket.socket):
        self.conn, self.buffer, self.workers = conn, b"", set()
        self.fds: list[int] = []  # passed with a request: stdio, environment memfd or agent channel

    def send(self, obj: dict) -> None:
        try:
            self.conn.sendall((json.dumps(obj) + "\n").encode())
        except OSError:
            pass  # it is gone; the next read sees that and cleans up


class Zygote:
    def __init__(self, path: str, idle: float):
        self.path, self.idle = path, idle
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        self.inode = os.stat(path).st_ino
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.clients: dict[int, Client] = {}
        self.owner: dict[int, Client] = {}  # worker pid -> the client that asked for it
        self.started, self.last_active, self.served = time.time(), time.monotonic(), 0
        self.stopping = False

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the pipe
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            busy = self.clients or self.owner
            left = self.idle - (time.monotonic() - self.last_active)
            expired = not busy and (self.stopping or left <= 0)
            sockets = [c.conn for c in self.clients.values()] + ([] if self.stopping else [self.listener])
            # Expired: one last look, so that a client already waiting is served, not dropped.
            readable, _, _ = select.select([self.wake_r, *sockets], [], [], 0 if expired else None if busy else left)
            if expired and not readable:
                return
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
            self._reap()
            for sock in readable:
                if sock is self.listener:
                    self._accept()
                elif sock is not self.wake_r:
                    self._receive(self.clients[sock.fileno()])
            if busy or readable:
                self.last_active = time.monotonic()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        client = Client(conn)
        self.clients[conn.fileno()] = client
        client.send({"ready": True, "pid": os.getpid()})

    def _receive(self, client: Client) -> None:
        try:
            chunk, fds, _, _ = socket.recv_fds(client.conn, 65536, 8)
        except OSError:
            chunk, fds = b"", []
        client.fds += fds
        if not chunk:  # the controller finished or died: its workers go with it
            self._drop(client)
            return
        client.buffer += chunk
        *lines, client.buffer = client.buffer.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:  # not an evolver client
                self._drop(client)
                return
            if "request" in msg or "command" in msg or "agent" in msg:
                self._fork(client, msg)
            elif msg.get("status"):
                client.send({"status": self.status()})
            elif msg.get("stop"):
                self._stop_listening()
                client.send({"stopping": True})

    def _fork(self, client: Client, req: dict) -> None:
        fds, client.fds = client.fds, []
        if len(fds) != (4 if "command" in req else 1) or ("command" in req and not _entry(req.get("entry"))):
            for fd in fds:
                os.close(fd)
            self._drop(client)  # not an evolver client
            return
        if "request" in req:  # a worker's own connection: its agent processes die with it, even mid-stop
            mine, theirs = socket.socketpair()
            self.clients[mine.fileno()] = Client(mine)
            fds.append(theirs.detach())
        pending = [fd for other in self.clients.values() for fd in other.fds]  # other requests' fds
        listener = [] if self.stopping else [self.listener.fileno()]
        inherited = [fd for fd in (*listener, self.wake_r, self.wake_w, *self.clients, *pending) if fd >= 0]
        # Every object the zygote holds goes to the collector's permanent generation: a child's
        # collections then never write to those pages, so it copies far fewer of them.
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            _child(req, inherited, fds)
        for fd in fds:  # held open here, they would keep the client's pipes from ever closing
            os.close(fd)
        self.owner[pid] = client
        client.workers.add(pid)
        self.served += 1
        client.send({"pid": pid})

    def _reap(self) -> None:
        while self.owner:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            client = self.owner.pop(pid, None)
            if client is not None:
                client.workers.discard(pid)
                client.send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def _drop(self, client: Client) -> None:
        for pid in client.workers:
            _kill_group(pid)
        for fd in client.fds:
            os.close(fd)
        client.workers.clear()  # reaped, and forgotten, as they exit
        self.clients.pop(client.conn.fileno(), None)
        client.conn.close()

    def _stop_listening(self) -> None:
        """New clients start a fresh zygote; the current ones finish undisturbed."""
        if not self.stopping:
            self.stopping = True
            self._unlink()
            self.listener.close()

    def _unlink(self) -> None:
        try:  # only our own socket: a newer zygote may have taken the path
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def status(self) -> dict:
        return {
            "pid": os.getpid(),
            "started": self.started,
            "idle_seconds": self.idle,
            "served": self.served,
            "clients": len(self.clients),
            "workers": len(self.owner),
            "stopping": self.stopping,
        }

    def close(self) -> None:
        for pid in list(self.owner):
            _kill_group(pid)
        if not self.stopping:
            self._unlink()


ENTRY = re.compile(r"evolver(\.[a-z_]+)+")
_warm: set[str] = set()


def _entry(entry) -> bool:
    """Whether a command's entry names an evolver module; imported here (with what its
    preload() imports) the first time, so that its commands fork with their imports done."""
    if not isinstance(entry, str) or not ENTRY.fullmatch(entry):
        return False
    if entry not in _warm:
        _warm.add(entry)
        try:
            module = importlib.import_module(entry)
            getattr(module, "preload", lambda: None)()
        except Exception:  # noqa: BLE001 - the command's fork imports it again and shows the error to its user
            pass
    return True


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evolver.evaluation.zygote")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--idle", type=float, default=0.0)
    args = parser.parse_args(argv)
    zygote = Zygote(args.socket, args.idle)  # bind first: a second zygote for the path fails here
    try:
        from evolver.evaluation.worker.warmup import preload

        preload()  # what a command needs is imported at its first command (_entry)
        zygote.serve()
    finally:
        zygote.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
