"""The population search's decisions (gate_policy "population", docs/search.md): which member of the pool is a
parent, which analysis tasks a screen runs, whether a child passed its screen, and which member the run ends with.

The pool holds the base and every child that passed its screen, each with its trials of the gate tasks. A parent
is drawn from the pool's per-task Pareto front over the gate tasks (gepa's rule: per task the members at its best
score, the dominated ones removed, one drawn with weight the number of tasks it leads), so a lineage that stalls
does not stall the run. A child is first judged beside its parent on a few analysis tasks (its screen); only a
child that does strictly better there runs the gate tasks and joins the pool. The run ends with the member of the
best mean gate score, which the audit then judges against the base (gate.search.evaluate_audit): that bound on
ending worse than the run began holds whatever the pool did.

Pure and deterministic: the loop (evolver.evolution.loop) and benchmarks/search.py call the same functions, and a
resumed run draws the same parents and minibatches from its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from evolver.evolution.gate.permutation import RewardTable


@dataclass(frozen=True)
class PopulationConfig:
    """What a population run spends on each child before the gate, and on the gate."""

    minibatch: int = 3  # analysis tasks a screen runs, parent and child, one trial each
    draws: int = 3  # minibatches an iteration may draw while its parent passes every task of the last
    gate_trials: int = 1  # trials per gate task a child that passed its screen runs to join the pool
    # The gate tasks run in two parts: a child more than `margin` below its parent on the first part stops there.
    first_part: float = 0.5  # share of the gate tasks in the first part
    margin: float = 0.05
    # Under a budget, the trials per gate task of each arm kept for the audit (benchmarks/search.py: the audits of
    # kept gains end by their second look; one that runs out of budget is undecided and rolls the run back).
    audit_reserve: int = 2

    def __post_init__(self) -> None:
        if self.minibatch < 1 or self.draws < 1 or self.gate_trials < 1 or self.audit_reserve < 1:
            raise ValueError("minibatch, draws, gate_trials and audit_reserve are 1 or more")
        if not 0 < self.first_part <= 1 or not 0 <= self.margin < 1:
            raise ValueError("first_part is in (0, 1] and margin in [0, 1)")

    def parts(self, gate_tasks: Sequence[str]) -> tuple[list[str], list[str]]:
        """The gate tasks of the first part and of the second (empty when the first holds them all)."""
        cut = max(1, round(len(gate_tasks) * self.first_part))
        return list(gate_tasks[:cut]), list(gate_tasks[cut:])


@dataclass(frozen=True)
class ScreenVerdict:
    passed: bool
    parent: float  # the parent's summed reward over the tasks both sides measured
    child: float
    tasks: int  # tasks with a valid result on both sides
    reason: str


def task_means(table: RewardTable) -> dict[str, float]:
    """Per task, the mean of its valid trials; a task with none is left out."""
    out = {}
    for task, rewards in table.items():
        valid = [r for r in rewards if r is not None]
        if valid:
            out[task] = sum(valid) / len(valid)
    return out


def mean_score(table: RewardTable) -> Optional[float]:
    """The mean over tasks of each task's mean: members measured with different trials per task compare alike."""
    means = task_means(table)
    return sum(means.values()) / len(means) if means else None


def front(members: Mapping[str, RewardTable]) -> dict[str, int]:
    """The pool's Pareto front: every member that leads some gate task and is not dominated, with the number of tasks
    it leads. A member is dominated when every task it leads is led by another member still on the front; members
    are looked at from the lowest mean up (one pass does it: dropping a member never makes another dominated), so of
    two that lead the same tasks the better one stays."""
    means = {name: task_means(table) for name, table in members.items()}
    leads: dict[str, list[str]] = {}  # member -> the tasks it leads
    leaders: dict[str, int] = {}  # task -> how many members lead it and are still on the front
    for task in sorted({task for m in means.values() for task in m}):
        scores = {name: m[task] for name, m in means.items() if task in m}
        best = max(scores.values())
        for name, score in scores.items():
            if score == best:
                leads.setdefault(name, []).append(task)
                leaders[task] = leaders.get(task, 0) + 1
    counts = {}
    for name in sorted(leads, key=lambda n: (sum(means[n].values()) / len(means[n]), n)):
        if all(leaders[task] > 1 for task in leads[name]):
            for task in leads[name]:
                leaders[task] -= 1
        else:
            counts[name] = len(leads[name])
    return dict(sorted(counts.items()))


def draw_parent(members: Mapping[str, RewardTable], seed: int) -> str:
    """A parent from the front, drawn with weight the tasks it leads; the same seed draws the same parent."""
    counts = front(members)
    if not counts:
        return sorted(members)[0]
    names = sorted(counts)
    return random.Random(seed).choices(names, weights=[counts[n] for n in names])[0]


def minibatch(tasks: Sequence[str], seed: int, index: int, size: int) -> tuple[str, ...]:
    """The index-th minibatch of ``size`` tasks: the tasks in epochs, each epoch in an order of its own drawn from
    the seed, cut into batches one after another (no task twice in one batch, every task once an epoch)."""
    pool = sorted(tasks)
    size = min(size, len(pool))
    start = index * size
    epoch, offset = divmod(start, len(pool))
    out: list[str] = []
    while len(out) < size:
        order = list(pool)
        random.Random(f"{seed}/{epoch}").shuffle(order)
        take = [t for t in order[offset:] if t not in out][: size - len(out)]
        out += take
        epoch, offset = epoch + 1, 0
    return tuple(out)


def passes_everything(table: RewardTable) -> bool:
    """The parent passed every task of its minibatch that it measured: nothing there to learn from or win back."""
    means = task_means(table)
    return bool(means) and all(v >= 1.0 for v in means.values())


def screen(parent: RewardTable, child: RewardTable) -> ScreenVerdict:
    """The child passes when its summed reward over the minibatch is strictly higher than its parent's, over the
    tasks both measured (an infrastructure error is missing, never 0: its task is left out on both sides)."""
    p, c = task_means(parent), task_means(child)
    both = sorted(set(p) & set(c))
    ps, cs = sum(p[t] for t in both), sum(c[t] for t in both)
    if not both:
        return ScreenVerdict(False, 0.0, 0.0, 0, "Undecided: no task of the screen has a result on both sides.")
    passed = cs > ps
    verb = "Passed the screen" if passed else "Screened out"
    return ScreenVerdict(passed, ps, cs, len(both), f"{verb}: {cs:g} against the parent's {ps:g} over {len(both)} analysis task(s).")


def first_part_holds(parent: RewardTable, child: RewardTable, margin: float) -> ScreenVerdict:
    """After the first part of the gate tasks, the child goes on unless its mean there is more than ``margin`` below
    its parent's on the same tasks (the parent's trials from the pool)."""
    p, c = task_means(parent), task_means(child)
    both = sorted(set(p) & set(c))
    if not both:
        return ScreenVerdict(False, 0.0, 0.0, 0, "Undecided: no gate task of the first part has a result on both sides.")
    pm, cm = sum(p[t] for t in both) / len(both), sum(c[t] for t in both) / len(both)
    holds = cm >= pm - margin
    verb = "goes on" if holds else f"stops: more than {100 * margin:g} points below its parent"
    return ScreenVerdict(holds, pm, cm, len(both), f"First part of the gate {verb} ({cm:.3f} against {pm:.3f} over {len(both)} task(s)).")


def pick(members: Mapping[str, RewardTable]) -> str:
    """The member the run ends with: the best mean gate score, the earliest joined (first in ``members``) on a tie."""
    best, best_score = next(iter(members)), None
    for name, table in members.items():
        score = mean_score(table)
        if score is not None and (best_score is None or score > best_score):
            best, best_score = name, score
    return best
