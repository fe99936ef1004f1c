"""The `evolver` parser: every command's arguments, and a flag for every setting a command takes
(from the settings' one declaration, evolver.config)."""

from __future__ import annotations

import argparse

from evolver import __version__
from evolver.config import DOMAINS, GROUPS, SPECS, Config, flag_of

EPILOG = """\
configuration: evolver.toml in the repository, then EVOLVER_<KEY> environment
variables, then these flags (later wins). Models are litellm model strings;
for a vLLM, Ollama or llama.cpp server use --agent-model openai/NAME --api-base URL.
"""


DAEMON_HELP = """\
Importing tau2 and litellm takes several seconds, so the first evaluation starts
a daemon that imports them once and forks a fresh worker for every evaluation
(candidate code never runs in the daemon itself). It is private to your user,
serves only evolver commands running the same code (an upgrade or an edit
starts a new one) and exits after EVOLVER_ZYGOTE_IDLE seconds without use
(default 600; 0 makes it exit with the command that started it). Its socket
and log are in EVOLVER_RUNTIME_DIR, else $XDG_RUNTIME_DIR/evolver, else
/tmp/evolver-<uid>.
"""


COMPARE_HELP = """\
Is agent B better than agent A, worse, or is there no evidence either way? Both run on the same
tasks with the same seeds, side by side in the same window, one more trial per task at each look (up
to 20; a task whose trials all agree after 3 each stops running); a look stops when the answer is
clear either way; an exact test calls a no-op better or worse at most 5% of the time (docs/gate.md).
It prints the effect of B over A with its interval and p-value, the tasks that flipped each way with
their pass rates, and the simulations and cost spent; runs/<compare-id>/ keeps both evaluations.

  evolver compare main my-branch                          two refs of this repository
  evolver compare ../other-checkout .                     two folders
  evolver compare --run RUN base best --agent-model M     a run's base and best under another model
"""


TRANSFER_HELP = """\
Does the harness a run kept carry to another model? Compares the run's base with its best (with
--each, every kept step with the one before) as `evolver compare` does, under the models, domain
and split you give; everything else is the run's own settings, and the tasks are its gate tasks
unless --domain or --split says otherwise. Each pair gets a verdict: helps, hurts or no evidence.
The result is kept in the run (runs/RUN/transfers/) and shown by `evolver history` and the report.

  evolver transfer RUN --agent-model openai/gpt-4.1-mini
  evolver transfer RUN --agent-model local --local-size small --each
"""


class Parser(argparse.ArgumentParser):
    """Argument errors in one line, like every other error, instead of a usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
        return value

    return parse


# The order in which each command's --help lists the groups of settings (evolver.config.GROUPS).
GROUP_ORDER = {
    "eval": ("evaluation", "sandbox", "models"),
    "run": ("runs", "stopping", "proposer", "gate", "evaluation", "sandbox", "models"),
}


def _add_setting_flags(
    p: argparse.ArgumentParser, command: str, extra: dict[str, list] | None = None, without: tuple[str, ...] = ()
) -> None:
    """A flag for every setting the command takes, from its one declaration (evolver.config.Config);
    ``extra`` adds a command's own arguments to a group, ``without`` leaves settings out. Values stay
    text here: evolver.config checks flags, evolver.toml and EVOLVER_* variables the same way."""
    extra = extra or {}
    for group in GROUP_ORDER[command]:
        g = p.add_argument_group(GROUPS[group])
        for name, spec in SPECS.items():
            if spec.group != group or command not in spec.flags or name in without:
                continue
            flag = "--" + name.replace("_", "-")
            if spec.style == "switch":
                g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=_flag_help(name, spec))
            elif spec.style == "flag":
                g.add_argument(flag, action="store_true", default=None, help=spec.help)
            elif spec.style in ("table", "limits"):  # --agent-arg max_tokens=2048 --agent-arg top_p=0.9; --rate-limit M=500/200000
                g.add_argument(
                    flag_of(name),
                    dest=name,
                    action="append",
                    metavar=spec.metavar,
                    help=spec.help + ("; repeat it per argument" if spec.style == "table" else "; repeat it per model"),
                )
            elif spec.style == "on_off":  # --holdout / --no-holdout; auto when neither is given
                g.add_argument(flag, dest=name, action="store_const", const="on", help=spec.help)
                g.add_argument(
                    "--no-" + flag[2:], dest=name, action="store_const", const="off", help=f"no {name.replace('_', ' ')} (default: auto)"
                )
            else:
                kind = type(getattr(Config(), name))
                metavar = spec.metavar or (
                    "{" + ",".join(spec.choices) + "}" if spec.choices else {int: "N", float: "X", list: "A,B"}.get(kind, "TEXT")
                )
                g.add_argument(flag, metavar=metavar, help=_flag_help(name, spec))
        for args, kwargs in extra.get(group, []):
            g.add_argument(*args, **kwargs)


def _flag_help(name: str, spec) -> str:
    """The setting's line, its range and its default, as --help shows them."""
    default = getattr(Config(), name)
    low, high = spec.bounds
    parts = [spec.help]
    if low is not None and high is not None and not spec.choices and name != "gate_alpha":
        parts.append(f"{low:g}-{high:g}")
    if spec.choices and spec.metavar:  # choices the metavar does not show
        parts.append("one of " + ", ".join(c for c in spec.choices if c))
    if default not in ("", [], None):
        shown = "on" if default is True else "off" if default is False else f"{default:g}" if isinstance(default, float) else default
        parts.append(f"default {shown}")
    return "; ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="evolver",
        description="Evolve a tau2-bench agent's harness, keeping only changes a statistical gate confirms.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"evolver {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("init", help="set up a repository: agent/ from the template, evolver.toml, runs/ ignored")
    p.add_argument("dir", nargs="?", default=".", help="target directory (default: current)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        help="bring an auto-harness checkout (its agent, experiment_config.yaml and learnings), or a Life-Harness "
        "evaluation command line (in quotes; its settings and harness switches); prints what maps and what does not",
    )

    p = sub.add_parser(
        "eval", help="evaluate the agent in a checkout on tau2", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("path", nargs="?", default=".", help="repository holding agent/agent.py (default: current)")
    p.add_argument("--ref", help="evaluate this git commit or branch (e.g. evolver/RUN/best) instead of the working tree")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout (progress goes to stderr)")
    _add_setting_flags(
        p,
        "eval",
        {
            "evaluation": [
                (
                    ("--task-ids",),
                    {"nargs": "+", "metavar": "ID", "help": "task ids, comma- or space-separated (default: all tasks of the split)"},
                ),
                (("--num-tasks",), {"type": _positive(int), "metavar": "N", "help": "use only the first N selected tasks"}),
            ]
        },
    )

    p = sub.add_parser(
        "run",
        help="evolve the agent: baseline, then propose -> validate -> gate -> keep or reject",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="?", default=".", help="git repository holding agent/agent.py (default: current)")
    p.add_argument("--resume", metavar="RUN", help="continue an interrupted run (its configuration is kept)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the splits and what the run is expected to cost and can cost at most, then exit"
    )
    p.add_argument(
        "--pilot",
        type=_positive(int),
        metavar="N",
        help="with --dry-run: measure N simulations of the agent first, so the forecast has tokens and dollars per role",
    )
    p.add_argument("--allow-dirty", action="store_true", help="run from HEAD although agent/ has uncommitted changes")
    _add_setting_flags(p, "run")

    p = sub.add_parser(
        "compare",
        help="is B better than A, worse, or no evidence? both on the same tasks and seeds, side by side, look by look",
        description=COMPARE_HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "a", help="agent A: a git commit or branch, a folder holding agent/agent.py, or with --run a candidate (3, 3b, base, best)"
    )
    p.add_argument("b", help="agent B, named the same ways")
    p.add_argument("--repo", default=".", help="the git repository (default: current); the comparison lands in its runs/")
    p.add_argument("--run", metavar="RUN", help="A and B name candidates of this run: base, best, 3, 3b")
    p.add_argument(
        "--better", action="store_true", help="one-sided: is B better? (the gate's question); default: two-sided, better or worse"
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON on stdout (progress goes to stderr)")
    _add_setting_flags(
        p,
        "eval",
        {
            "evaluation": [
                (
                    ("--task-ids",),
                    {"nargs": "+", "metavar": "ID", "help": "task ids, comma- or space-separated (default: all tasks of the split)"},
                ),
                (("--num-tasks",), {"type": _positive(int), "metavar": "N", "help": "use only the first N selected tasks"}),
            ]
        },
        without=("trials",),
    )

    p = sub.add_parser(
        "transfer",
        help="does a run's kept harness help under another model? its base against its best, compared",
        description=TRANSFER_HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="the run whose base and best are compared")
    p.add_argument("--repo", default=".", help="repository (default: current)")
    p.add_argument("--each", action="store_true", help="compare every kept step with the one before, not only base with best")
    p.add_argument("--json", action="store_true", help="print the transfer as JSON on stdout (progress goes to stderr)")
    _add_setting_flags(p, "eval", without=("trials",))

    p = sub.add_parser("history", help="the candidates of a run: scores, verdicts, costs")
    p.add_argument("run", nargs="?", help="run id (default: the newest)")
    p.add_argument("--repo", default=".", help="repository (default: current)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("show", help="one candidate: rationale, diff, tasks that flipped; --turns TASK: a simulation as the model saw it")
    p.add_argument("run")
    p.add_argument("iteration", help="a candidate (3, or 3b in an iteration of several), or an iteration (3) to see all its candidates")
    p.add_argument("--repo", default=".")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--turns",
        metavar="TASK",
        help="a task's simulation turn by turn: what tau2 gave the harness, what the model was sent and "
        "answered, what went back, what the harness changed (ITER may be base)",
    )
    p.add_argument("--trial", type=int, default=0, help="with --turns: the trial (default 0)")

    p = sub.add_parser("report", help="write a run's report: one self-contained HTML file (runs/RUN/report.html)")
    p.add_argument("run", nargs="?", help="run id (default: the newest)")
    p.add_argument("--repo", default=".", help="repository (default: current)")
    p.add_argument(
        "--markdown", action="store_true", help="print a short markdown summary for a pull-request description (the path goes to stderr)"
    )

    p = sub.add_parser("rollback", help="move a run's best branch back to an earlier kept candidate or the base")
    p.add_argument("run")
    p.add_argument("--to", required=True, help="iteration number of a kept candidate, or 'base'")
    p.add_argument("--reason", required=True, help="why (recorded in the run log)")
    p.add_argument("--repo", default=".")

    p = sub.add_parser("status", help="what a running or finished run is doing: phase, simulations, cost per role, ETA")
    p.add_argument("run", nargs="?", help="run id (default: the newest)")
    p.add_argument("--repo", default=".")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("runs", help="the runs of a repository: status, best gate score, cost")
    p.add_argument("--repo", default=".", help="repository (default: current)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "daemon",
        help="the warm worker process that makes evaluations start fast: status or stop",
        description=DAEMON_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "action", choices=["status", "stop"], help="status: list running daemons; stop: let them exit once their current evaluations end"
    )

    p = sub.add_parser("tasks", help="list the task ids of a domain and split; --triage RUN: the tasks that are only noise")
    p.add_argument("domain", nargs="?", choices=DOMAINS, help="list this domain's task ids")
    p.add_argument("--split", help="train, test or base")
    p.add_argument(
        "--triage",
        metavar="RUN",
        help="flag the tasks of a run, comparison or evaluation that never passed, fail by the "
        "customer's doing, or never vary (exclude them with exclude_tasks)",
    )
    p.add_argument("--repo", default=".", help="with --triage: the repository (default: current)")
    p.add_argument("--json", action="store_true", help="with --triage: every task's counts and flags as JSON")
    return parser


def _overrides(args: argparse.Namespace) -> dict:
    """The settings given as flags (None: not given)."""
    return {name: getattr(args, name, None) for name in SPECS}
