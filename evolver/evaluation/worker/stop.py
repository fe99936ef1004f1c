"""How a worker ends early: Stop, with the state its status file is left in, and the exit codes."""

from __future__ import annotations

EXIT_USAGE = 2
EXIT_CANDIDATE = 3
EXIT_ORPHANED = 4


class Stop(Exception):
    def __init__(self, state: str, message: str, code: int):
        super().__init__(message)
        self.state, self.message, self.code = state, message, code
