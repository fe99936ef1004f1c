"""The commands that read a recorded run, `history`, `show`, `report`, `status` and `runs`,
and `rollback`, which steers its best branch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evolver.cli.commands.shared import out_console
from evolver.errors import UsageError


def cmd_history(args: argparse.Namespace) -> int:
    from evolver.cli.compare import transfer_rows
    from evolver.cli.history import history_rows, policy_lines
    from evolver.cli.run_tables import history_table, transfer_table
    from evolver.store.rundir import find_run

    run = find_run(Path(args.repo).resolve(), args.run)
    rows = history_rows(run)
    transfers = transfer_rows(run.transfers())
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": run.run_id,
                    "candidates": rows,
                    "transfers": transfers,
                    "policy": policy_lines(run.manifest(), run.state()),
                    "audits": [a.model_dump(mode="json") for a in run.state().audits],
                },
                indent=2,
            )
        )
    else:
        out_console().print(history_table(run.run_id, rows))
        if transfers:
            out_console().print(transfer_table(transfers))
        for line in policy_lines(run.manifest(), run.state()):
            out_console().print(line, highlight=False)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from evolver.cli.history import show
    from evolver.cli.run_tables import show_candidate
    from evolver.store.rundir import find_run

    if args.turns is not None:
        from evolver.cli.turns import show_turns

        return show_turns(find_run(Path(args.repo).resolve(), args.run), args.iteration, args.turns, args.trial, args.json, out_console())
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
    from evolver.store.rundir import find_run

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
    from evolver.store.rundir import find_run
    from evolver.store.runstate import named

    run = find_run(Path(args.repo).resolve(), args.run)
    change = rollback(run, args.to, args.reason)
    target = named(change.label)
    print(f"evolver/{run.run_id}/best now points at {target} ({change.commit[:10]}); recorded in {run.log_file}")
    for audit in (a for a in run.state().audits if a.best_commit == change.commit):  # what the run's audit made of it
        print(f"note: the run's audit of {named(change.label)} {'held' if audit.holds else 'rolled it back'}: {audit.reason}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from evolver.cli.history import status
    from evolver.cli.run_tables import status_table
    from evolver.store.rundir import find_run

    info = status(find_run(Path(args.repo).resolve(), args.run))
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        out_console().print(status_table(info))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from evolver.cli.history import runs
    from evolver.cli.run_tables import runs_table
    from evolver.store.rundir import runs_dir

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
