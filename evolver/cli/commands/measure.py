"""The commands that measure agents: `eval` (one agent), `compare` (two, side by side) and
`transfer` (a run's kept harness under other models)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console

from evolver.cli.commands.parser import _overrides
from evolver.cli.commands.shared import EVAL_ROLES, EXIT_NOTHING_MEASURED, new_run_id, out_console
from evolver.config import DOMAINS, Config, with_default_models
from evolver.config_load import checked, load_config
from evolver.config_requests import eval_request, listing_request
from evolver.errors import UsageError


def _check_repo(path: Path) -> Path:
    path = path.resolve()
    if not (path / "agent" / "agent.py").is_file():
        raise UsageError(f"no agent/agent.py in {path}; run `evolver init {path}` to create one from the template")
    return path


def cmd_eval(args: argparse.Namespace) -> int:
    from evolver.cli.console import eval_table, progress_bar
    from evolver.cli.preflight import SIMULATED, check_servers, preflighted
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.store.rundir import eval_run_dir

    repo = Path(args.path).resolve()
    if not args.ref:
        _check_repo(repo)
    cfg = load_config(repo, _overrides(args))
    console = Console(stderr=True, soft_wrap=True)
    cfg, note = with_default_models(cfg, roles=EVAL_ROLES)  # no meta-LLM in an evaluation; said once the input is known good
    if cfg.domain not in DOMAINS and not cfg.plugins:
        raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
    require_sandbox(cfg)
    check_servers(cfg, ("agent", "user"))
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
            if cfg.preflight or cfg.uses_local_server(EVAL_ROLES):  # a misspelt split or task id fails first, in one line
                backend.list_tasks(listing_request(cfg, checkout, evaluation.listing().path, task_ids=task_ids, num_tasks=args.num_tasks))
            if note:
                console.print(note)
            with preflighted(cfg, console, SIMULATED) as (cfg, local_api_base), progress_bar(console, "simulations") as update:
                req = eval_request(
                    cfg, checkout, evaluation.path, local_api_base=local_api_base, task_ids=task_ids, num_tasks=args.num_tasks
                )
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
        console.print(
            f"[red]no simulation could be scored[/red]: all {result.summary.num_simulations} hit infrastructure errors "
            f"({sides or 'unknown'}); nothing was measured",
            markup=True,
            highlight=False,
        )
        return EXIT_NOTHING_MEASURED
    if result.worker_note:
        console.print(f"[yellow]note:[/yellow] {result.worker_note}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from evolver.cli.compare import compare_arms, lines, resolve
    from evolver.cli.console import progress_bar
    from evolver.cli.preflight import SIMULATED, check_servers, preflighted
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.evolution.gate.compare import CompareConfig
    from evolver.store.lineage import Lineage, exclude_runs_dir
    from evolver.store.rundir import comparison_dir, find_run

    repo = Path(args.repo).resolve()
    cfg = load_config(repo, _overrides(args))
    console = Console(stderr=True, soft_wrap=True)
    cfg, note = with_default_models(cfg, roles=EVAL_ROLES)
    if cfg.domain not in DOMAINS and not cfg.plugins:
        raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
    require_sandbox(cfg)
    check_servers(cfg, ("agent", "user"))
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
            with (
                preflighted(cfg, console, SIMULATED) as (cfg, local_api_base),
                progress_bar(console, "A") as bar_a,
                progress_bar(console, "B") as bar_b,
            ):
                record = compare_arms(
                    cfg,
                    backend,
                    local_api_base,
                    *arms,
                    out,
                    compare_id,
                    tasks=task_ids,
                    num_tasks=args.num_tasks,
                    config=config,
                    on_progress=lambda arm, *p: (bar_a if arm == "a" else bar_b)(*p),
                    on_look=lambda look: console.print(f"look {look['look'] + 1}: {look['reason']}", highlight=False),
                )
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
    from evolver.cli.console import progress_bar
    from evolver.cli.preflight import SIMULATED, check_servers, preflighted
    from evolver.cli.run_tables import transfer_table
    from evolver.evaluation.backends import make_backend
    from evolver.evaluation.sandbox import require_sandbox
    from evolver.store.lineage import Lineage
    from evolver.store.rundir import find_run

    repo = Path(args.repo).resolve()
    run = find_run(repo, args.run)
    manifest = run.manifest()
    cfg = Config(**manifest.config)  # the run's own settings, with what is given here on top
    given = {k: v for k, v in _overrides(args).items() if v is not None}
    cfg = dataclasses.replace(cfg, **{key: checked(key, value, "--" + key.replace("_", "-")) for key, value in given.items()})
    if cfg.domain not in DOMAINS and not cfg.plugins:
        raise UsageError(f"unknown domain '{cfg.domain}'; choose one of: {', '.join(DOMAINS)}")
    require_sandbox(cfg)
    check_servers(cfg, ("agent", "user"))
    tasks = None if {"domain", "split"} & given.keys() else list(manifest.gate_tasks)
    transfer_id = new_run_id("transfer")
    console = Console(stderr=True, soft_wrap=True)
    lineage = Lineage(repo, run.run_id)
    try:
        with make_backend(cfg.backend, cfg.ray_address, cfg.rate_limits) as backend:
            backend.list_tasks(listing_request(cfg, repo, run.transfer(transfer_id).listing().path, task_ids=tasks))
            with (
                preflighted(cfg, console, SIMULATED) as (cfg, local_api_base),
                progress_bar(console, "A") as bar_a,
                progress_bar(console, "B") as bar_b,
            ):
                record = transfer(
                    run,
                    cfg,
                    backend,
                    local_api_base,
                    each=args.each,
                    tasks=tasks,
                    transfer_id=transfer_id,
                    lineage=lineage,
                    on_progress=lambda arm, *p: (bar_a if arm == "a" else bar_b)(*p),
                    on_look=lambda look: console.print(f"look {look['look'] + 1}: {look['reason']}", highlight=False),
                )
    except UsageError:
        run.transfer(transfer_id).discard()
        raise
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        out_console().print(transfer_table(transfer_rows([record])))
    return 0
