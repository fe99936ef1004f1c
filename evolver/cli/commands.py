"""Command line: `evolver init | eval | run | history | show | report | rollback | status | runs | tasks | daemon`."""

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
from evolver.config import DOMAINS, apply_default_models, eval_request, listing_request, load_config, setting
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


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models (litellm model strings)")
    g.add_argument("--agent-model", help="model of the agent being evolved")
    g.add_argument("--user-model", help="model of tau2's user simulator (it changes scores)")
    g.add_argument("--meta-model", help="model that proposes patches")
    g.add_argument("--judge-model", help="tau2's NL-assertion judge (default: the user model)")
    g.add_argument("--local-size", choices=["default", "small"], help="embedded model for roles set to 'local': default (1.5B) or small (0.5B, faster)")
    g.add_argument("--local-model", metavar="PATH", help="serve this GGUF file for roles set to 'local'")
    g.add_argument("--local-user-adapter", action=argparse.BooleanOptionalAction, default=None,
                   help="a 'local' user simulator is shown the conversation so that the small model plays the customer (default on)")
    g.add_argument("--api-base", help="OpenAI-compatible server for every role, e.g. http://127.0.0.1:8000/v1")
    for role in ("agent", "user", "meta"):
        g.add_argument(f"--{role}-api-base", help=f"server for the {role} role only (wins over --api-base)")


def _add_eval_flags(p: argparse.ArgumentParser, for_run: bool = False) -> None:
    g = p.add_argument_group("evaluation")
    g.add_argument("--domain", help=f"tau2 domain: {', '.join(DOMAINS)} (default mock)")
    if for_run:
        g.add_argument("--analysis-split", help="split whose failures the meta-LLM sees (default: train, or a seeded half)")
        g.add_argument("--gate-split", help="split the gate decides on (default: test, or the other seeded half)")
    else:
        g.add_argument("--split", help="tau2 task split: train or test (mock has only base); default: all tasks")
        g.add_argument("--task-ids", nargs="+", metavar="ID", help="task ids, comma- or space-separated (default: all tasks of the split)")
        g.add_argument("--num-tasks", type=_positive(int), help="use only the first N selected tasks")
        g.add_argument("--trials", help="trials per task, 1-1000 (default 1)")
    g.add_argument("--concurrency", help="simulations run at once, 1-256 (default 4)")
    g.add_argument("--seed", help="tau2 seed (default 300)")
    g.add_argument("--max-steps", help="step limit per simulation, 1-1000 (default 30)")
    g.add_argument("--worker-timeout", help="wall-clock limit of the worker, seconds (default 3600)")
    g.add_argument("--backend", help="where simulations run: local (this machine, default) or ray")
    g.add_argument("--ray-address", metavar="ADDRESS", help="with --backend ray: the cluster to join, or auto for a running one; "
                                                           "default: start a local Ray instance and stop it at exit")
    g = p.add_argument_group("sandbox (what candidate code may do: see the README's 'How honest is it')")
    g.add_argument("--agent-timeout", help="seconds the agent may compute on one turn, LLM calls not counted; past it the simulation fails (default 120)")
    g.add_argument("--agent-memory-mb", help="memory the agent process may use on top of its start, MiB; past it allocations fail (default 1024)")
    g.add_argument("--unsafe-no-sandbox", action="store_true", default=None,
                   help="run candidate code unconfined, with your files, keys and network in reach (scores can then be forged); "
                        "only where the sandbox cannot work, and never on code you would not run yourself")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="evolver", description="Evolve a tau2-bench agent's harness, keeping only changes a statistical gate confirms.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"evolver {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("init", help="set up a repository: agent/ from the template, evolver.toml, runs/ ignored")
    p.add_argument("dir", nargs="?", default=".", help="target directory (default: current)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")

    p = sub.add_parser("eval", help="evaluate the agent in a checkout on tau2", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", default=".", help="repository holding agent/agent.py (default: current)")
    p.add_argument("--ref", help="evaluate this git commit or branch (e.g. evolver/RUN/best) instead of the working tree")
    _add_eval_flags(p)
    _add_model_flags(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout (progress goes to stderr)")

    p = sub.add_parser("run", help="evolve the agent: baseline, then propose -> validate -> gate -> keep or reject", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", default=".", help="git repository holding agent/agent.py (default: current)")
    p.add_argument("--iterations", help="iterations to make (default 10); with --resume, the new total")
    p.add_argument("--candidates", help="candidates proposed from the same parent and evaluated at once per iteration, 1-8 (default 1); "
                                        "at most one is kept")
    p.add_argument("--resume", metavar="RUN", help="continue an interrupted run (its configuration is kept)")
    p.add_argument("--dry-run", action="store_true", help="print the splits and the most the run can cost, then exit")
    p.add_argument("--allow-dirty", action="store_true", help="run from HEAD although agent/ has uncommitted changes")
    g = p.add_argument_group("stopping")
    g.add_argument("--stall", help="stop after N consecutive candidates not kept (default 5; 0 never)")
    g.add_argument("--budget-usd", help="stop when all roles together have cost this much (0: no limit)")
    g.add_argument("--budget-tokens", help="stop when all roles together have used this many tokens (0: no limit)")
    g.add_argument("--max-hours", help="stop at this wall-clock limit (0: no limit)")
    p.add_argument("--track", help="experiment tracking: off (default) or mlflow (pip install 'evolver[mlflow]'; logs to mlruns/ or MLFLOW_TRACKING_URI)")
    g = p.add_argument_group("proposer (how each candidate is proposed)")
    g.add_argument("--proposer", help="agent (default: the meta model reads trajectories and code, edits a copy and tries it with tools), "
                                      "oneshot (one answer to the failure digest) or command (an external coding agent, --proposer-command)")
    g.add_argument("--proposer-turns", help="agent: meta-LLM calls per proposal (default 16)")
    g.add_argument("--proposer-tokens", help="agent: meta-LLM tokens per proposal (default 120000)")
    g.add_argument("--proposer-tries", help="agent: simulations of its edited agent on analysis tasks per proposal (default 6)")
    g.add_argument("--proposer-seconds", help="agent, command: wall-clock limit per proposal (default 300)")
    g.add_argument("--proposer-command", metavar="CMD", help="command: the command line, run confined in a workspace with agent/, the analysis "
                                                             "trajectories and TASK.md (e.g. \"codex exec --full-auto 'follow TASK.md'\")")
    g.add_argument("--proposer-env", metavar="NAMES", help="command: environment variables it gets, comma-separated (e.g. OPENAI_API_KEY); nothing else of yours")
    g.add_argument("--proposer-read", metavar="DIRS", help="command: folders it may read besides the system's and Python's, comma-separated")
    g = p.add_argument_group("gate (see docs/gate.md)")
    g.add_argument("--holdout", dest="holdout", action="store_const", const="on", help="seal part of the analysis split as a holdout")
    g.add_argument("--no-holdout", dest="holdout", action="store_const", const="off", help="no holdout (default: on when the analysis split has 40+ tasks)")
    g.add_argument("--gate-alpha", help="false-accept probability per decision for a no-effect candidate (default 0.05)")
    g.add_argument("--gate-min-effect", help="smallest mean gain worth keeping, reward units (0.05 = 5 points)")
    g.add_argument("--gate-stages", help="cumulative candidate trials per task at each look (default 1,2,3,4,6)")
    _add_eval_flags(p, for_run=True)
    _add_model_flags(p)

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

    p = sub.add_parser("tasks", help="list the task ids of a domain and split")
    p.add_argument("domain", choices=DOMAINS)
    p.add_argument("--split", help="train, test or base")
    return parser


def _overrides(args: argparse.Namespace) -> dict:
    keys = ["agent_model", "user_model", "meta_model", "judge_model", "local_size", "local_model", "local_user_adapter", "api_base", "agent_api_base", "user_api_base", "meta_api_base",
            "domain", "split", "trials", "concurrency", "seed", "max_steps", "worker_timeout", "backend", "ray_address", "agent_timeout", "agent_memory_mb", "unsafe_no_sandbox",
            "analysis_split", "gate_split", "iterations", "candidates", "stall", "budget_usd", "budget_tokens", "max_hours", "holdout", "gate_alpha", "gate_min_effect", "gate_stages",
            "track", "proposer", "proposer_turns", "proposer_tokens", "proposer_tries", "proposer_seconds", "proposer_command", "proposer_env", "proposer_read"]
    return {k: getattr(args, k, None) for k in keys}


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
        with make_backend(cfg.backend, cfg.ray_address) as backend:
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


def cmd_init(args: argparse.Namespace) -> int:
    from evolver.cli.scaffold import init_repo

    written = init_repo(Path(args.dir), force=args.force)
    print(f"initialised {Path(args.dir).resolve()}: " + ", ".join(written))
    print("next: commit these files (git add -A && git commit), then `evolver eval`; with no OPENAI_API_KEY and no "
          "--agent-model it runs on the embedded local model")
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
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


def cmd_run(args: argparse.Namespace) -> int:
    from evolver.cli.console import history_table
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
                raise UsageError(f"--resume keeps the settings the run recorded; drop {', '.join('--' + k.replace('_', '-') for k in given)} (only --iterations may change)")
            stack.enter_context(run.lock())  # before anything is read or written: one driver per run
            iterations = None if args.iterations is None else setting("iterations", args.iterations, "--iterations")
            loop = resume_run(run, iterations, console)
            loop.backend = stack.enter_context(make_backend(loop.cfg.backend, loop.cfg.ray_address))
        else:
            cfg = load_config(repo, _overrides(args))
            note = apply_default_models(cfg)  # said once the run could start: bad input gets one line
            if cfg.domain not in DOMAINS and not cfg.plugins:
                raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
            require_sandbox(cfg)
            cap_concurrency(cfg, console)  # before the estimate, which divides by it
            backend = stack.enter_context(make_backend(cfg.backend, cfg.ray_address))
            loop = new_run(repo, cfg, new_run_id("run"), backend, allow_dirty=args.allow_dirty, dry_run=args.dry_run, console=console)
            if note:
                console.print(note)
            if loop is None:
                return 0
            run = loop.run
            stack.enter_context(run.lock())
        console.print(f"run {run.run_id}: {run.path}")
        with serve_local(loop.cfg, console) as local_api_base:
            loop.drive(local_api_base)
    out_console().print(history_table(run.run_id, history_rows(run)))
    state = run.state()
    if state.status == "paused":
        return EXIT_PAUSED
    alpha = run.manifest().gate["alpha"]
    out_console().print(f"{state.decisions} gate decision(s) at a false-accept rate of {alpha:g} each: "
                        f"expected false keeps {state.decisions * alpha:.2f}")
    out_console().print(f"best: evolver/{run.run_id}/best ({'base' if state.incumbent == 0 else f'iteration {state.incumbent}'}); "
                    f"adopt it with `git merge evolver/{run.run_id}/best`")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from evolver.cli.console import history_table
    from evolver.cli.history import history_rows
    from evolver.store.runstate import find_run

    run = find_run(Path(args.repo).resolve(), args.run)
    rows = history_rows(run)
    if args.json:
        print(json.dumps({"run_id": run.run_id, "candidates": rows}, indent=2))
    else:
        out_console().print(history_table(run.run_id, rows))
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
        print("evolver: error: a command is needed (init, eval, run, history, show, report, rollback, status, runs, tasks, daemon); see `evolver --help`", file=sys.stderr)
        return 2
    # SIGTERM stops a command as Ctrl-C does: the run records "interrupted", workers and the
    # embedded model's server are stopped on the way out instead of being left behind.
    signal.signal(signal.SIGTERM, _interrupt)
    handler = {"eval": cmd_eval, "init": cmd_init, "tasks": cmd_tasks, "run": cmd_run, "history": cmd_history,
               "show": cmd_show, "report": cmd_report, "rollback": cmd_rollback, "status": cmd_status, "runs": cmd_runs, "daemon": cmd_daemon}[args.command]
    try:
        if args.command in ("eval", "run"):
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
