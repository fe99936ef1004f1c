"""Which tasks are only noise? From everything a run or a comparison has measured, flag the tasks that
cost simulations and cannot show a harness's effect:

- never passed: no agent ever solved it, in any evaluation (tau2 has tasks no agent can pass);
- the customer's doing: most of its failures come from the user simulator or the judge, not the agent
  (their errors, a customer who ends the conversation before the agent could act, the NL-assertion
  judge not answering), as tau2-bench #392 found for up to 30% of failed retail trajectories;
- never varies: every simulation of every agent scored the same, so no change can move it.

Flags are advice: `exclude_tasks` drops named tasks from a run's analysis, gate and holdout sets.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from evolver.data import SimRecord

MIN_SIMULATIONS = 3  # fewer than this says nothing about a task
EARLY_END = 4  # a customer who stops within this many messages stopped before the agent could act
NEVER_PASSED, CUSTOMER, NO_VARIATION = "never passed", "the customer's doing", "never varies"


@dataclass
class TaskTriage:
    task: str
    simulations: int = 0
    passed: int = 0
    flags: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)  # one short line per flag

    @property
    def pass_rate(self) -> float:
        return self.passed / self.simulations if self.simulations else 0.0


def customer_cause(record: SimRecord) -> str | None:
    """Why a failed simulation is the user simulator's or the judge's doing, if it is."""
    if record.outcome == "infra_error" and record.error_role in ("user", "judge"):
        return f"the {record.error_role}'s provider failed"
    reason = record.termination_reason or ""
    if reason == "user_error" or (reason.startswith("user_") and reason != "user_stop"):
        return f"the customer's side ended it ({reason})"
    if reason == "user_stop" and record.steps <= EARLY_END and (record.reward or 0.0) < 1.0:
        return f"the customer stopped after {record.steps} messages"
    nl = record.reward_breakdown.get("nl_assertions")
    if isinstance(nl, list) and any(not isinstance(check, dict) or check.get("met") is None for check in nl):
        return "the judge gave no answer"
    return None


def triage(evaluations: dict[str, list[SimRecord]]) -> list[TaskTriage]:
    """Every task seen in the evaluations (name -> its records), its counts and flags, flagged tasks first."""
    tasks: dict[str, TaskTriage] = {}
    rewards: dict[str, set] = defaultdict(set)
    causes: dict[str, list[str]] = defaultdict(list)
    failures: dict[str, int] = defaultdict(int)
    for records in evaluations.values():
        for r in records:
            t = tasks.setdefault(r.task_id, TaskTriage(r.task_id))
            cause = customer_cause(r)
            if cause:
                causes[r.task_id].append(cause)
            if r.outcome == "infra_error":
                continue
            t.simulations += 1
            reward = r.reward or 0.0
            t.passed += reward >= 1 - 1e-6
            rewards[r.task_id].add(round(reward, 6))
            failures[r.task_id] += reward < 1 - 1e-6
    for task, t in tasks.items():
        if t.simulations < MIN_SIMULATIONS:
            continue
        if t.passed == 0:
            t.flags.append(NEVER_PASSED)
            t.why.append(f"0 of {t.simulations} simulations passed")
        mine = causes.get(task, [])
        if mine and len(mine) * 2 >= max(1, failures[task]):
            t.flags.append(CUSTOMER)
            t.why.append(f"{len(mine)} of {max(failures[task], len(mine))} failures: {max(set(mine), key=mine.count)}")
        if len(rewards[task]) == 1 and NEVER_PASSED not in t.flags:  # one that never passed says so already
            t.flags.append(NO_VARIATION)
            t.why.append(f"all {t.simulations} simulations scored {next(iter(rewards[task])):g}")
    return sorted(tasks.values(), key=lambda t: (not t.flags, t.task))
