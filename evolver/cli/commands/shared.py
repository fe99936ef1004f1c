"""What several commands share: the roles an evaluation uses, the exit codes, stdout, new run ids."""

from __future__ import annotations

import secrets
import time

from rich.console import Console

EVAL_ROLES = ("agent", "user")
EXIT_NOTHING_MEASURED = 4  # eval: every simulation was an infrastructure error
EXIT_PAUSED = 3  # run: paused because the meta-LLM stayed down; resume it


def out_console() -> Console:
    """Stdout; wide when piped, so tables are not folded into 80 columns."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def new_run_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
