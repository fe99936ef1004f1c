"""How a worker ends early: Stop, with the state its status file is left in, and the exit codes."""

from __future__ import annotations

EXIT_USAGE = 2
EXIT_CANDIDATE = 3
EXIT_ORPHANED = 4


class Stop(Exception):
    def __init__(self, state: str, message: str, code: int, isolation: dict | None = None):
        """``isolation``: what confined the candidate's code when it ran before the stop (its import), for result.json."""
        super().__init__(message)
        self.state, self.message, self.code, self.isolation = state, message, code, isolation or {}
