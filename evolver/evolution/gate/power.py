"""Power and sizing: how many trials the gate needs for the incumbent's noise, and what it can see.

sized() stretches the stages to the noise of the incumbent's reference
results; noise_floor() simulates the gate to find the smallest gain it keeps
80% of the time; pass_rates() and shift_rates() are the noise and effect model
behind both (and benchmarks/gate_power.py). docs/gate.md ("Sized to the
noise", "The noise floor") says what they mean for a run.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from statistics import fmean, variance
from typing import Sequence

from evolver.evolution.gate.set_gate import GateConfig, RewardTable, Stage, evaluate_set, first_trials

_STEADY = 0.001  # closest to 0 or 1 a simulated pass rate gets
# sized(): the expected z, at the final stage, of the effect decide_set's gate should keep 80% of the
# time. Measured (benchmarks/gate_power.py's worlds, 400 decisions each): at 2.9 a +10 candidate was kept
# 83% of the time on uniform pass rates, 85% on coin flips, but 78% with 10% of trials lost to errors;
# at 3.1, 87%, 87% and 83%.
_SIZED_Z = 3.1
MOST_STRETCH = 2.0  # (1, 2, 3, 4, 6) at most to (2, 4, 6, 8, 12): a bound on one iteration's cost


def sized(config: GateConfig, reference: RewardTable, *, effect: float = 0.10) -> GateConfig:
    """``config`` with its stages stretched to the noise of the incumbent's tasks (never shrunk).

    Aims decide_set's gate at keeping a candidate ``effect`` better than the
    incumbent about 80% of the time: the expected z of that effect at the
    final stage, from the incumbent's per-task noise (pass_rates, the effect
    spread as shift_rates does, infrastructure errors at the reference's
    rate), must reach _SIZED_Z. Every stage is stretched by the same factor,
    at most MOST_STRETCH, and keeps its futility boundary: the looks then sit
    at the same shares of the evidence. Sizing uses only results from before
    the iteration, so the gate's false-accept bound holds whatever it picks.
    """
    rates = list(pass_rates(reference).values())
    if not rates:
        raise ValueError("the reference has no valid results")
    trials = [r for rewards in reference.values() for r in rewards]
    valid = sum(r is not None for r in trials) / len(trials)
    moved = shift_rates(rates, effect)
    spread = math.fsum(p * (1 - p) + q * (1 - q) for p, q in zip(rates, moved))
    if spread <= 0:
        return config
    z = effect * len(rates) / math.sqrt(spread / (config.stages[-1] * valid))
    return replace(config, stages=_stretched(config.stages, min(max((_SIZED_Z / z) ** 2, 1.0), MOST_STRETCH)))


def _stretched(stages: tuple[int, ...], factor: float) -> tuple[int, ...]:
    """Each stage times factor, rounded half up, kept strictly increasing."""
    out: list[int] = []
    for n in stages:
        out.append(max(math.floor(n * factor + 0.5), out[-1] + 1 if out else 1))
    return tuple(out)


def noise_floor(
    incumbent: RewardTable,
    config: GateConfig,
    *,
    power: float = 0.8,
    simulations: int = 200,
    seed: int = 0,
) -> float:
    """Smallest mean effect decide_set's gate keeps, for one candidate, with probability ``power``.

    A seeded simulation of the gate itself, futility stops and final test
    included: tasks pass at ``pass_rates(incumbent)``, a candidate with mean
    effect d at ``shift_rates(rates, d)``; both sides are drawn as 0/1 trials,
    the incumbent's results (their valid trial counts) as the reference and
    its trials beside the candidate at the gate's stages (pass
    sized(config, incumbent) to see the floor of a sized gate).
    The effect is found by bisection to half a point, then interpolated; every effect
    tried reuses the same random draws, so acceptance rises smoothly with it.
    min_effect is ignored (the point is to compare it with this floor), and
    the final test draws at most 1,000 relabellings instead of
    ``permutations``: its p-values are then a little coarser, which moves the
    power by well under a point and makes the estimate take seconds, not a
    minute (about 5 s for 40 tasks at the default stages).
    Returns math.inf when no possible effect reaches ``power``.
    """
    config = replace(config, min_effect=0.0, permutations=min(config.permutations, 1000))
    rates = pass_rates(incumbent)
    if not rates:
        raise ValueError("the incumbent has no valid results")
    rng = random.Random(seed)
    worlds = []  # (incumbent table, its concurrent trials, uniform draws for the candidate's trials)
    for _ in range(simulations):
        table = {t: [float(rng.random() < p) for r in incumbent[t] if r is not None] for t, p in rates.items()}
        alongside = {t: [float(rng.random() < p) for _ in range(config.stages[-1])] for t, p in rates.items()}
        worlds.append((table, alongside, {t: [rng.random() for _ in range(config.stages[-1])] for t in rates}))

    def accepts(table: RewardTable, alongside: RewardTable, trials: RewardTable) -> bool:
        def run(stage: Stage) -> tuple[RewardTable, dict[str, RewardTable]]:
            return first_trials(alongside, stage.incumbent_trials), {"c": first_trials(trials, stage.candidate_trials)}

        return evaluate_set(["c"], run, config, reference=table)[-1].kept is not None

    def acceptance(effect: float) -> float:
        shifted = dict(zip(rates, shift_rates(list(rates.values()), effect)))
        accepted = 0
        for table, alongside, draws in worlds:
            accepted += accepts(table, alongside, {t: [float(u < shifted[t]) for u in us] for t, us in draws.items()})
        return accepted / simulations

    low, high = 0.0, 0.999 * (1 - fmean(rates.values()))  # the largest gain possible
    at_low, at_high = acceptance(low), acceptance(high)
    if at_low >= power:
        return 0.0
    if at_high < power:
        return math.inf
    while high - low > 0.005:
        middle = (low + high) / 2
        at_middle = acceptance(middle)
        if at_middle < power:
            low, at_low = middle, at_middle
        else:
            high, at_high = middle, at_middle
    return low + (high - low) * (power - at_low) / (at_high - at_low)


def pass_rates(table: RewardTable) -> dict[str, float]:
    """Per-task pass probabilities for simulating a task with 0/1 trials.

    A 0/1 trial at rate p has variance p(1-p); p is set, on the side of the
    task's mean reward, so that this equals the unbiased estimate of the
    variance of its rewards. The total noise is then estimated without bias:
    a task seen at n/n adds none (plain means would call it certain, but
    shrinking such rates towards 1/2 gives every steady task phantom noise).
    A task with one valid trial has no variance estimate: (reward + 0.5) / 2.
    """
    rates = {}
    for task in sorted(table):
        valid = [r for r in table[task] if r is not None]
        if len(valid) == 1:
            rates[task] = (valid[0] + 0.5) / 2
        elif valid:
            spread = math.sqrt(max(0.0, 0.25 - variance(valid)))
            rate = 0.5 + spread if fmean(valid) >= 0.5 else 0.5 - spread
            rates[task] = min(max(rate, _STEADY), 1 - _STEADY)  # logits must stay finite
    return rates


def shift_rates(rates: Sequence[float], effect: float) -> list[float]:
    """Pass rates moved by one common logit shift so that their mean rises by ``effect``.

    The effect model of noise_floor and the benchmark: every task gets the same
    push in log-odds, so tasks near 0 or 1 move less, as real tasks do. Rates
    must lie strictly between 0 and 1.
    """
    logits = [math.log(p / (1 - p)) for p in rates]
    target = math.fsum(rates) + effect * len(rates)

    def moved(shift: float) -> list[float]:
        return [1 / (1 + math.exp(-(x + shift))) for x in logits]

    low, high = -40.0, 40.0
    for _ in range(60):  # 80 / 2**60: far below any visible effect
        middle = (low + high) / 2
        low, high = (middle, high) if math.fsum(moved(middle)) < target else (low, middle)
    return moved((low + high) / 2)
