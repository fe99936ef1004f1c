"""Command line: `evolver init | eval | compare | run | transfer | history | show | report | rollback | status | runs | tasks | daemon`.

main parses the arguments (parser) and runs the command's handler: measure (eval, compare,
transfer), run, read_run (history, show, report, rollback, status, runs), init, tasks, daemon;
shared holds what several of them use. This package is the entry the launcher runs, here or
in a fork of the warm zygote (evolver.cli.launch), which calls its main(argv) and preload().
"""

from __future__ import annotations

import os
import signal
import sys

from evolver.cli.commands.daemon import cmd_daemon
from evolver.cli.commands.init import cmd_init
from evolver.cli.commands.measure import cmd_compare, cmd_eval, cmd_transfer
from evolver.cli.commands.parser import build_parser
from evolver.cli.commands.read_run import cmd_history, cmd_report, cmd_rollback, cmd_runs, cmd_show, cmd_status
from evolver.cli.commands.run import cmd_run
from evolver.cli.commands.tasks import cmd_tasks
from evolver.errors import UsageError


def preload() -> None:
    """What the commands handed to the warm zygote import (evolver.cli.launch), done once there, so that
    they start as fast as its workers. Nothing that starts a thread (the zygote forks) or that a command
    imports only when asked (mlflow, Ray, plotly)."""
    # noqa below: imported for their import's sake, nothing of them is used here
    import evolver.cli.compare  # noqa: F401
    import evolver.cli.console  # noqa: F401
    import evolver.cli.history  # noqa: F401
    import evolver.cli.preflight  # noqa: F401
    import evolver.cli.start  # noqa: F401
    import evolver.evaluation.backends.local  # noqa: F401
    import evolver.evolution.loop  # noqa: F401
    import evolver.local.backend  # noqa: F401


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        print(
            "evolver: error: a command is needed (init, eval, compare, run, transfer, history, show, report, rollback, status, runs, tasks, daemon); see `evolver --help`",
            file=sys.stderr,
        )
        return 2
    # SIGTERM stops a command as Ctrl-C does: the run records "interrupted", workers and the
    # embedded model's server are stopped on the way out instead of being left behind.
    signal.signal(signal.SIGTERM, _interrupt)
    handler = {
        "eval": cmd_eval,
        "compare": cmd_compare,
        "transfer": cmd_transfer,
        "init": cmd_init,
        "tasks": cmd_tasks,
        "run": cmd_run,
        "history": cmd_history,
        "show": cmd_show,
        "report": cmd_report,
        "rollback": cmd_rollback,
        "status": cmd_status,
        "runs": cmd_runs,
        "daemon": cmd_daemon,
    }[args.command]
    try:
        if args.command in ("eval", "run", "compare", "transfer"):
            from evolver.evaluation import zygote_client

            zygote_client.check_settings()
        return handler(args)
    except UsageError as exc:
        print(f"evolver: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("evolver: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `evolver status | head`: the reader has gone, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a read-only runs/, a full disk: what and where, not a traceback
        where = f" {exc.filename}" if exc.filename else ""
        print(f"evolver: error: cannot use{where}: {exc.strerror or exc}; check its permissions and the free space", file=sys.stderr)
        return 2
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "git":
            raise
        # gitpython: an immutable ref, a locked index, a broken repository
        detail = next((line.strip() for line in str(getattr(exc, "stderr", "") or exc).splitlines() if line.strip()), type(exc).__name__)
        print(
            f"evolver: error: git failed: {detail.removeprefix('stderr: ').strip(chr(39))}; fix the repository and try again",
            file=sys.stderr,
        )
        return 2
