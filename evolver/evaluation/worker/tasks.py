"""The tasks a worker evaluates, from tau2's registry, and the domain's identifiers the static scan looks for."""

from __future__ import annotations

import importlib

from evolver.data import EvalRequest
from evolver.evaluation.worker.stop import EXIT_USAGE, Stop


def available_splits(domain: str) -> dict[str, list[str]]:
    """A domain's task splits; tau2 registers no split loader for mock, whose module has one."""
    from tau2.run import load_task_splits

    splits = load_task_splits(domain)
    if splits is None:
        try:
            splits = importlib.import_module(f"tau2.domains.{domain}.environment").get_tasks_split()
        except (ImportError, AttributeError, OSError):
            splits = {}
    return splits


def resolve_tasks(req: EvalRequest) -> list:
    """Load the requested tasks through tau2's registry; bad names become one-line errors."""
    from tau2.registry import registry
    from tau2.run import load_tasks

    if req.domain not in registry.get_domains():
        raise Stop("usage_error", f"unknown domain '{req.domain}'; choose one of: {', '.join(sorted(registry.get_domains()))}", EXIT_USAGE)
    if req.split:
        splits = available_splits(req.domain)
        if req.split not in splits:
            names = ", ".join(sorted(splits)) or "none (omit --split)"
            raise Stop("usage_error", f"domain '{req.domain}' has no split '{req.split}'; its splits: {names}", EXIT_USAGE)
    tasks = load_tasks(req.domain, req.split or None)
    if req.task_ids:
        by_id = {t.id: t for t in tasks}
        unknown = [t for t in req.task_ids if t not in by_id]
        if unknown:
            where = f"{req.domain}/{req.split}" if req.split else req.domain
            raise Stop(
                "usage_error",
                f"unknown task id(s) in {where}: {', '.join(unknown)}; list them with `evolver tasks {req.domain}`",
                EXIT_USAGE,
            )
        tasks = [by_id[t] for t in req.task_ids]
    if req.num_tasks:
        tasks = tasks[: req.num_tasks]
    if not tasks:
        raise Stop("usage_error", "no tasks selected; check --split, --task-ids and --num-tasks", EXIT_USAGE)
    return tasks


def domain_identifiers(domain: str) -> list[str]:
    """Record identifiers of the domain's task data (task ids, user, order, reservation numbers)
    for the static scan: a candidate that copies one into its code is refused. They stay on the
    trusted side: the run directory, which no agent process can read."""
    from tau2.registry import registry
    from tau2.run import load_tasks

    from evolver.evaluation.scan.taskdata import task_data_identifiers

    env = registry.get_env_constructor(domain)()
    db = getattr(getattr(env, "tools", None), "db", None)
    tasks = [t.model_dump(mode="json") for t in load_tasks(domain)]
    return sorted(task_data_identifiers(tasks, db.model_dump(mode="json") if db is not None else None, [t.name for t in env.get_tools()]))
