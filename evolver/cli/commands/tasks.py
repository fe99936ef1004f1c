"""`evolver tasks`: a domain's task ids, or (--triage) the tasks of a run that are only noise."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evolver.config import DOMAINS
from evolver.errors import UsageError


def cmd_tasks(args: argparse.Namespace) -> int:
    if args.triage:
        return _triage(args)
    if not args.domain:
        raise UsageError(f"name a domain ({', '.join(DOMAINS)}), or --triage RUN")
    from evolver.llm import prepare_environment

    prepare_environment()
    from tau2.run import load_tasks

    from evolver.evaluation.worker.tasks import available_splits

    splits = available_splits(args.domain)
    if args.split and args.split not in splits:
        raise UsageError(f"domain '{args.domain}' has no split '{args.split}'; its splits: {', '.join(sorted(splits)) or 'none'}")
    for task in load_tasks(args.domain, args.split):
        print(task.id)
    return 0


def _triage(args: argparse.Namespace) -> int:
    import dataclasses

    from evolver.evolution.triage import triage
    from evolver.store.rundir import measured

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
