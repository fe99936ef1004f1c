"""Is B better than A, worse, or is there no evidence either way? The staged, paired test behind
`evolver compare` and `evolver transfer` (docs/gate.md, "Comparing two agents").

Both arms run the same tasks beside each other in the same windows, the stages' trials per task
each. At every look the permutation engine (permutation.py) relabels trials within each task and
window, so a drift between windows moves both arms alike and cannot pass for an effect. A look may
decide early when the answer is clear either way: it spends a share of alpha by an O'Brien-Fleming
schedule (tiny at the first looks, most at the last) and a Bonferroni bound over the looks keeps the
whole procedure's error at alpha; it stops with "no evidence" when the difference is too small for
the remaining looks (a futility stop only ever lowers the error). Two-sided by default (a no-op is
called better or worse at most alpha of the time); ``sided="better"`` asks only whether B is better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, fmean
from typing import Literal

from evolver.evolution.gate.permutation import RewardTable, concurrent_blocks, p_text, staged_p_value, t_quantile, z_score
from evolver.evolution.gate.policy import paired

CompareDecision = Literal["better", "worse", "no evidence", "continue"]


@dataclass(frozen=True)
class CompareConfig:
    alpha: float = 0.05  # the probability of calling a no-op better or worse (of calling it better, one-sided)
    sided: Literal["two", "better"] = "two"
    stages: tuple[int, ...] = (1, 2, 3, 4, 6)  # cumulative trials per task of each arm at each look
    # |z| (z, one-sided) below which a non-final look stops with "no evidence"; none at the first looks
    futility: tuple[float, ...] = (0.0, 0.5, 0.75, 1.0)
    permutations: int = 5000

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError("alpha must be in (0, 0.5)")
        if not self.stages or any(b <= a for a, b in zip(self.stages, self.stages[1:])) or self.stages[0] < 1:
            raise ValueError("stages must be an increasing tuple of trial counts, from 1")
        if len(self.futility) != len(self.stages) - 1:
            raise ValueError("futility needs one boundary per non-final look")
        if self.sided not in ("two", "better"):
            raise ValueError("sided is two or better")


@dataclass(frozen=True)
class Comparison:
    decision: CompareDecision
    reason: str  # one readable sentence
    effect: float  # mean per-task delta, B - A, reward units
    ci: tuple[float, float] | None  # two-sided (1 - alpha) t interval of the effect; None with fewer than 2 tasks
    p_value: float | None  # the deciding look's p-value (two-sided: twice the smaller one-sided one); None while it continues
    alpha_spent: float  # the share of alpha this look may reject at
    look: int
    final: bool
    n_tasks: int
    n_a_sims: int
    n_b_sims: int


def spending(config: CompareConfig) -> tuple[float, ...]:
    """The alpha each look may reject at: increments of an O'Brien-Fleming-shaped spending function of the
    information fraction (trials so far over the last look's); they add up to alpha."""
    sides = 2 if config.sided == "two" else 1
    z = NormalDist().inv_cdf(1 - config.alpha / sides)
    last = config.stages[-1]
    spent = [sides * (1 - NormalDist().cdf(z / math.sqrt(n / last))) for n in config.stages]
    return tuple(b - a for a, b in zip((0.0, *spent), spent))


def decide_compare(a: RewardTable, b: RewardTable, config: CompareConfig, *, look: int) -> Comparison:
    """Judge one look: A's and B's tables hold each task's trials of every window so far, in window order
    (config.stages[look] per task on each side, infrastructure errors as None). Pure and replayable."""
    if not 0 <= look < len(config.stages):
        raise ValueError(f"look {look} outside the {len(config.stages)} looks")
    final = look == len(config.stages) - 1
    stages = config.stages[: look + 1]
    pairs = paired(a, b)  # task -> (B's trials, A's): A in the incumbent's place
    deltas = [fmean(vb) - fmean(va) for vb, va in pairs.values()]
    n = len(deltas)
    effect = fmean(deltas) if deltas else 0.0
    stderr = math.sqrt(sum((d - effect) ** 2 for d in deltas) / (n - 1) / n) if n >= 2 else None
    half = None if stderr is None else t_quantile(1 - config.alpha / 2, n - 1) * stderr
    ci = None if half is None else (effect - half, effect + half)
    alpha = spending(config)[look]
    sims = {side: sum(len(r) for r in table.values()) for side, table in (("a", a), ("b", b))}

    def result(decision: CompareDecision, reason: str, p: float | None) -> Comparison:
        return Comparison(decision=decision, reason=reason, effect=effect, ci=ci, p_value=p, alpha_spent=alpha, look=look,
                          final=final, n_tasks=n, n_a_sims=sims["a"], n_b_sims=sims["b"])

    summary = f"{100 * effect:+.1f} points over {n} tasks"
    if n < 2:
        return result("no evidence", f"No evidence: only {n} task(s) with valid trials on both sides.", None)
    no_early_stop = (-math.inf,) * look  # each look's test is on its own data; the spending bounds the whole
    # Before the last look only "p <= alpha?" matters and drawing stops once it cannot be; the last look's p is drawn in full.
    level = 1.0 if final else alpha / (2 if config.sided == "two" else 1)
    up, _ = staged_p_value(concurrent_blocks(a, b, stages), no_early_stop, config.permutations, level)
    down = None
    if config.sided == "two":
        down, _ = staged_p_value(concurrent_blocks(b, a, stages), no_early_stop, config.permutations, level)
    p = min(1.0, 2 * min(up, down)) if down is not None else up
    if p <= alpha:
        decision: CompareDecision = "better" if down is None or up <= down else "worse"
        return result(decision, f"{decision.capitalize()}: {summary}, {p_text(p)} at look {look + 1} (alpha spent {alpha:.3g}).", p)
    if final:
        return result("no evidence", f"No evidence either way: {summary}, {p_text(p)}.", p)
    z = z_score(effect, stderr)
    magnitude = abs(z) if config.sided == "two" else z
    if magnitude is not None and magnitude < config.futility[look]:
        return result("no evidence", f"No evidence: {summary} (z={z:.2f}) after {config.stages[look]} trial(s) per task cannot plausibly "
                                     "become a difference.", None)
    return result("continue", f"Continue: {summary} after {config.stages[look]} trial(s) per task.", None)


def flips(a: RewardTable, b: RewardTable) -> list[tuple[str, float, float]]:
    """(task, A's pass rate, B's) for each task whose rates differ, largest change first."""
    out = [(task, fmean(va), fmean(vb)) for task, (vb, va) in paired(a, b).items() if abs(fmean(va) - fmean(vb)) > 1e-9]
    return sorted(out, key=lambda f: (-abs(f[2] - f[1]), f[0]))
