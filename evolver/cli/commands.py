"""Command line: `evolver init | eval | compare | run | transfer | history | show | report | rollback | status | runs | tasks | daemon`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from rich.console import Console

from evolver import __version__
from evolver.config import DOMAINS, GROUPS, SPECS, Config, apply_default_models, checked, eval_request, flag_of, listing_request, load_config
from evolver.errors import UsageError

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


EVAL_ROLES = ("agent", "user")
EXIT_NOTHING_MEASURED = 4  # eval: every simulation was an infrastructure error
EXIT_PAUSED = 3  # run: paused because the meta-LLM stayed down; resume it


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
GROUP_ORDER = {"eval": ("evaluation", "sandbox", "models"), "run": ("runs", "stopping", "proposer", "gate", "evaluation", "sandbox", "models")}


def _add_setting_flags(p: argparse.ArgumentParser, command: str, extra: dict[str, list] | None = None, without: tuple[str, ...] = ()) -> None:
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
                g.add_argument(flag_of(name), dest=name, action="append", metavar=spec.metavar,
                               help=spec.help + ("; repeat it per argument" if spec.style == "table" else "; repeat it per model"))
            elif spec.style == "on_off":  # --holdout / --no-holdout; auto when neither is given
                g.add_argument(flag, dest=name, action="store_const", const="on", help=spec.help)
                g.add_argument("--no-" + flag[2:], dest=name, action="store_const", const="off", help=f"no {name.replace('_', ' ')} (default: auto)")
            else:
                kind = type(getattr(Config(), name))
                metavar = spec.metavar or ("{" + ",".join(spec.choices) + "}" if spec.choices else {int: "N", float: "X", list: "A,B"}.get(kind, "TEXT"))
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
    parser = Parser(prog="evolver", description="Evolve a tau2-bench agent's harness, keeping only changes a statistical gate confirms.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"evolver {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("init", help="set up a repository: agent/ from the template, evolver.toml, runs/ ignored")
    p.add_argument("dir", nargs="?", default=".", help="target directory (default: current)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--from", dest="source", metavar="SOURCE",
                   help="bring an auto-harness checkout (its agent, experiment_config.yaml and learnings), or a Life-Harness "
                        "evaluation command line (in quotes; its settings and harness switches); prints what maps and what does not")

    p = sub.add_parser("eval", help="evaluate the agent in a checkout on tau2", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", default=".", help="repository holding agent/agent.py (default: current)")
    p.add_argument("--ref", help="evaluate this git commit or branch (e.g. evolver/RUN/best) instead of the working tree")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout (progress goes to stderr)")
    _add_setting_flags(p, "eval", {"evaluation": [
        (("--task-ids",), {"nargs": "+", "metavar": "ID", "help": "task ids, comma- or space-separated (default: all tasks of the split)"}),
        (("--num-tasks",), {"type": _positive(int), "metavar": "N", "help": "use only the first N selected tasks"}),
    ]})

    p = sub.add_parser("run", help="evolve the agent: baseline, then propose -> validate -> gate -> keep or reject", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", default=".", help="git repository holding agent/agent.py (default: current)")
    p.add_argument("--resume", metavar="RUN", help="continue an interrupted run (its configuration is kept)")
    p.add_argument("--dry-run", action="store_true", help="print the splits and what the run is expected to cost and can cost at most, then exit")
    p.add_argument("--pilot", type=_positive(int), metavar="N", help="with --dry-run: measure N simulations of the agent first, "
                                                                     "so the forecast has tokens and dollars per role")
    p.add_argument("--allow-dirty", action="store_true", help="run from HEAD although agent/ has uncommitted changes")
    _add_setting_flags(p, "run")

    p = sub.add_parser("compare", help="is B better than A, worse, or no evidence? both on the same tasks and seeds, side by side, look by look",
                       description=COMPARE_HELP, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="agent A: a git commit or branch, a folder holding agent/agent.py, or with --run a candidate (3, 3b, base, best)")
    p.add_argument("b", help="agent B, named the same ways")
    p.add_argument("--repo", default=".", help="the git repository (default: current); the comparison lands in its runs/")
    p.add_argument("--run", metavar="RUN", help="A and B name candidates of this run: base, best, 3, 3b")
    p.add_argument("--better", action="store_true", help="one-sided: is B better? (the gate's question); default: two-sided, better or worse")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON on stdout (progress goes to stderr)")
    _add_setting_flags(p, "eval", {"evaluation": [
        (("--task-ids",), {"nargs": "+", "metavar": "ID", "help": "task ids, comma- or space-separated (default: all tasks of the split)"}),
        (("--num-tasks",), {"type": _positive(int), "metavar": "N", "help": "use only the first N selected tasks"}),
    ]}, without=("trials",))

    p = sub.add_parser("transfer", help="does a run's kept harness help under another model? its base against its best, compared",
                       description=TRANSFER_HELP, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="the run whose base and best are compared")
    p.add_argument("--repo", default=".", help="repository (default: current)")
    p.add_argument("--each", action="store_true", help="compare every kept step with the one before, not only base with best")
    p.add_argument("--json", action="store_true", help="print the transfer as JSON on stdout (progress goes to stderr)")
    _add_setting_flags(p, "eval", without=("trials",))

    p = sub.add_parser("history", help="the candidates of a run: scores, verdicts, costs")
    p.add_argument("run", nargs="?", help="run id (default: the newest)")
    p.add_argument("--repo", default=".", help="repository (default: current)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("show", help="one candidate: rationale, diff, tasks that flipped")
    p.add_argument("run")
    p.add_argument("iteration", help="a candidate (3, or 3b in an iteration of several), or an iteration (3) to see all its candidates")
    p.add_argument("--repo", default=".")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("report", help="write a run's report: one self-contained HTML file (runs/RUN/report.html)")
    p.add_argument("run", nargs="?", help="run id (default: the newest)")
    p.add_argument("--repo", default=".", help="repository (default: current)")
    p.add_argument("--markdown", action="store_true", help="print a short markdown summary for a pull-request description (the path goes to stderr)")

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

    p = sub.add_parser("daemon", help="the warm worker process that makes evaluations start fast: status or stop",
                       description=DAEMON_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["status", "stop"], help="status: list running daemons; stop: let them exit once their current evaluations end")

    p = sub.add_parser("tasks", help="list the task ids of a domain and split; --triage RUN: the tasks that are only noise")
    p.add_argument("domain", nargs="?", choices=DOMAINS, help="list this domain's task ids")
    p.add_argument("--split", help="train, test or base")
    p.add_argument("--triage", metavar="RUN", help="flag the tasks of a run, comparison or evaluation that never passed, fail by the "
                                                   "customer's doing, or never vary (exclude them with exclude_tasks)")
    p.add_argument("--repo", default=".", help="with --triage: the repository (default: current)")
    p.add_argument("--json", action="store_true", help="with --triage: every task's counts and flags as JSON")
    return parser


def _overrides(args: argparse.Namespace) -> dict:
    """The settings given as flags (None: not given)."""
    return {name: getattr(args, name, None) for name in SPECS}


def out_console() -> Console:
    """Stdout; wide when piped, so tables are not folded into 80 columns."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def new_run_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def _check_repo(path: Path) -> Path:
    path = path.resolve()
    if not (path / "agent" / "agent.py").is_file():
        raise UsageError(f"no agent/agent.py in {path}; run `evolver init {path}` to create one from the template")
    return path


def cmd_eval(args: argparse.Namespace) -> int:
    from evolver.cli.console import eval_table, progress_bar
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.llm import check_api_base
    from evolver.local.backend import serve_local
    from evolver.store.runstate import eval_run_dir

    repo = Path(args.path).resolve()
    if not args.ref:
        _check_repo(repo)
    cfg = load_config(repo, _overrides(args))
    console = Console(stderr=True, soft_wrap=True)
    note = apply_default_models(cfg, roles=EVAL_ROLES)  # no meta-LLM in an evaluation; said once the input is known good
    if cfg.domain not in DOMAINS and not cfg.plugins:
        raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
    require_sandbox(cfg)
    for base in {cfg.role("agent").api_base, cfg.role("user").api_base} - {None}:
        check_api_base(base)
    task_ids = [t.strip() for arg in args.task_ids for t in arg.split(",") if t.strip()] if args.task_ids else None
    run_id = new_run_id("eval")
    evaluation = eval_run_dir(repo, run_id)
    checkout, lineage = repo, None
    if args.ref:  # a commit is evaluated in its own worktree; the working tree is not touched
        from evolver.store.lineage import Lineage, exclude_runs_dir  # gitpython only when needed: it slows every start

        lineage = Lineage(repo, run_id)
        commit = lineage.commit_of(args.ref)
        if commit is None:
            raise UsageError(f"unknown git ref '{args.ref}' in {repo}; see `git branch --list 'evolver/*'`")
        checkout = lineage.open_worktree(evaluation.checkout_dir, commit)
        exclude_runs_dir(repo)
    try:
        if args.ref and not (checkout / "agent" / "agent.py").is_file():
            raise UsageError(f"{args.ref} has no agent/agent.py; pick a commit of an evolver-initialised repository")
        with make_backend(cfg.backend, cfg.ray_address, cfg.rate_limits) as backend:
            if cfg.uses_local_server(EVAL_ROLES):  # a misspelt split or task id fails before minutes of model start-up
                backend.list_tasks(listing_request(cfg, checkout, evaluation.listing().path, task_ids=task_ids, num_tasks=args.num_tasks))
            if note:
                console.print(note)
            with serve_local(cfg, console, EVAL_ROLES) as local_api_base, progress_bar(console, "simulations") as update:
                req = eval_request(cfg, checkout, evaluation.path, local_api_base=local_api_base, task_ids=task_ids, num_tasks=args.num_tasks)
                result = backend.evaluate(req, run_id, timeout=cfg.worker_timeout, on_progress=update)
    except UsageError:
        if lineage:
            lineage.remove_worktree(checkout)
        evaluation.discard()  # it holds no result: nothing may be mistaken for one
        raise
    if lineage:
        lineage.remove_worktree(checkout)
    evaluation.write_result(result)
    if args.json:
        print(json.dumps({"run_id": run_id, "result_file": str(evaluation.result_file()), **result.summary.model_dump()}, indent=2))
    else:
        out_console().print(eval_table(result))
        out_console().print(f"results: {evaluation.result_file()}")
    if result.candidate_error:
        console.print(f"[red]candidate error:[/red] {result.candidate_error}")
        return 1
    if result.summary.infra_errors == result.summary.num_simulations:
        sides = "; ".join(f"{role}: {t.count}, first: {t.first}" for role, t in sorted(result.summary.infra_by_role.items()))
        console.print(f"[red]no simulation could be scored[/red]: all {result.summary.num_simulations} hit infrastructure errors "
                      f"({sides or 'unknown'}); nothing was measured", markup=True, highlight=False)
        return EXIT_NOTHING_MEASURED
    if result.worker_note:
        console.print(f"[yellow]note:[/yellow] {result.worker_note}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from evolver.cli.compare import compare_arms, lines, resolve
    from evolver.cli.console import progress_bar
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.evolution.gate.compare import CompareConfig
    from evolver.llm import check_api_base
    from evolver.local.backend import serve_local
    from evolver.store.lineage import Lineage, exclude_runs_dir
    from evolver.store.runstate import comparison_dir, find_run

    repo = Path(args.repo).resolve()
    cfg = load_config(repo, _overrides(args))
    console = Console(stderr=True, soft_wrap=True)
    note = apply_default_models(cfg, roles=EVAL_ROLES)
    if cfg.domain not in DOMAINS and not cfg.plugins:
        raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
    require_sandbox(cfg)
    for base in {cfg.role("agent").api_base, cfg.role("user").api_base} - {None}:
        check_api_base(base)
    run = find_run(repo, args.run) if args.run else None
    task_ids = [t.strip() for arg in args.task_ids for t in arg.split(",") if t.strip()] if args.task_ids else None
    compare_id = new_run_id("compare")
    out = comparison_dir(repo, compare_id)
    lineage = Lineage(repo, compare_id)
    arms = []
    try:
        arms = [resolve(spec, repo, name, out, lineage, run) for name, spec in (("a", args.a), ("b", args.b))]
        exclude_runs_dir(repo)
        with make_backend(cfg.backend, cfg.ray_address, cfg.rate_limits) as backend:
            backend.list_tasks(listing_request(cfg, arms[0].checkout, out.listing().path, task_ids=task_ids, num_tasks=args.num_tasks))
            if note:
                console.print(note)
            config = CompareConfig(sided="better" if args.better else "two")
            with serve_local(cfg, console, EVAL_ROLES) as local_api_base, progress_bar(console, "A") as bar_a, progress_bar(console, "B") as bar_b:
                record = compare_arms(cfg, backend, local_api_base, *arms, out, compare_id, tasks=task_ids, num_tasks=args.num_tasks,
                                      config=config, on_progress=lambda arm, *p: (bar_a if arm == "a" else bar_b)(*p),
                                      on_look=lambda look: console.print(f"look {look['look'] + 1}: {look['reason']}", highlight=False))
    except UsageError:
        out.discard()
        raise
    finally:
        for arm in arms:
            if arm.commit:
                lineage.remove_worktree(arm.checkout)
    if args.json:
        print(json.dumps({**record, "comparison_file": str(out.file)}, indent=2))
    else:
        for line in lines(record):
            out_console().print(line, highlight=False)
        out_console().print(f"comparison: {out.file}")
    return EXIT_NOTHING_MEASURED if record["decision"] == "undecided" else 0


def cmd_transfer(args: argparse.Namespace) -> int:
    from evolver.cli.compare import transfer, transfer_rows
    from evolver.cli.console import progress_bar, transfer_table
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.llm import check_api_base
    from evolver.local.backend import serve_local
    from evolver.store.lineage import Lineage
    from evolver.store.runstate import find_run

    repo = Path(args.repo).resolve()
    run = find_run(repo, args.run)
    manifest = run.manifest()
    cfg = Config(**manifest.config)  # the run's own settings, with what is given here on top
    given = {k: v for k, v in _overrides(args).items() if v is not None}
    for key, value in given.items():
        setattr(cfg, key, checked(key, value, "--" + key.replace("_", "-")))
    if cfg.domain not in DOMAINS and not cfg.plugins:
        raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
    require_sandbox(cfg)
    for base in {cfg.role("agent").api_base, cfg.role("user").api_base} - {None}:
        check_api_base(base)
    tasks = None if {"domain", "split"} & given.keys() else list(manifest.gate_tasks)
    transfer_id = new_run_id("transfer")
    console = Console(stderr=True, soft_wrap=True)
    lineage = Lineage(repo, run.run_id)
    try:
        with make_backend(cfg.backend, cfg.ray_address, cfg.rate_limits) as backend:
            backend.list_tasks(listing_request(cfg, repo, run.transfer(transfer_id).listing().path, task_ids=tasks))
            with serve_local(cfg, console, EVAL_ROLES) as local_api_base, progress_bar(console, "A") as bar_a, progress_bar(console, "B") as bar_b:
                record = transfer(run, cfg, backend, local_api_base, each=args.each, tasks=tasks, transfer_id=transfer_id, lineage=lineage,
                                  on_progress=lambda arm, *p: (bar_a if arm == "a" else bar_b)(*p),
                                  on_look=lambda look: console.print(f"look {look['look'] + 1}: {look['reason']}", highlight=False))
    except UsageError:
        run.transfer(transfer_id).discard()
        raise
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        out_console().print(transfer_table(transfer_rows([record])))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from evolver.cli.scaffold import init_repo

    migration = None
    if args.source is not None:
        from evolver.cli.migrate import read_source

        migration = read_source(args.source)  # bad input fails here, before anything is written
    written = init_repo(Path(args.dir), force=args.force, migration=migration)
    print(f"initialised {Path(args.dir).resolve()}" + (f" from {migration.source}" if migration else "") + ": " + ", ".join(written))
    if migration:
        print("mapped:")
        print("\n".join(f"  {line}" for line in migration.mapped))
        print("left out (no equivalent in evolver, or not needed):")
        print("\n".join(f"  {line}" for line in migration.left_out) or "  nothing")
    print("next: commit these files (git add -A && git commit), then `evolver eval`; with no OPENAI_API_KEY and no "
          "--agent-model it runs on the embedded local model")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    if args.triage:
        return _triage(args)
    if not args.domain:
        raise UsageError(f"name a domain ({', '.join(DOMAINS)}), or --triage RUN")
    from evolver.llm import prepare_environment

    prepare_environment()
    from tau2.run import load_tasks

    from evolver.evaluation.worker import available_splits

    splits = available_splits(args.domain)
    if args.split and args.split not in splits:
        raise UsageError(f"domain '{args.domain}' has no split '{args.split}'; its splits: {', '.join(sorted(splits)) or 'none'}")
    for task in load_tasks(args.domain, args.split):
        print(task.id)
    return 0


def _triage(args: argparse.Namespace) -> int:
    import dataclasses

    from evolver.evolution.triage import triage
    from evolver.store.runstate import measured

    tasks = triage(measured(Path(args.repo).resolve(), args.triage))
    if args.json:
        print(json.dumps([{**dataclasses.asdict(t), "pass_rate": t.pass_rate} for t in tasks], indent=2))
        return 0
    flagged = [t for t in tasks if t.flags]
    print(f"{len(flagged)} of {len(tasks)} task(s) flagged in {args.triage}")
    for t in flagged:
        print(f"{t.task}: {'; '.join(f'{flag} ({why})' for flag, why in zip(t.flags, t.why))}")
    if flagged:
        print(f"exclude them from a run: exclude_tasks = [{', '.join(repr(t.task) for t in flagged)}] in evolver.toml, or --exclude-tasks")
    return 0


def _pilot(cfg: Config, backend, console: Console, repo: Path, n: int):
    """A dry run's pilot: n simulations of the agent as it is, one trial each, in a folder that is then removed;
    usage per simulation by role, wall seconds per simulation, and how many it measured."""
    def measure(tasks: list[str]):
        import tempfile

        from evolver.data import RoleUsage
        from evolver.evaluation.metrics import rewards_by_task
        from evolver.local.backend import serve_local

        with tempfile.TemporaryDirectory(prefix="evolver-pilot-") as tmp, serve_local(cfg, console, EVAL_ROLES) as local_api_base:
            req = eval_request(cfg, repo, Path(tmp), local_api_base=local_api_base, task_ids=tasks[:n], trials=1, split=None)
            result = backend.evaluate(req, "pilot", timeout=cfg.worker_timeout)
        sims = max(1, result.summary.num_simulations - result.summary.infra_errors)
        per = {role: RoleUsage(prompt_tokens=round(u.prompt_tokens / sims), completion_tokens=round(u.completion_tokens / sims), cost=u.cost / sims)
               for role, u in result.summary.usage.items()}
        return per, result.summary.duration / sims, sims, rewards_by_task(result.simulations)

    return measure


def _transfer_at_end(run, cfg: Config, backend, console: Console) -> None:
    """`--transfer-models`: the finished run's base against its best under each model, on its gate tasks."""
    import dataclasses

    from evolver.cli.compare import transfer
    from evolver.local.backend import serve_local
    from evolver.store.lineage import Lineage

    if run.state().incumbent == 0:
        console.print("transfer: the run kept nothing, so there is nothing to transfer")
        return
    for model in cfg.transfer_models:
        other = dataclasses.replace(cfg, agent_model=model)
        console.print(f"transfer: base against best with the agent model {model}")
        with serve_local(other, console, EVAL_ROLES) as local_api_base:
            transfer(run, other, backend, local_api_base, each=False, tasks=list(run.manifest().gate_tasks), transfer_id=new_run_id("transfer"),
                     lineage=Lineage(run.repo, run.run_id), on_look=lambda look: console.print(f"look {look['look'] + 1}: {look['reason']}",
                                                                                               highlight=False))


def cmd_run(args: argparse.Namespace) -> int:
    from evolver.cli.compare import transfer_rows
    from evolver.cli.console import history_table, transfer_table
    from evolver.cli.history import history_rows
    from evolver.cli.start import new_run, resume_run
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.local.backend import cap_concurrency, serve_local
    from evolver.store.runstate import find_run

    console = Console(stderr=True, soft_wrap=True)
    repo = Path(args.path).resolve()
    with contextlib.ExitStack() as stack:
        if args.resume:
            run = find_run(repo, args.resume)
            given = sorted(k for k, v in _overrides(args).items() if v is not None and k != "iterations")
            if given:  # the run's recorded settings win: say so rather than ignore the flag
                raise UsageError(f"--resume keeps the settings the run recorded; drop {', '.join(flag_of(k) for k in given)} (only --iterations may change)")
            stack.enter_context(run.lock())  # before anything is read or written: one driver per run
            iterations = None if args.iterations is None else checked("iterations", args.iterations, "--iterations")
            loop = resume_run(run, iterations, console)
            loop.backend = stack.enter_context(make_backend(loop.cfg.backend, loop.cfg.ray_address, loop.cfg.rate_limits))
        else:
            cfg = load_config(repo, _overrides(args))
            note = apply_default_models(cfg)  # said once the run could start: bad input gets one line
            if cfg.domain not in DOMAINS and not cfg.plugins:
                raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
            require_sandbox(cfg)
            cap_concurrency(cfg, console)  # before the estimate, which divides by it
            backend = stack.enter_context(make_backend(cfg.backend, cfg.ray_address, cfg.rate_limits))
            if args.pilot and not args.dry_run:
                raise UsageError("--pilot measures for a --dry-run's forecast; add --dry-run (a run measures its baseline anyway)")
            pilot = _pilot(cfg, backend, console, repo, args.pilot) if args.pilot else None
            loop = new_run(repo, cfg, new_run_id("run"), backend, allow_dirty=args.allow_dirty, dry_run=args.dry_run, console=console,
                           pilot=pilot)
            if note:
                console.print(note)
            if loop is None:
                return 0
            run = loop.run
            stack.enter_context(run.lock())
        console.print(f"run {run.run_id}: {run.path}")
        with serve_local(loop.cfg, console) as local_api_base:
            loop.drive(local_api_base)
        state = run.state()
        if state.status == "finished" and loop.cfg.transfer_models:
            _transfer_at_end(run, loop.cfg, loop.backend, console)
    out_console().print(history_table(run.run_id, history_rows(run)))
    if run.transfers():
        out_console().print(transfer_table(transfer_rows(run.transfers())))
    if state.status == "paused":
        return EXIT_PAUSED
    alpha = run.manifest().gate["alpha"]
    out_console().print(f"{state.decisions} gate decision(s) at a false-accept rate of {alpha:g} each: "
                        f"expected false keeps {state.decisions * alpha:.2f}")
    out_console().print(f"best: evolver/{run.run_id}/best ({'base' if state.incumbent == 0 else f'iteration {state.incumbent}'}); "
                    f"adopt it with `git merge evolver/{run.run_id}/best`")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from evolver.cli.compare import transfer_rows
    from evolver.cli.console import history_table, transfer_table
    from evolver.cli.history import history_rows
    from evolver.store.runstate import find_run

    run = find_run(Path(args.repo).resolve(), args.run)
    rows = history_rows(run)
    transfers = transfer_rows(run.transfers())
    if args.json:
        print(json.dumps({"run_id": run.run_id, "candidates": rows, "transfers": transfers}, indent=2))
    else:
        out_console().print(history_table(run.run_id, rows))
        if transfers:
            out_console().print(transfer_table(transfers))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from evolver.cli.console import show_candidate
    from evolver.cli.history import show
    from evolver.store.runstate import find_run

    info = show(find_run(Path(args.repo).resolve(), args.run), args.iteration)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        show_candidate(out_console(), info)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from evolver.cli.runreport import write_report
    from evolver.cli.runreport.facts import collect
    from evolver.store.lineage import open_repo
    from evolver.store.runstate import find_run

    repo = Path(args.repo).resolve()
    open_repo(repo)  # a folder that is not a repository says so, not "no runs"
    run = find_run(repo, args.run)
    facts = collect(run)
    path = write_report(run, facts)
    if args.markdown:
        from evolver.cli.runreport.markdown import summary

        print(summary(facts), end="")
        print(f"report: {path}", file=sys.stderr)
    else:
        print(path)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from evolver.cli.history import rollback
    from evolver.store.runstate import find_run

    run = find_run(Path(args.repo).resolve(), args.run)
    change = rollback(run, args.to, args.reason)
    target = "the base" if change.iteration == 0 else f"iteration {change.iteration}"
    print(f"evolver/{run.run_id}/best now points at {target} ({change.commit[:10]}); recorded in {run.log_file}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from evolver.cli.console import status_table
    from evolver.cli.history import status
    from evolver.store.runstate import find_run

    info = status(find_run(Path(args.repo).resolve(), args.run))
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        out_console().print(status_table(info))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from evolver.cli.console import runs_table
    from evolver.cli.history import runs
    from evolver.store.runstate import runs_dir

    repo = Path(args.repo).resolve()
    if not repo.is_dir():  # an empty list would read as "no runs yet" for a mistyped path
        raise UsageError(f"{repo} is not a folder; pass --repo the repository whose runs you want")
    rows = runs(repo)
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no runs in {runs_dir(repo)}; start one with `evolver run`")
    else:
        out_console().print(runs_table(rows))
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    from evolver.evaluation import zygote_client

    if args.action == "stop":
        print(f"asked {zygote_client.stop_all()} daemon(s) to stop; each exits once its current evaluations end")
        return 0
    daemons = zygote_client.running()
    if not daemons:
        print(f"no daemon running (in {zygote_client.runtime_dir()})")
    for path, info in daemons:
        age = time.time() - info["started"]
        state = "stopping" if info["stopping"] else "current code" if info["current"] else "older code, exits when idle"
        print(f"pid {info['pid']}: up {age / 60:.1f} min, {info['served']} process(es) forked, {info['workers']} running, "
              f"{info['clients'] - 1} other client(s), idle limit {info['idle_seconds']:g} s, {state}; {path}")
    return 0


def preload() -> None:
    """What `evolver eval` imports, done once in the warm zygote (evolver.cli.launch hands `eval` to it),
    so that its commands start as fast as its workers."""
    import evolver.evaluation.backends.local, evolver.local.backend, evolver.cli.console  # noqa: E401, F401


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        print("evolver: error: a command is needed (init, eval, compare, run, transfer, history, show, report, rollback, status, runs, tasks, daemon); see `evolver --help`", file=sys.stderr)
        return 2
    # SIGTERM stops a command as Ctrl-C does: the run records "interrupted", workers and the
    # embedded model's server are stopped on the way out instead of being left behind.
    signal.signal(signal.SIGTERM, _interrupt)
    handler = {"eval": cmd_eval, "compare": cmd_compare, "transfer": cmd_transfer, "init": cmd_init, "tasks": cmd_tasks, "run": cmd_run, "history": cmd_history,
               "show": cmd_show, "report": cmd_report, "rollback": cmd_rollback, "status": cmd_status, "runs": cmd_runs, "daemon": cmd_daemon}[args.command]
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
        print(f"evolver: error: git failed: {detail.removeprefix('stderr: ').strip(chr(39))}; fix the repository and try again", file=sys.stderr)
        return 2
