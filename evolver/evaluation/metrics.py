"""Summaries of simulation records: average reward, pass^k as tau2 defines it, usage.

Infrastructure errors are missing data: they are left out of every score,
never counted as 0.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb

from evolver.data import EvalSummary, InfraTally, RoleUsage, SimRecord, add_tallies


def rewards_by_task(records: list[SimRecord]) -> dict[str, list[float | None]]:
    """task -> reward per trial (None for an infrastructure error), ordered by trial."""
    table: dict[str, dict[int, float | None]] = defaultdict(dict)
    for r in records:
        table[r.task_id][r.trial] = None if r.outcome == "infra_error" else r.reward
    return {task: [trials[t] for t in sorted(trials)] for task, trials in table.items()}


def mean_reward(table: dict | None) -> float | None:
    """The mean reward of a rewards_by_task table over its valid trials; None when it has none."""
    values = [r for rewards in (table or {}).values() for r in rewards if r is not None]
    return sum(values) / len(values) if values else None


def pass_hat_k(table: dict[str, list[float | None]], max_k: int) -> dict[str, float]:
    """tau2's pass^k: per task C(successes, k) / C(trials, k), averaged over tasks.

    A trial succeeds when its reward is 1 (tau2 counts reward >= 1 - 1e-6).
    Tasks with fewer than k valid trials are left out of pass^k.
    """
    out = {}
    for k in range(1, max_k + 1):
        values = []
        for rewards in table.values():
            valid = [r for r in rewards if r is not None]
            if len(valid) < k:
                continue
            successes = sum(1 for r in valid if r >= 1 - 1e-6)
            values.append(comb(successes, k) / comb(len(valid), k))
        if values:
            out[str(k)] = sum(values) / len(values)
    return out


def infra_by_role(records: list[SimRecord]) -> dict[str, InfraTally]:
    """Infrastructure errors by the side that failed, each with its first message, so a person sees
    at once which side to fix ("user: 3, first: ...")."""
    out: dict[str, InfraTally] = {}
    for r in records:
        if r.outcome == "infra_error":
            tally = out.setdefault(r.error_role or "unknown", InfraTally(first=(r.error or "").splitlines()[0] if r.error else ""))
            tally.count += 1
    return out


def summarize(records: list[SimRecord], num_tasks: int, num_trials: int, duration: float) -> EvalSummary:
    scored = [r for r in records if r.outcome != "infra_error"]
    usage: dict[str, RoleUsage] = defaultdict(RoleUsage)
    limits: dict = {}
    for r in records:
        for role, u in r.usage.items():
            usage[role] = usage[role].add(u)
        add_tallies(limits, r.rate_limits)
    return EvalSummary(
        num_tasks=num_tasks,
        num_trials=num_trials,
        num_simulations=len(records),
        scored=len(scored),
        failed=sum(1 for r in records if r.outcome == "failed"),
        infra_errors=len(records) - len(scored),
        infra_by_role=infra_by_role(records),
        avg_reward=(sum(r.reward or 0.0 for r in scored) / len(scored)) if scored else None,
        pass_hat_k=pass_hat_k(rewards_by_task(records), num_trials),
        usage=dict(usage),
        duration=duration,
        rate_limits=limits,
    )
