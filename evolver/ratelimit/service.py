"""Reaching a command's limiter from another process: the Unix socket a worker's calls ask (Service), and the
worker's side of it (SocketClient)."""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Iterator, Optional

from evolver.ratelimit.answers import Answer
from evolver.ratelimit.lanes import Ticket, wait_for_permit


class Service:
    """A Limiter (or a Ray node's relay to one) on a Unix socket, for worker processes: a thread per
    connection (each worker thread holds one), JSON lines, answered at once (callers wait on their side):
    {"op": "reserve", "key", "tokens", "ticket"} -> {"delay", "ticket"};
    {"op": "report", "key", "answer", "estimated"} -> {}; {"op": "snapshot"} -> {"lanes"}."""

    def __init__(self, limiter, directory: Path):
        self.limiter = limiter
        self.path = Path(directory) / f"limiter-{os.getpid()}-{id(self) & 0xFFFFFF:x}.sock"
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.sock.listen(256)
        self.closed = False
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, name="rate-limiter", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                if self.closed:
                    conn.close()
                    return
                self.connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="rate-limiter-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            for message in _lines(conn):
                conn.sendall((json.dumps(self.answer(message)) + "\n").encode())
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                self.connections.discard(conn)
            conn.close()

    def answer(self, message: dict) -> dict:
        op = message.get("op")
        if op == "reserve":
            ticket = message.get("ticket")
            delay, ticket = self.limiter.reserve(str(message["key"]), int(message.get("tokens") or 1), tuple(ticket) if ticket else None)
            return {"delay": delay, "ticket": list(ticket)}
        if op == "report":
            self.limiter.report(str(message["key"]), Answer(**message.get("answer") or {}), int(message.get("estimated") or 1))
            return {}
        if op == "snapshot":
            return {"lanes": self.limiter.snapshot()}
        return {"error": f"unknown op {op!r}"}

    def close(self) -> None:
        with self.lock:
            self.closed = True
            connections = list(self.connections)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.path.unlink(missing_ok=True)


def _lines(conn: socket.socket) -> Iterator[dict]:
    buffer = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield json.loads(line)


class SocketClient:
    """A worker's side of Service: one connection per thread (tau2 runs simulations in threads)."""

    def __init__(self, path: str):
        self.path = path
        self.local = threading.local()

    def _ask(self, message: dict) -> dict:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(self.path)
            self.local.conn, self.local.lines = conn, _lines(conn)
        try:
            conn.sendall((json.dumps(message) + "\n").encode())
            return next(self.local.lines)
        except (OSError, StopIteration, ValueError) as exc:
            conn.close()
            self.local.conn = None
            raise OSError(f"the rate limiter at {self.path} stopped answering") from exc

    def reserve(self, key: str, tokens: int = 1, ticket: Optional[Ticket] = None) -> tuple[float, Ticket]:
        found = self._ask({"op": "reserve", "key": key, "tokens": tokens, "ticket": list(ticket) if ticket else None})
        return float(found["delay"]), tuple(found["ticket"])

    def acquire(self, key: str, tokens: int = 1) -> float:
        return wait_for_permit(self.reserve, key, tokens)

    def report(self, key: str, answer: Answer, estimated: int = 1) -> None:
        self._ask({"op": "report", "key": key, "answer": asdict(answer), "estimated": estimated})

    def snapshot(self) -> dict[str, dict]:
        return self._ask({"op": "snapshot"})["lanes"]
