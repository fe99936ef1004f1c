"""`evolver run`: start or resume a run, drive its loop, then print its history and best branch
(with --dry-run, its forecast; with --pilot, measured on a few simulations first)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path

from rich.console import Console

from evolver.cli.commands.parser import _overrides
from evolver.cli.commands.shared import EVAL_ROLES, EXIT_PAUSED, new_run_id, out_console
from evolver.config import DOMAINS, Config, with_default_models
from evolver.config_load import load_config
from evolver.config_requests import eval_request
from evolver.errors import UsageError


def _pilot(cfg: Config, backend, console: Console, repo: Path, n: int):
    """A dry run's pilot: n simulations of the agent as it is, one trial each, in a folder that is then removed;
    usage per simulation by role, wall seconds per simulation, and how many it measured."""

    def measure(tasks: list[str]):
        import tempfile

        from evolver.data import RoleUsage
        from evolver.evaluation.metrics import rewards_by_task
        from evolver.local.backend import serve_local

        with tempfile.TemporaryDirectory(prefix="evolver-pilot-") as tmp, serve_local(cfg, console, EVAL_ROLES) as (served, local_api_base):
            req = eval_request(served, repo, Path(tmp), local_api_base=local_api_base, task_ids=tasks[:n], trials=1, split=None)
            result = backend.evaluate(req, "pilot", timeout=cfg.worker_timeout)
        sims = max(1, result.summary.num_simulations - result.summary.infra_errors)
        per = {
            role: RoleUsage(
                prompt_tokens=round(u.prompt_tokens / sims), completion_tokens=round(u.completion_tokens / sims), cost=u.cost / sims
            )
            for role, u in result.summary.usage.items()
        }
        return per, result.summary.duration / sims, sims, rewards_by_task(result.simulations)

    return measure


def _transfer_at_end(run, cfg: Config, backend, console: Console) -> None:
    """`--transfer-models`: the finished run's base against its best under each model, on its gate tasks."""
    from evolver.cli.compare import transfer
    from evolver.local.backend import serve_local
    from evolver.store.lineage import Lineage

    if run.state().incumbent == 0:
        console.print("transfer: the run kept nothing, so there is nothing to transfer")
        return
    for model in cfg.transfer_models:
        other = dataclasses.replace(cfg, agent_model=model)
        console.print(f"transfer: base against best with the agent model {model}")
        with serve_local(other, console, EVAL_ROLES) as (other, local_api_base):
            transfer(
                run,
                other,
                backend,
                local_api_base,
                each=False,
                tasks=list(run.manifest().gate_tasks),
                transfer_id=new_run_id("transfer"),
                lineage=Lineage(run.repo, run.run_id),
                on_look=lambda look: console.print(f"look {look['look'] + 1}: {look['reason']}", highlight=False),
            )


def cmd_run(args: argparse.Namespace) -> int:
    from evolver.cli.compare import transfer_rows
    from evolver.cli.history import history_rows, policy_lines
    from evolver.cli.run_tables import history_table, transfer_table
    from evolver.cli.start import new_run, resume_run, start_run
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.local.backend import cap_concurrency
    from evolver.store.rundir import find_run
    from evolver.store.runstate import named

    console = Console(stderr=True, soft_wrap=True)
    repo = Path(args.path).resolve()
    with contextlib.ExitStack() as stack:
        serving = stack.enter_context(contextlib.ExitStack())  # the embedded model's server, from the preflight to the run's end
        if args.resume:
            run = find_run(repo, args.resume)
            stack.enter_context(run.lock())  # before anything is read or written: one driver per run
            given = {k: v for k, v in _overrides(args).items() if v is not None}
            loop = resume_run(
                run, given, console, lambda cfg: stack.enter_context(make_backend(cfg.backend, cfg.ray_address, cfg.rate_limits)), serving
            )
        else:
            cfg = load_config(repo, _overrides(args))
            cfg, note = with_default_models(cfg)  # said once the run could start: bad input gets one line
            if cfg.domain not in DOMAINS and not cfg.plugins:
                raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
            require_sandbox(cfg)
            cfg = cap_concurrency(cfg, console)  # before the estimate, which divides by it
            backend = stack.enter_context(make_backend(cfg.backend, cfg.ray_address, cfg.rate_limits))
            if args.pilot and not args.dry_run:
                raise UsageError("--pilot measures for a --dry-run's forecast; add --dry-run (a run measures its baseline anyway)")
            pilot = _pilot(cfg, backend, console, repo, args.pilot) if args.pilot else None
            made = new_run(
                repo,
                cfg,
                new_run_id("run"),
                backend,
                allow_dirty=args.allow_dirty,
                dry_run=args.dry_run,
                console=console,
                pilot=pilot,
                serving=serving,
            )
            if note:
                console.print(note)
            if made is None:
                return 0
            run = made.run
            stack.enter_context(run.lock())  # the record is all its folder holds yet
            loop = start_run(made, cfg, backend, console)
        console.print(f"run {run.run_id}: {run.path}")
        with serving:
            loop.drive()
        state = run.state()
        if state.status == "finished" and loop.ctx.cfg.transfer_models:
            _transfer_at_end(run, loop.ctx.cfg, loop.ctx.backend, console)
    out_console().print(history_table(run.run_id, history_rows(run)))
    if run.transfers():
        out_console().print(transfer_table(transfer_rows(run.transfers())))
    if state.status == "paused":
        return EXIT_PAUSED
    for line in policy_lines(run.manifest(), state):
        out_console().print(line, highlight=False)
    if state.incumbent == 0:
        out_console().print(f"best: evolver/{run.run_id}/best (the base: no candidate was kept, nothing to merge)")
    else:
        out_console().print(
            f"best: evolver/{run.run_id}/best ({named(run.best_label(state) or str(state.incumbent))}); "
            f"adopt it with `git merge evolver/{run.run_id}/best`"
        )
    return 0
