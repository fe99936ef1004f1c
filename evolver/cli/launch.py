"""The `evolver` command's entry point: hands the commands that evaluate to the warm zygote when one is running.

A fresh Python process spends about 0.3 s importing evolver's CLI (pydantic, rich) before an
evaluation can start, and a run, compare, transfer or tasks 3-4 s of CPU more importing litellm
and tau2 (more than a small run's own work); a fork of the warm zygote has all of that done
(see evolver.evaluation.zygote). This module therefore imports only the standard library
and evolver.evaluation.zygote_client. Everything else, and these commands when no zygote is
running (an evaluation then starts one for its workers), runs evolver.cli.commands here.
EVOLVER_ZYGOTE_IDLE=0 turns the hand-over off along with the warm zygote.
"""

from __future__ import annotations

import sys

COMMANDS = "evolver.cli.commands"  # the module whose main(argv) runs a command: here, or in a fork of the zygote
WARM = ("eval", "run", "compare", "transfer", "tasks")  # the commands that import litellm or tau2; `daemon` never


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in WARM:
        from evolver.evaluation import zygote_client

        code = zygote_client.run_command(argv, COMMANDS)
        if code is not None:
            return code
    from evolver.cli.commands import main as cli_main

    return cli_main(argv)
