"""Length-prefixed JSON messages over a stream socket: the pipe between the trusted evaluator and an agent process.

Everything that arrives from the agent side is hostile input: a frame larger
than MAX_FRAME, bytes that are not JSON, or a message that is not an object
raises ChannelError, which the trusted side charges to the candidate.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Optional

MAX_FRAME = 8 * 1024 * 1024  # a tau2 conversation with its tools is well under 1 MB
HEADER = struct.Struct("!I")


class ChannelError(Exception):
    """The other side broke the protocol, went away, or did not answer in time."""


class ChannelClosed(ChannelError):
    """The other side closed the channel (it exited or was killed)."""


class ChannelTimeout(ChannelError):
    pass


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def send(self, message: dict) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        if len(data) > MAX_FRAME:
            raise ChannelError(f"message of {len(data):,} bytes is over the {MAX_FRAME:,}-byte limit")
        try:
            self.sock.sendall(HEADER.pack(len(data)) + data)
        except OSError as exc:
            raise ChannelClosed(f"the other side is gone ({exc.strerror or exc})") from None

    def receive(self, timeout: Optional[float] = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        header = self._read(HEADER.size, deadline)
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME:
            raise ChannelError(f"a message of {size:,} bytes is over the {MAX_FRAME:,}-byte limit")
        data = self._read(size, deadline)
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nesting deep enough to exhaust the parser
            raise ChannelError("a message that is not valid JSON") from None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ChannelError("a message without an 'op'")
        return message

    def _read(self, n: int, deadline: Optional[float]) -> bytes:
        while len(self.buffer) < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ChannelTimeout("no answer in time")
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                raise ChannelTimeout("no answer in time")
            try:
                chunk = self.sock.recv(max(65536, n - len(self.buffer)))
            except OSError as exc:
                raise ChannelClosed(f"the other side is gone ({exc.strerror or exc})") from None
            if not chunk:
                raise ChannelClosed("the other side closed the channel")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
