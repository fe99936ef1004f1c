"""Exact group-sequential boundaries for a paired two-arm comparison (docs/gate.md, "Comparing two agents").

The statistic is S, the sum of B's rewards over every (task, window) block: the trials both arms ran
of one task in one look's window. Given each block's pooled results, relabelling A's and B's trials
within the block is all "no effect" allows, so S's null distribution is a convolution of one small
exact distribution per block (hypergeometric for 0/1 rewards). It lives on a lattice of integers, and
the recursion over looks (Armitage, McPherson and Rowe) is a few numpy convolutions: exact, no normal
approximation, any pass rates, a drift between windows (both arms move alike inside a block) and
missing trials (left out of their block) included.

Boundaries come from error spending on the information seen (Lan and DeMets): by a look whose
information is a share ``tau`` of a fixed-size test's, a side may have rejected at most
``alpha_side * spent(tau)`` of the time under no effect, counted exactly over the lattice, so the
error bound holds by construction whatever the information turns out to be. Futility ("no
evidence") spends beta the same way, under a normal model of B being ``effect`` better; it only ever
lowers the error, and its boundaries are counted in the null recursion (binding). The spending shape
is fitted to the Bayes-optimal design (the one that needs the fewest expected trials at the effect).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

# The variance per unit weight is estimated from the blocks' pooled results plus this much weight at the largest
# variance a reward can have (1/4): enough that a look where nothing varied is not infinite information, little
# enough that 6 tasks that never vary end the comparison after 2 trials each (40 after one).
PRIOR_WEIGHT = 0.05
PRIOR_VARIANCE = 0.25


@dataclass(frozen=True)
class Window:
    """One look's new trials, on the lattice of B's summed rewards times ``scale``."""

    scale: int  # 1 for 0/1 rewards; otherwise rewards are rounded to multiples of 1/scale
    low: int  # the least sum the blocks' pooled results allow: null[i] is P0(sum = low + i)
    null: np.ndarray
    observed: int  # B's sum
    top: int  # the largest sum B's valid trials could have
    expected: float  # E0 of the sum
    weight: float  # sum over blocks of n_a n_b / (n_a + n_b): how far a pass-rate shift of 1 moves the sum (over scale)
    variance: float  # its variance under no effect given the pooled results, in reward units squared
    settled: tuple[str, ...]  # tasks that run no more trials after it
    open: int  # tasks that still run trials after it


@dataclass(frozen=True)
class Spending:
    """The design: the share of an error spent by information ``tau`` (the information so far over a
    fixed-size test's that has the power at ``effect``) is log-logistic in tau, and all of it at ``most``."""

    alpha: float
    sides: int  # 2: better or worse; 1: better only
    effect: float
    fixed_information: float  # 1 / variance of the effect estimate that a fixed-size test needs
    most: float
    alpha_shape: tuple[float, float]  # (tau at which half is spent, steepness)
    beta: float
    beta_shape: tuple[float, float]

    def spent(self, tau: float, shape: tuple[float, float]) -> float:
        if tau >= self.most - 1e-12:
            return 1.0
        half, steep = shape
        return tau**steep / (tau**steep + half**steep)


@dataclass(frozen=True)
class Look:
    """One look's boundaries on the lattice of S (S >= upper: better; S <= lower: worse; futile[0] <= S <=
    futile[1]: no evidence) and its one-sided p-values in the stage-wise ordering (a rejection at an
    earlier look is more extreme than any result of a later one)."""

    upper: float  # math.inf: this look cannot call B better
    lower: float  # -math.inf: this look cannot call B worse
    futile: tuple[float, float]  # empty when futile[0] > futile[1]
    final: bool
    tau: float
    alpha_spent: float  # the error this look may add
    error: float  # P0(called better or worse at this look or an earlier one), exact: at the last look, the design's error
    p_better: float  # P0(called better at an earlier look, or S here at least as large)
    p_worse: float
    observed: int

    def decision(self) -> str:
        if self.observed >= self.upper:
            return "better"
        if self.observed <= self.lower:
            return "worse"
        if self.final or self.futile[0] <= self.observed <= self.futile[1]:
            return "no evidence"
        return "continue"


def windows(
    a: Mapping[str, Sequence[float | None]], b: Mapping[str, Sequence[float | None]], stages: Sequence[int], settle: int = 0
) -> Iterator[Window]:
    """One window per stage, built when asked for: each task's trials from the previous stage's count to
    this one's, the valid ones, for the tasks with some on both sides. With ``settle``, a task whose valid
    trials all agree after ``settle`` or more on each side runs no more (its later trials, if the tables
    hold any, are not read): which tasks run depends on pooled results only, never on which arm had them."""
    binary = all(r in (0.0, 1.0) for table in (a, b) for rows in table.values() for r in rows if r is not None)
    scale = 1 if binary else 12
    active = sorted(a.keys() & b.keys())
    for low, high in zip((0, *stages), stages):
        blocks = []
        for task in active:
            va = [round(scale * r) for r in a[task][low:high] if r is not None]
            vb = [round(scale * r) for r in b[task][low:high] if r is not None]
            if va and vb:
                blocks.append((va, vb))
        settled = tuple(task for task in active if settle and settled_task(a[task][:high], b[task][:high], settle))
        active = [task for task in active if task not in settled]
        yield _window(blocks, scale, settled, len(active))


def settled_task(a: Sequence[float | None], b: Sequence[float | None], settle: int) -> bool:
    """At least ``settle`` valid trials on each side, and every one of them the same reward."""
    va, vb = [r for r in a if r is not None], [r for r in b if r is not None]
    return len(va) >= settle and len(vb) >= settle and len(set(va + vb)) == 1


def _window(blocks: list[tuple[list[int], list[int]]], scale: int, settled: tuple[str, ...], still: int) -> Window:
    low, null, observed, top = 0, np.ones(1), 0, 0
    expected = weight = variance = 0.0
    for va, vb in blocks:
        pooled, k = va + vb, len(vb)
        n = len(pooled)
        least, pmf = _draws(tuple(sorted(pooled)), k)
        low, null = low + least, np.convolve(null, pmf)
        observed, top = observed + sum(vb), top + scale * k
        mean = sum(pooled) / n
        expected += k * mean
        weight += len(va) * k / n
        spread = sum((v - mean) ** 2 for v in pooled) / (n - 1)  # n >= 2: both sides have a trial
        variance += len(va) * k / n * spread / scale**2  # of the sum of k of the n values drawn at random
    return Window(scale, low, null, observed, top, expected, weight, variance, settled, still)


@lru_cache(maxsize=4096)
def _draws(values: tuple[int, ...], k: int) -> tuple[int, np.ndarray]:
    """(least sum, P(sum = least + i)) of k of the (sorted) values drawn without replacement, each k-subset
    equally likely. Cached: a look's blocks come in a few shapes (read-only arrays)."""
    least, most = sum(values[:k]), sum(values[-k:])
    ways = np.zeros((k + 1, most + 1))
    ways[0, 0] = 1.0
    for v in values:  # the right side is read before the add, so each value is drawn at most once
        ways[1:, v:] += ways[:-1, : most + 1 - v]
    pmf = ways[k, least:] / ways[k, least:].sum()
    pmf.flags.writeable = False
    return least, pmf


def plan(wins: Iterable[Window], spending: Spending, last: int, *, stop: bool = True) -> list[Look]:
    """The looks over ``wins`` in order, up to the first that decides (later windows are not read; with
    ``stop`` False, up to the last look whatever the results, for the design's exact error). Look j uses
    windows 0..j only, so the plan of a prefix is a prefix of the plan (replayable look by look).
    ``last``: the index of the last look the schedule allows; what is left of alpha is spent there."""
    null = np.ones(1)  # P0(no stop at an earlier look, S = i), before this look's boundaries
    rejected = [0.0, 0.0]  # P0(called better / worse at an earlier look)
    looks: list[Look] = []
    seen: list[Window] = []
    for j, win in enumerate(wins):
        null = np.convolve(null, np.concatenate((np.zeros(win.low), win.null)))
        seen.append(win)
        variance = _variance(seen)
        tau = max(sum(w.weight for w in seen) / variance / spending.fixed_information, spending.most * (j + 1) / (last + 1))
        final = tau >= spending.most - 1e-12 or j >= last or not win.open  # nothing left to learn once every task settled
        side = spending.alpha / spending.sides * spending.spent(tau, spending.alpha_shape)
        upper = _upper(null, side - rejected[0])
        lower = _lower(null, side - rejected[1]) if spending.sides == 2 else -math.inf
        futile = (lower + 1, upper - 1) if final else _futile(seen, looks, spending, tau, variance, upper, lower)
        final = final or (futile[0] <= lower + 1 and futile[1] >= upper - 1)  # the boundaries meet: every result decides
        s = sum(w.observed for w in seen)
        p_better, p_worse = rejected[0] + float(null[s:].sum()), rejected[1] + float(null[: s + 1].sum())
        budget = spending.sides * side - sum(rejected)
        rejected[0] += _mass(null, upper, math.inf)
        rejected[1] += _mass(null, -math.inf, lower)
        look = Look(upper, lower, futile, final, tau, budget, sum(rejected), p_better, p_worse, s)
        looks.append(look)
        if look.final or (stop and look.decision() != "continue"):
            break
        null = _continuing(null, look)
    return looks


def _variance(seen: Sequence[Window]) -> float:
    """Variance under no effect per unit of weight, pooled over the windows so far (with the prior above)."""
    weight = sum(w.weight for w in seen)
    return (sum(w.variance for w in seen) + PRIOR_VARIANCE * PRIOR_WEIGHT) / (weight + PRIOR_WEIGHT)


def _futile(
    seen: Sequence[Window], looks: list[Look], spending: Spending, tau: float, variance: float, upper: float, lower: float
) -> tuple[float, float]:
    """The no-evidence band of this look: were B ``effect`` better (two-sided: or worse), the chance of having
    stopped with no evidence by now is at most beta x spent(tau), in a normal model of each window's sum
    (its mean with no effect plus effect x weight; variance: the pooled estimate x weight)."""
    budget = spending.beta * spending.spent(tau, spending.beta_shape)
    ends = []
    for sign in (1, -1)[: spending.sides]:
        reached, stopped = np.ones(1), 0.0
        for i, win in enumerate(seen):
            reached = np.convolve(reached, _shifted(win, sign * spending.effect, variance))
            if i < len(looks):
                stopped += _mass(reached, *looks[i].futile)
                reached = _continuing(reached, looks[i])
        left = (budget - stopped) * (1 + 1e-9)
        values = np.arange(len(reached))
        if sign > 0:  # the band's top: at most `left` lies above `lower` and up to it
            below = np.cumsum(np.where(values > lower, reached, 0.0))
            ends.append(float(np.searchsorted(below, left, side="right") - 1))
        else:  # its bottom: at most `left` lies from it to below `upper`
            above = np.cumsum(np.where(values < upper, reached, 0.0)[::-1])
            ends.append(float(len(reached) - np.searchsorted(above, left, side="right")))
    bottom = ends[1] if spending.sides == 2 else -math.inf
    return max(bottom, lower + 1), min(ends[0], upper - 1)


def _shifted(win: Window, effect: float, variance: float) -> np.ndarray:
    """P(B's sum = i), i = 0..top, were B ``effect`` better: normal, rounded to the lattice."""
    mean = win.expected + win.scale * effect * win.weight
    sd = max(win.scale * math.sqrt(variance * win.weight), 0.5)  # at least half a step: rounding keeps the shift
    pmf = np.exp(-0.5 * ((np.arange(win.top + 1) - mean) / sd) ** 2)
    return pmf / pmf.sum()


def _upper(null: np.ndarray, budget: float) -> float:
    """The least S whose upper tail is at most ``budget``; inf when there is none."""
    tail = np.cumsum(null[::-1])[::-1]
    fits = np.flatnonzero(tail <= budget * (1 + 1e-9))
    return float(fits[0]) if budget > 0 and len(fits) else math.inf


def _lower(null: np.ndarray, budget: float) -> float:
    head = np.cumsum(null)
    fits = np.flatnonzero(head <= budget * (1 + 1e-9))
    return float(fits[-1]) if budget > 0 and len(fits) else -math.inf


def _mass(pmf: np.ndarray, low: float, high: float) -> float:
    """P(low <= S <= high); the bounds may be infinite."""
    if low > len(pmf) - 1 or high < 0 or low > high:
        return 0.0
    start = 0 if low <= 0 else math.ceil(low)
    stop = len(pmf) - 1 if high >= len(pmf) - 1 else math.floor(high)
    return float(pmf[start : stop + 1].sum())


def _continuing(pmf: np.ndarray, look: Look) -> np.ndarray:
    values = np.arange(len(pmf))
    stops = (values >= look.upper) | (values <= look.lower) | ((values >= look.futile[0]) & (values <= look.futile[1]))
    return np.where(stops, 0.0, pmf)
