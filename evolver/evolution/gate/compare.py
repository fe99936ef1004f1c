"""Is B better than A, worse, or is there no evidence either way? The group-sequential paired test behind
`evolver compare` and `evolver transfer` (docs/gate.md, "Comparing two agents").

Both arms run the same tasks beside each other, one more trial per task each at every look, up to
``max_trials``. Each look's trials of a task form a block whose results only relabelling within it can
change, so a drift between windows moves both arms alike and cannot pass for an effect; the exact
boundaries over those blocks are sequential.py's. A look calls B better or worse once the error it may
spend allows; it stops with "no evidence" once a difference of ``effect`` would most likely have shown.
How much a look may spend follows the information seen (fewer trials when the tasks vary little), in the
shape of the design that needs the fewest trials at ``effect`` for the power asked
(benchmarks/gate_power.py --compare has its error rates and cost). Two-sided by default (a no-op is
called better or worse at most alpha of the time); ``sided="better"`` asks only whether B is better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, fmean
from typing import Iterator, Literal

from evolver.evolution.gate.permutation import RewardTable, p_text, t_quantile
from evolver.evolution.gate.sequential import Look, Spending, Window, plan, windows
from evolver.evolution.gate.set_gate import paired

CompareDecision = Literal["better", "worse", "no evidence", "continue"]

# The spending shape, fitted (normal theory, looks every 0.1-0.23 of a fixed-size test's information) to the
# Bayes-optimal two-sided design, the one with the fewest expected trials at the effect for the error and
# power asked: within 1% of its expected trials there. Tau is the information over a fixed-size test's.
MOST = 2.0  # everything is spent by twice a fixed-size test's information
ALPHA_SHAPE = (0.56, 2.8)  # half of alpha spent by tau 0.56
BETA_SHAPE = (0.27, 1.9)  # half of beta by tau 0.27: no-ops stop early


@dataclass(frozen=True)
class CompareConfig:
    alpha: float = 0.05  # the probability of calling a no-op better or worse (of calling it better, one-sided)
    sided: Literal["two", "better"] = "two"
    effect: float = 0.10  # the mean pass-rate difference the comparison is sized for
    power: float = 0.8  # the probability of calling a difference of `effect` (either way, two-sided) with the tasks given
    max_trials: int = 20  # trials per task of each arm at the last look
    settle: int = 3  # a task whose trials all agree after this many on each side runs no more (0: every task runs every look)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError("alpha must be in (0, 0.5)")
        if self.sided not in ("two", "better"):
            raise ValueError("sided is two or better")
        if not 0 < self.effect <= 1 or not 0.5 <= self.power < 1:
            raise ValueError("effect must be in (0, 1] and power in [0.5, 1)")
        if self.max_trials < 1 or self.settle < 0:
            raise ValueError("max_trials must be 1 or more and settle 0 or more")

    @property
    def stages(self) -> tuple[int, ...]:
        """Cumulative trials per task of each arm at each look."""
        return tuple(range(1, self.max_trials + 1))

    def spending(self) -> Spending:
        sides = 2 if self.sided == "two" else 1
        z = NormalDist().inv_cdf(1 - self.alpha / sides) + NormalDist().inv_cdf(self.power)
        return Spending(
            alpha=self.alpha,
            sides=sides,
            effect=self.effect,
            fixed_information=(z / self.effect) ** 2,
            most=MOST,
            alpha_shape=ALPHA_SHAPE,
            beta=1 - self.power,
            beta_shape=BETA_SHAPE,
        )


@dataclass(frozen=True)
class Comparison:
    decision: CompareDecision
    reason: str  # one readable sentence
    effect: float  # mean per-task delta, B - A, reward units
    ci: tuple[float, float] | None  # two-sided (1 - alpha) t interval of the effect; None with fewer than 2 tasks
    p_value: float | None  # stage-wise p of the deciding look (two-sided: twice the smaller one-sided one); None while it continues
    alpha_spent: float  # the share of alpha this look may reject at
    information: float  # the information so far over a fixed-size test's with the power asked
    look: int
    final: bool
    n_tasks: int
    n_a_sims: int
    n_b_sims: int


def decide_compare(a: RewardTable, b: RewardTable, config: CompareConfig, *, look: int) -> Comparison:
    """Judge one look: A's and B's tables hold each task's trials of every window so far, in window order
    (config.stages[look] per task on each side, infrastructure errors as None), and every earlier look
    continued. Pure and replayable: the earlier looks' boundaries are recomputed from their own windows."""
    if not 0 <= look < config.max_trials:
        raise ValueError(f"look {look} outside the {config.max_trials} looks")
    verdict = run_compare(a, b, config, looks=look + 1)
    if verdict.look != look:
        raise ValueError(f"the comparison decided at look {verdict.look} already")
    return verdict


def run_compare(a: RewardTable, b: RewardTable, config: CompareConfig, *, looks: int | None = None) -> Comparison:
    """The first of the tables' looks (or of their first ``looks``) that decides, else the last one. Trials
    the tables hold beyond what the comparison ran (after it decided, or of a settled task) are not read."""
    held = max((len(rows) for table in (a, b) for rows in table.values()), default=0)
    stages = config.stages[: max(1, min(looks or config.max_trials, held))]
    built: list[Window] = []

    def build() -> Iterator[Window]:
        for win in windows(a, b, stages, config.settle):
            built.append(win)
            yield win

    seen = plan(build(), config.spending(), last=config.max_trials - 1)
    index = len(seen) - 1
    ran = {task: stages[j] for j, win in enumerate(built[: index + 1]) for task in win.settled}
    a, b = ({task: rows[: ran.get(task, stages[index])] for task, rows in table.items()} for table in (a, b))
    return _comparison(a, b, config, seen[-1], index)


def next_tasks(a: RewardTable, b: RewardTable, config: CompareConfig, look: int) -> list[str]:
    """The tasks that run a trial at ``look``: all but those the earlier looks settled."""
    settled = {task for win in windows(a, b, config.stages[:look], config.settle) for task in win.settled}
    return sorted((a.keys() & b.keys()) - settled)


def _comparison(a: RewardTable, b: RewardTable, config: CompareConfig, look: Look, index: int) -> Comparison:
    """The verdict in words and numbers; ``a`` and ``b`` hold what the comparison ran up to this look."""
    trials = config.stages[index]
    pairs = paired(a, b)  # task -> (B's trials, A's): A in the incumbent's place
    deltas = [fmean(vb) - fmean(va) for vb, va in pairs.values()]
    n = len(deltas)
    effect = fmean(deltas) if deltas else 0.0
    half = t_quantile(1 - config.alpha / 2, n - 1) * math.sqrt(sum((d - effect) ** 2 for d in deltas) / (n - 1) / n) if n >= 2 else None
    decision: CompareDecision = look.decision() if n else "no evidence"
    p = None
    if decision != "continue":
        p = min(1.0, 2 * min(look.p_better, look.p_worse)) if config.sided == "two" else min(1.0, look.p_better)
    summary = f"{100 * effect:+.1f} points over {n} tasks"
    if not n:
        reason = "No evidence: no task has valid trials on both sides."
    elif decision in ("better", "worse"):
        reason = f"{decision.capitalize()}: {summary}, {p_text(p)} at look {index + 1} (alpha spent {look.alpha_spent:.3g})."
    elif decision == "continue":
        reason = f"Continue: {summary} after {trials} trial(s) per task ({look.tau:.2f} of a fixed-size test's information)."
    elif look.final:
        reason = f"No evidence either way: {summary}, {p_text(p)}."
    else:
        reason = (
            f"No evidence: {summary} after {trials} trial(s) per task, {p_text(p)}: a difference of {100 * config.effect:g} "
            f"points would most likely have shown by now."
        )
    return Comparison(
        decision=decision,
        reason=reason,
        effect=effect,
        ci=None if half is None else (effect - half, effect + half),
        p_value=p,
        alpha_spent=look.alpha_spent,
        information=look.tau,
        look=index,
        final=look.final,
        n_tasks=n,
        n_a_sims=sum(map(len, a.values())),
        n_b_sims=sum(map(len, b.values())),
    )


def flips(a: RewardTable, b: RewardTable) -> list[tuple[str, float, float]]:
    """(task, A's pass rate, B's) for each task whose rates differ, largest change first."""
    out = [(task, fmean(va), fmean(vb)) for task, (vb, va) in paired(a, b).items() if abs(fmean(va) - fmean(vb)) > 1e-9]
    return sorted(out, key=lambda f: (-abs(f[2] - f[1]), f[0]))
