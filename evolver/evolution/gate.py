"""Statistical acceptance gate: keep a candidate harness only on real evidence.

Pure Python and numpy, so it imports without tau2.
Rewards are per task, per trial, floats in [0, 1]; ``None`` marks an
infrastructure error (a missing result, never a failure).

API::

    RewardTable = Mapping[str, Sequence[float | None]]   # task id -> rewards per trial

    GateConfig(alpha=0.05, min_effect=0.0, stages=(1, 2, 3, 4, 6),
               futility=(-0.5, 0.25, 0.75, 1.0), suite_threshold=0.9,
               suite_min_trials=2, regression_drop=0.7, max_regressions=0,
               permutations=5000, screen=2)

    decide_set(incumbent, candidates, config, *, stage, reference=None) -> SetVerdict
        One stage of an iteration that judges one or more candidates from the
        same parent, the incumbent measured alongside them (its trials
        interleaved with theirs, in the same window). Keeps at most one.
        Robust to drift between the reference and the iteration, and between
        stages: every comparison that can accept is concurrent.
    set_stages(config, candidates) -> ((incumbent trials, candidate trials), ...)
        The trials per task each arm has in all after each stage.
    evaluate_set(names, run, config, *, reference=None) -> list[SetVerdict]
        The staged loop over decide_set.
    sized(config, reference, *, effect=0.10) -> GateConfig
        The config with its stages stretched to the noise of the incumbent's
        tasks, so that decide_set keeps a +10-point candidate about 80% of the
        time (never shrunk; at most doubled).

    decide(incumbent, candidate, config, *, stage) -> Verdict
        Today's gate: one candidate's look against the incumbent's reference
        results, measured once and reused. A non-final look returns "reject"
        or "continue"; only the final look may "accept". Not robust to drift.
    evaluate(incumbent, run_candidate, config) -> list[Verdict]
        The staged loop over decide: ``run_candidate(n)`` returns the
        candidate's table with ``n`` trials per task (cumulative).
    noise_floor(incumbent, config, *, power=0.8, simulations=200, seed=0, concurrent=False) -> float
        Smallest mean effect (reward units) the gate accepts with probability
        ``power``, simulated at the incumbent's per-task pass rates
        (``concurrent``: decide_set's gate; otherwise decide's).
    pass_rates(table) -> dict[str, float]; shift_rates(rates, effect) -> list[float]
        The noise and effect model behind noise_floor and sized (shared with the benchmark).

An iteration by hand, to persist each stage::

    config = sized(config, reference)             # once per reference, before the iteration
    plan = set_stages(config, len(candidates))
    alive = list(candidates)
    for stage, (inc_trials, cand_trials) in enumerate(plan):
        run the incumbent to inc_trials and each alive candidate to cand_trials
        trials per task, interleaved in one window (trial j of an arm runs in
        the window of the stage that first asks for more than j)
        verdict = decide_set(incumbent, every_candidate_table, config, stage=stage, reference=reference)
        save(dataclasses.asdict(verdict))         # JSON-serialisable
        if verdict.decided:
            break                                 # verdict.kept: the one to keep, or None
        alive = verdict.alive                     # verdict.next_*: the next stage's counts

Statistics (docs/gate.md explains them in plain words):

* Paired by task. A task takes part when both sides have at least one valid
  trial; its delta is candidate mean minus incumbent mean over valid trials.
  ``effect`` is the mean delta over tasks.
* Acceptance test (final look only): a permutation test of the whole staged
  procedure. Under "no effect" the candidate's and incumbent's trials in a
  block are exchangeable: in decide_set a block is one task's trials of one
  stage's window (so a drift between windows, which moves both sides of a
  block alike, cannot pass for an effect); in decide, all of a task's trials.
  The p-value is the probability that relabelling trials within blocks both
  passes every earlier look (the futility rule below, on the trials seen by
  then) and gives a total delta at least as large as observed. Valid for any
  trial counts. With earlier looks it is a Monte-Carlo estimate
  (``permutations`` relabellings, seeded by the data, so verdicts are
  reproducible; valid at any count); with a single look and 0/1 rewards it is
  computed exactly.
* decide_set with several candidates is select-then-confirm: each runs
  ``screen`` trials per task, the one with the highest mean reward goes on,
  the others are rejected, and the winner's gate runs on fresh trials beside
  the incumbent's. The screen can only reject, and the winner's test sees
  none of the trials that chose it, so the chance that the iteration keeps a
  candidate that does nothing is <= alpha whatever the number of candidates.
* decide_set's looks before the last compare the candidate with the
  incumbent's concurrent trials and its reference results together (sharper
  early stops); the reference is a fixed block of the relabelling, so the
  test stays exact, and a drift can only make the early stops wrong, never
  the final test. The last look and the final test use concurrent trials only.
* Accept only if p <= alpha, effect > 0 and effect >= min_effect. min_effect is
  a floor on the estimate, not the null hypothesis: the false-accept rate for
  a no-effect candidate stays <= alpha, and a candidate whose true gain equals
  min_effect passes about half the time once the gate has the power for it.
  Testing against min_effect instead would need far more trials for the same
  power and permutation tests have no exact form for a shifted null.
* Futility at non-final looks: reject when effect / stderr < futility[stage].
  Only results that passed every look can be accepted, and the final test
  counts only relabellings that pass them too, so the procedure's
  false-accept probability is <= alpha and the alpha that early stops leave
  unused goes to the final test (a binding futility rule). The final look
  therefore also rejects results an earlier look would have stopped, whoever
  calls it. It sees only the final table, so a trial that an infrastructure
  error hid at a look and a retry filled in later counts as seen at that
  look: the test may then reject a candidate the real looks let through, and
  its false-accept bound still holds.
* Regression suite: tasks the incumbent passes at rate >= suite_threshold over
  >= suite_min_trials valid trials. Such a task is broken when the candidate's
  pass rate on it, over >= suite_min_trials valid trials, is more than
  regression_drop below the incumbent's (default 0.7: 6/6 -> 1/6 or 0/6).
  More than max_regressions broken tasks reject the candidate. Judged at the
  final look only: a few trials cannot tell a broken task from bad luck, and
  selecting tasks on a perfect incumbent record already flatters them.
"""

from __future__ import annotations

import hashlib
import math
import random
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from statistics import NormalDist, fmean, variance
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

RewardTable = Mapping[str, Sequence[float | None]]
Decision = Literal["accept", "reject", "continue"]

# Per-task weights 1/k + 1/m are exact integers on a grid of lcm(trial counts)
# when that is at most 120 (any mix of 1-6 and 8 trials). Otherwise they are
# rounded to this grid: the test stays exact, since the weights do not depend
# on outcomes, and each weight moves by under 3% up to 12 trials a side; a
# finer grid makes the exact computation take seconds.
_MAX_GRID = 120
_STEADY = 0.001  # closest to 0 or 1 a simulated pass rate gets
_TINY = 1e-12  # an effect or stderr this small is rounding error: 0
# sized(): the expected z, at the final stage, of the effect decide_set's gate should keep 80% of the
# time. Measured (benchmarks/gate_power.py's worlds, 400 decisions each): at 2.9 a +10 candidate was kept
# 83% of the time on uniform pass rates, 85% on coin flips, but 78% with 10% of trials lost to errors;
# at 3.1, 87%, 87% and 83%.
_SIZED_Z = 3.1
MOST_STRETCH = 2.0  # (1, 2, 3, 4, 6) at most to (2, 4, 6, 8, 12): a bound on one iteration's cost


@dataclass(frozen=True)
class GateConfig:
    """Gate parameters. The defaults come from benchmarks/gate_power.py on a
    40-task gate with tau2-like noise (docs/gate.md has the measured table):
    decide_set, sized to the noise, keeps a no-op in at most 5% of iterations
    and a +10-point candidate over 80% of the time on every stationary noise
    shape measured, at 0.62-0.67x the simulations of a fixed-size test with
    the same alpha and power (both arms counted). The same stages and
    boundaries serve decide()."""

    alpha: float = 0.05  # false-accept probability for a no-effect candidate
    min_effect: float = 0.0  # smallest mean gain worth keeping (0.05 = 5 points)
    stages: tuple[int, ...] = (1, 2, 3, 4, 6)  # cumulative candidate trials per task
    futility: tuple[float, ...] = (-0.5, 0.25, 0.75, 1.0)  # z boundary per non-final look
    suite_threshold: float = 0.9  # incumbent pass rate that counts as reliable
    suite_min_trials: int = 2  # valid trials needed on each side to judge a task
    regression_drop: float = 0.7  # rate drop (strictly more) that breaks a task
    max_regressions: int = 0  # broken suite tasks tolerated
    permutations: int = 5000  # Monte-Carlo relabellings of the final test
    screen: int = 2  # trials per task each candidate runs to pick the best of several (decide_set)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError("alpha must be in (0, 1)")
        if not self.stages or any(b <= a for a, b in zip(self.stages, self.stages[1:])):
            raise ValueError("stages must be a non-empty increasing tuple")
        if self.stages[0] < 1:
            raise ValueError("stages count trials per task, starting at 1 or more")
        if len(self.futility) != len(self.stages) - 1:
            raise ValueError("futility needs one boundary per non-final stage")
        if self.screen < 1:
            raise ValueError("screen counts trials per task, 1 or more")


@dataclass(frozen=True)
class Regression:
    task: str
    incumbent_rate: float
    candidate_rate: float


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str  # one readable sentence
    effect: float  # mean per-task delta (candidate - incumbent), reward units
    stderr: float | None  # of effect; None with fewer than 2 paired tasks
    ci_low: float | None  # one-sided (1 - alpha) lower bound, t approximation
    p_value: float | None  # permutation test of the staged procedure; final look only
    n_tasks: int  # paired tasks compared
    n_dropped: int  # candidate tasks without a valid trial on both sides
    n_candidate_sims: int  # candidate trials run so far, errors included
    stage: int
    final: bool
    suite_size: int  # reliably passed incumbent tasks checked (final look only)
    regressions: tuple[Regression, ...]


@dataclass(frozen=True)
class SetVerdict:
    """One stage of an iteration that judges a set of candidates (decide_set)."""

    stage: int
    decided: bool  # nothing runs another stage: `kept` is final
    kept: str | None  # the one accepted candidate, if any
    alive: tuple[str, ...]  # the candidate that runs the next stage, if any (at most one)
    next_incumbent_trials: int | None  # trials per task in all the incumbent needs at the next stage
    next_trials: int | None  # trials per task in all each alive candidate needs at the next stage
    n_incumbent_sims: int  # the incumbent's trials this iteration so far, errors included
    reason: str  # one readable sentence
    verdicts: dict[str, Verdict]  # every candidate's latest verdict, by name


def decide(
    incumbent: RewardTable, candidate: RewardTable, config: GateConfig, *, stage: int
) -> Verdict:
    """Judge the candidate's results so far against the incumbent's reference results; see the module docstring."""
    if not 0 <= stage < len(config.stages):
        raise ValueError(f"stage {stage} outside config.stages")
    return _look(incumbent, candidate, config, stage, alpha=config.alpha, layout=_reference_blocks)


def _look(
    incumbent: RewardTable, candidate: RewardTable, config: GateConfig, stage: int, *, alpha: float,
    layout: Callable[[RewardTable, RewardTable, tuple[int, ...]], dict[str, list[_Block]]],
) -> Verdict:
    """One look at one candidate: futility before the final stage; the final test, at level alpha, at it.
    layout says which trials the final test may exchange (see _reference_blocks, _concurrent_blocks)."""
    final = stage == len(config.stages) - 1
    pairs = _paired(incumbent, candidate)
    deltas = [fmean(c) - fmean(i) for c, i in pairs.values()]
    n = len(deltas)
    effect = fmean(deltas) if deltas else 0.0
    stderr = math.sqrt(sum((d - effect) ** 2 for d in deltas) / (n - 1) / n) if n >= 2 else None
    ci_low = None if stderr is None else effect - _t_quantile(1 - alpha, n - 1) * stderr
    suite, broken = _regressions(incumbent, candidate, config) if final else (0, [])
    if final and n >= 2:
        p_value, stopped = _final_test(pairs, layout(incumbent, candidate, config.stages), config, alpha)
    else:
        p_value, stopped = None, None

    def verdict(decision: Decision, reason: str) -> Verdict:
        return Verdict(
            decision=decision, reason=reason, effect=effect, stderr=stderr,
            ci_low=ci_low, p_value=p_value, n_tasks=n,
            n_dropped=len(candidate) - n,
            n_candidate_sims=sum(len(trials) for trials in candidate.values()),
            stage=stage, final=final, suite_size=suite, regressions=tuple(broken),
        )

    summary = f"{_points(effect)} over {n} tasks"
    if len(broken) > config.max_regressions:
        names = ", ".join(r.task for r in broken)
        return verdict("reject", f"Rejected: broke {len(broken)} of {suite} reliably passed tasks ({names}).")
    if not final:
        z = _z(effect, stderr)
        if z is not None and z < config.futility[stage]:
            return verdict("reject", f"Rejected early: {summary} (z={z:.2f}) cannot plausibly pass.")
        return verdict("continue", f"Continue: {summary} after {config.stages[stage]} trial(s) per task.")
    if p_value is None:
        return verdict("reject", f"Rejected: only {n} paired task(s), too few to compare.")
    if stopped is not None:  # judged out of turn: the staged procedure would not have got here
        return verdict("reject", f"Rejected: {summary}, but the look after {config.stages[stopped]} trial(s) per task would have stopped it.")
    if effect <= 0:
        return verdict("reject", f"Rejected: no improvement ({summary}).")
    if p_value > alpha:
        return verdict("reject", f"Rejected: {summary} is within noise ({_p(p_value)} > {alpha:.3g}).")
    if effect < config.min_effect:
        return verdict("reject", f"Rejected: {summary} is below the minimum effect {_points(config.min_effect)}.")
    # The decision is the permutation test's; the t-approximation's bound is shown only when it agrees
    # (with few tasks it can dip below zero for an effect the exact test confirms).
    bound = f", lower bound {_points(ci_low)}" if ci_low is not None and ci_low > 0 else ""
    return verdict("accept", f"Accepted: {summary}, {_p(p_value)} (permutation test){bound}.")


def evaluate(
    incumbent: RewardTable, run_candidate: Callable[[int], RewardTable], config: GateConfig
) -> list[Verdict]:
    """Run the staged procedure; the last verdict is "accept" or "reject"."""
    verdicts = []
    for stage, trials in enumerate(config.stages):
        verdicts.append(decide(incumbent, run_candidate(trials), config, stage=stage))
        if verdicts[-1].decision != "continue":
            break
    return verdicts


def decide_set(
    incumbent: RewardTable, candidates: Mapping[str, RewardTable], config: GateConfig, *, stage: int,
    reference: RewardTable | None = None,
) -> SetVerdict:
    """Judge candidates from the same parent; keep at most one. See the module docstring.

    ``candidates`` holds every candidate that entered the gate this
    iteration, screened-out and rejected ones included, with all the trials
    each ran; ``incumbent`` the incumbent's trials run alongside them;
    ``reference`` (optional) earlier results of the incumbent, which sharpen
    the early stops but never the final test. Trial counts follow
    set_stages(config, len(candidates)). Pure: the same tables give the same
    verdict, so a caller can replay any stage.
    """
    plan = set_stages(config, len(candidates))
    if not 0 <= stage < len(plan):
        raise ValueError(f"stage {stage} outside the {len(plan)} stages of {len(candidates)} candidate(s)")
    skip = config.screen if len(candidates) > 1 else 0  # the winner's screen trials never reach the gate
    winner, verdicts = _screen(candidates, skip) if skip else (next(iter(candidates)), {})
    gate_stage = stage - (len(plan) - len(config.stages))
    if winner is not None and gate_stage >= 0:
        own = {task: list(rewards[skip:]) for task, rewards in candidates[winner].items()}
        verdict = _replay(incumbent, own, config, gate_stage, reference)
        verdicts[winner] = replace(verdict, stage=verdict.stage + stage - gate_stage,
                                   n_candidate_sims=sum(len(r) for r in candidates[winner].values()))
    verdicts = {name: verdicts[name] for name in sorted(verdicts)}
    kept = winner if winner is not None and verdicts[winner].decision == "accept" else None
    alive = (winner,) if winner is not None and verdicts[winner].decision == "continue" else ()
    after = plan[stage + 1] if alive else (None, None)
    return SetVerdict(
        stage=stage, decided=not alive, kept=kept, alive=alive,
        next_incumbent_trials=after[0], next_trials=after[1],
        n_incumbent_sims=sum(len(r[: plan[stage][0]]) for r in incumbent.values()),
        reason=_set_reason(verdicts, winner, kept, bool(alive)), verdicts=verdicts,
    )


def set_stages(config: GateConfig, candidates: int) -> tuple[tuple[int, int], ...]:
    """(incumbent trials, trials of each candidate still in) per task, in all, at each stage of an iteration.

    One candidate goes straight to the gate's stages. Several first run
    ``config.screen`` trials each, without the incumbent, and only the best
    runs the gate's stages, on fresh trials beside the incumbent's.
    """
    if candidates < 1:
        raise ValueError("a set needs at least one candidate")
    if candidates == 1:
        return tuple((n, n) for n in config.stages)
    return ((0, config.screen), *((n, config.screen + n) for n in config.stages))


def evaluate_set(
    names: Sequence[str], run: Callable[[int, int, tuple[str, ...]], tuple[RewardTable, Mapping[str, RewardTable]]],
    config: GateConfig, *, reference: RewardTable | None = None,
) -> list[SetVerdict]:
    """Run an iteration's stages on a set of candidates; the last verdict is decided.

    ``run(incumbent_trials, candidate_trials, alive)`` must bring the
    incumbent and every alive candidate to those trial counts per task,
    interleaved in one window, and return the incumbent's table and every
    candidate's (the stopped ones' as they were).
    """
    verdicts: list[SetVerdict] = []
    alive = tuple(sorted(names))
    for stage, (inc_trials, cand_trials) in enumerate(set_stages(config, len(names))):
        incumbent, tables = run(inc_trials, cand_trials, alive)
        verdicts.append(decide_set(incumbent, tables, config, stage=stage, reference=reference))
        if verdicts[-1].decided:
            break
        alive = verdicts[-1].alive
    return verdicts


def _screen(candidates: Mapping[str, RewardTable], trials: int) -> tuple[str | None, dict[str, Verdict]]:
    """The best candidate on its first `trials` trials, and every candidate's verdict on the screen.

    Best: the highest mean reward over the tasks every candidate has a valid
    trial of (ties to the first name). In these verdicts the effect is the gap
    to the best, since the incumbent does not run in the screen.
    """
    valid = {name: {task: [float(r) for r in rewards[:trials] if r is not None] for task, rewards in table.items()}
             for name, table in candidates.items()}
    shared = set.intersection(*({task for task, rs in tasks.items() if rs} for tasks in valid.values()))
    score = {name: fmean(fmean(tasks[t]) for t in shared) if shared else 0.0 for name, tasks in valid.items()}
    winner = min(sorted(score), key=lambda name: -score[name]) if shared else None
    verdicts = {}
    for name in sorted(candidates):
        if winner is None:
            decision, reason = "reject", "Rejected: no task has a valid screen trial of every candidate."
        elif name == winner:
            lead = score[winner] - max(v for n, v in score.items() if n != winner)
            decision, reason = "continue", f"Best of {len(candidates)} after {trials} trial(s) per task, {_points(lead)} ahead of the next."
        else:
            decision, reason = "reject", f"Screened out: {_points(score[name] - score[winner])} behind {winner} after {trials} trial(s) per task."
        verdicts[name] = Verdict(
            decision=decision, reason=reason, effect=score[name] - score[winner] if winner is not None else 0.0,
            stderr=None, ci_low=None, p_value=None, n_tasks=len(shared), n_dropped=len(candidates[name]) - len(shared),
            n_candidate_sims=sum(len(r) for r in candidates[name].values()),
            stage=0, final=False, suite_size=0, regressions=(),
        )
    return winner, verdicts


def _replay(incumbent: RewardTable, candidate: RewardTable, config: GateConfig, stage: int, reference: RewardTable | None) -> Verdict:
    """The candidate's looks up to `stage`, each on the trials both sides had then; the first that stops it, or the last.

    Looks before the last compare with the incumbent's concurrent trials and
    its reference results together; the last with the concurrent trials only.
    """
    last = len(config.stages) - 1
    layout = partial(_concurrent_blocks, reference=reference)
    for look in range(stage + 1):
        trials = config.stages[look]
        seen = _first(incumbent, trials)
        if reference and look < last:
            seen = {task: [*reference.get(task, ()), *rewards] for task, rewards in seen.items()}
        verdict = _look(seen, _first(candidate, trials), config, look, alpha=config.alpha, layout=layout)
        if verdict.decision != "continue":
            break
    return verdict


def _first(table: RewardTable, trials: int) -> dict[str, list[float | None]]:
    return {task: list(rewards[:trials]) for task, rewards in table.items()}


def _set_reason(verdicts: Mapping[str, Verdict], winner: str | None, kept: str | None, going: bool) -> str:
    count = len(verdicts)
    if winner is None:
        return f"Kept none of {count}: no task has a valid screen trial of every candidate."
    if kept is not None:
        return f"Kept {kept} of {count}: {verdicts[kept].reason}"
    if going:
        return f"{winner} of {count} goes on: {verdicts[winner].reason}"
    return f"Kept none of {count}: {winner}: {verdicts[winner].reason}"


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
    incumbent: RewardTable, config: GateConfig, *, power: float = 0.8, simulations: int = 200, seed: int = 0,
    concurrent: bool = False,
) -> float:
    """Smallest mean effect the gate accepts with probability ``power``.

    A seeded simulation of the gate itself, futility stops and final test
    included: tasks pass at ``pass_rates(incumbent)``, a candidate with mean
    effect d at ``shift_rates(rates, d)``; both sides are drawn as 0/1 trials
    with the incumbent's valid trial counts and the gate's stages. With
    ``concurrent``, the gate simulated is decide_set's for one candidate: the
    incumbent's results serve as its reference and it also runs the gate's
    stages beside the candidate (pass sized(config, incumbent) to see the
    floor of a sized gate). The effect
    is found by bisection to half a point, then interpolated; every effect
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
        if not concurrent:
            return evaluate(table, lambda n: _first(trials, n), config)[-1].decision == "accept"
        verdicts = evaluate_set(["c"], lambda n_inc, n, _: (_first(alongside, n_inc), {"c": _first(trials, n)}),
                                config, reference=table)
        return verdicts[-1].kept is not None

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


def _paired(incumbent: RewardTable, candidate: RewardTable) -> dict[str, tuple[list[float], list[float]]]:
    """Valid (candidate, incumbent) trials of each task present on both sides, sorted by task."""
    pairs = {}
    for task in sorted(candidate.keys() & incumbent.keys()):
        cand = [float(r) for r in candidate[task] if r is not None]
        inc = [float(r) for r in incumbent[task] if r is not None]
        if cand and inc:
            pairs[task] = (cand, inc)
    return pairs


def _regressions(
    incumbent: RewardTable, candidate: RewardTable, config: GateConfig
) -> tuple[int, list[Regression]]:
    """Size of the regression suite and its tasks the candidate broke."""
    suite, broken = 0, []
    for task in sorted(candidate.keys() & incumbent.keys()):
        inc = [r for r in incumbent[task] if r is not None]
        if len(inc) < config.suite_min_trials or fmean(inc) < config.suite_threshold:
            continue
        suite += 1
        cand = [r for r in candidate[task] if r is not None]
        if len(cand) >= config.suite_min_trials and fmean(cand) < fmean(inc) - config.regression_drop:
            broken.append(Regression(task, fmean(inc), fmean(cand)))
    return suite, broken


def _final_test(
    pairs: dict[str, tuple[list[float], list[float]]], blocks: dict[str, list[_Block]], config: GateConfig, alpha: float
) -> tuple[float, int | None]:
    """The final look's p-value, and the earlier look that would have stopped these results (or None).

    With earlier looks, the p-value is the probability, under relabelling, of
    passing every earlier look and reaching a total delta at least as large as
    observed. Only results that passed every look can be accepted, so those
    looks take no alpha away from the final test. With no earlier looks and 0/1
    rewards it is computed exactly; otherwise by Monte-Carlo.
    """
    binary = all(r in (0.0, 1.0) for c, i in pairs.values() for r in (*c, *i))
    if len(config.stages) == 1 and binary:
        return _exact_p_value(list(pairs.values())), None
    return _staged_p_value(blocks, config, alpha)


# A block is a set of trials of one task that relabelling may exchange: (candidate values, the look
# at which each is first seen, incumbent values, the looks at which they count). A block with no
# candidate value never changes: it holds fixed results the looks compare against.
_Block = tuple[list[float], tuple[int, ...], list[float], tuple[int, ...]]


def _reference_blocks(incumbent: RewardTable, candidate: RewardTable, stages: tuple[int, ...]) -> dict[str, list[_Block]]:
    """One block per task: the candidate's valid trials, each seen from the look that ran it, and every
    valid trial of the reference, seen at every look (it was measured before the first)."""
    blocks = {}
    for task in sorted(candidate.keys() & incumbent.keys()):
        cand = [(float(r), min(bisect_right(stages, j), len(stages) - 1)) for j, r in enumerate(candidate[task]) if r is not None]
        inc = [float(r) for r in incumbent[task] if r is not None]
        if cand and inc:
            blocks[task] = [([r for r, _ in cand], tuple(look for _, look in cand), inc, tuple(range(len(stages))))]
    return blocks


def _concurrent_blocks(
    incumbent: RewardTable, candidate: RewardTable, stages: tuple[int, ...], reference: RewardTable | None = None
) -> dict[str, list[_Block]]:
    """Per task, one block per stage: the valid trials both sides ran in that stage's window.

    Only trials of the same window are exchanged, so a drift between windows
    moves both sides of every block alike and cannot pass for an effect. The
    reference's trials, if any, are a fixed block that only the looks before
    the last count.
    """
    last = len(stages) - 1
    blocks = {}
    for task in sorted(candidate.keys() & incumbent.keys()):
        task_blocks = []
        for look, (low, high) in enumerate(zip((0, *stages), stages)):
            cand = [float(r) for r in candidate[task][low:high] if r is not None]
            inc = [float(r) for r in incumbent[task][low:high] if r is not None]
            if cand or inc:
                task_blocks.append((cand, (look,) * len(cand), inc, tuple(range(look, last + 1))))
        if any(b[0] for b in task_blocks) and any(b[2] for b in task_blocks):
            earlier = [float(r) for r in (reference or {}).get(task, ()) if r is not None]
            blocks[task] = task_blocks + ([([], (), earlier, tuple(range(last)))] if earlier and last else [])
    return blocks


def _staged_p_value(blocks: dict[str, list[_Block]], config: GateConfig, alpha: float) -> tuple[float, int | None]:
    """Monte-Carlo relabelling of the whole staged procedure, seeded by the data.

    Under "no effect", the valid candidate and incumbent trials of a block are
    exchangeable, so each relabelling shuffles them: the candidate's slots, in
    trial order, take the first values, the incumbent the rest. Each
    relabelling is put through every earlier look (the same z and futility
    boundary as decide(), over the trials seen by then) and the final total
    delta. (hits + 1) / (draws + 1) is a valid p-value at any number of draws.
    Drawing stops early once the hits rule out p <= alpha, so a clear reject
    costs less and gets the same decision.
    """
    looks = len(config.stages)
    groups: dict[tuple, list[list[list[float]]]] = {}  # block shapes -> per task, the pooled trials of each block
    for task in sorted(blocks):
        shape = tuple((len(c), seen, len(i), at) for c, seen, i, at in blocks[task])
        groups.setdefault(shape, []).append([c + i for c, _, i, _ in blocks[task]])
    seed = hashlib.sha256(repr(sorted(groups.items())).encode()).digest()[:8]
    rng = np.random.default_rng(int.from_bytes(seed))
    pooled = {shape: [np.array([task[b] for task in tasks]) for b in range(len(shape))] for shape, tasks in sorted(groups.items())}

    def relabelled(draws: int) -> list[list]:
        """Per look, the (draws, tasks) deltas of `draws` relabellings, one array per group."""
        deltas: list[list] = [[] for _ in range(looks)]
        for shape, arrays in pooled.items():
            drawn = [_relabel(rng, array, k, draws) for (k, *_), array in zip(shape, arrays)]
            _add_deltas(deltas, shape, drawn)
        return deltas

    observed: list[list] = [[] for _ in range(looks)]
    for shape, arrays in pooled.items():
        seen = [(list(np.cumsum(a[:, :k], axis=1).T[:, None, :]), a[:, k:].sum(axis=1)[None, :])
                for (k, *_), a in zip(shape, arrays)]
        _add_deltas(observed, shape, seen)
    stop, total = _judge(observed, config.futility)
    if stop[0] < looks - 1:
        return 1.0, int(stop[0])
    hits = drawn = 0
    while drawn < config.permutations:
        draws = min(1000, config.permutations - drawn)
        stops, totals = _judge(relabelled(draws), config.futility)
        # float sums of the same values may differ in the last bit
        hits += int(np.count_nonzero((stops == looks - 1) & (totals >= total[0] - 1e-9)))
        drawn += draws
        if hits + 1 > alpha * (config.permutations + 1):
            break  # p > alpha whatever the remaining draws give
    return (hits + 1) / (drawn + 1), None


def _relabel(rng: np.random.Generator, pooled, k: int, draws: int) -> tuple[list, object]:
    """`draws` relabellings of one block of a group of tasks (pooled: tasks x trials, the candidate's k first).

    Returns the candidate's running totals over its first 1..k slots and the
    incumbent's total, each (draws, tasks).
    """
    if np.isin(pooled, (0.0, 1.0)).all():  # draw the candidate's trials one by one: fast
        ones = np.broadcast_to(pooled.sum(axis=1).astype(np.int16), (draws, len(pooled))).copy()
        running, sums = np.zeros_like(ones), []
        for j in range(k):
            took = rng.integers(0, pooled.shape[1] - j, size=ones.shape, dtype=np.int16) < ones
            ones -= took
            running += took
            sums.append(running.copy())
        return sums, ones
    shuffled = rng.permuted(np.broadcast_to(pooled, (draws, *pooled.shape)), axis=2)
    return list(np.moveaxis(np.cumsum(shuffled[..., :k], axis=2), 2, 0)), shuffled[..., k:].sum(axis=2)


def _add_deltas(deltas: list[list], shape: tuple, blocks: list[tuple[list, object]]) -> None:
    """Append one group's per-task deltas at each look; blocks[b] = (candidate's running totals, incumbent's total)."""
    for look in range(len(deltas)):
        cand_sum = inc_sum = 0
        cand_n = inc_n = 0
        for (_, seen, m, at), (sums, inc_total) in zip(shape, blocks):
            count = sum(s <= look for s in seen)
            if count:
                cand_sum, cand_n = cand_sum + sums[count - 1], cand_n + count
            if m and look in at:
                inc_sum, inc_n = inc_sum + inc_total, inc_n + m
        if cand_n and inc_n:  # a task with no valid trial yet on a side sits the look out
            deltas[look].append(cand_sum / cand_n - inc_sum / inc_n)


def _judge(deltas: list[list], futility: tuple[float, ...]) -> tuple:
    """For each row: the first look whose z falls below its futility boundary (len(futility) if none), and the final total delta."""
    rows = deltas[-1][0].shape[0]
    stop = np.full(rows, len(futility))
    for look, boundary in enumerate(futility):
        if sum(d.shape[1] for d in deltas[look]) >= 2:  # as decide(): z needs two tasks
            values = np.concatenate(deltas[look], axis=1)
            effect = values.mean(axis=1)
            stderr = values.std(axis=1, ddof=1) / math.sqrt(values.shape[1])
            flat = np.where(effect > _TINY, np.inf, np.where(effect < -_TINY, -np.inf, 0.0))  # as _z()
            z = np.where(stderr > _TINY, effect / np.maximum(stderr, _TINY), flat)
            stop = np.where((stop == len(futility)) & (z < boundary), look, stop)
    return stop, np.concatenate(deltas[-1], axis=1).sum(axis=1)


def _exact_p_value(pairs: list[tuple[list[float], list[float]]]) -> float:
    """P(relabelled total delta >= observed), exact, for 0/1 rewards.

    Per task with k candidate and m incumbent trials and s successes in all,
    delta = X (1/k + 1/m) - s/m where X, the candidate's successes, is
    hypergeometric under relabelling. So the total delta is sum(w X) plus a
    constant, with integer weights w proportional to 1/k + 1/m. Its exact
    distribution is the product of one counting polynomial per task; Python's
    big integers multiply those fast when each coefficient is packed into a
    B-bit digit (Kronecker substitution).
    """
    counts = [n for c, i in pairs for n in (len(c), len(i))]
    grid = math.lcm(*counts)
    grid = grid if grid <= _MAX_GRID else _MAX_GRID
    tasks = []  # (weight, pooled trials, pooled successes, candidate trials, observed X)
    for cand, inc in pairs:
        k, n, s = len(cand), len(cand) + len(inc), int(sum(cand) + sum(inc))
        if 0 < s < n:  # a task with all-equal trials cannot change under relabelling
            tasks.append((round(grid * (1 / k + 1 / len(inc))), n, s, k, int(sum(cand))))
    if not tasks:
        return 1.0
    unit = math.gcd(*(w for w, *_ in tasks))
    total = math.prod(math.comb(n, k) for _, n, _, k, _ in tasks)
    bits = total.bit_length() + 1  # every coefficient and every tail sum fits
    product = 1
    for (w, n, s, k), repeat in Counter(t[:4] for t in tasks).items():
        step = bits * (w // unit)
        poly = sum(
            math.comb(s, x) * math.comb(n - s, k - x) << (step * x)
            for x in range(max(0, k - (n - s)), min(k, s) + 1)
        )
        product *= poly**repeat
    observed = sum(w // unit * x for w, _, _, _, x in tasks)
    # Digits of base 2**bits sum to the number modulo 2**bits - 1, as digits of
    # base 10 do modulo 9; no carries since the sum is below the modulus.
    tail = (product >> (bits * observed)) % ((1 << bits) - 1)
    return tail / total


def _z(effect: float, stderr: float | None) -> float | None:
    if stderr is None:
        return None
    if stderr <= _TINY:  # every task moved by the same amount
        return math.copysign(math.inf, effect) if abs(effect) > _TINY else 0.0
    return effect / stderr


def _t_quantile(q: float, df: int) -> float:
    """Student t quantile by the Cornish-Fisher expansion (within 0.5% for df >= 5)."""
    z = NormalDist().inv_cdf(q)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _points(value: float) -> str:
    return f"{100 * value:+.1f} points"


def _p(p_value: float) -> str:
    return "p<0.001" if p_value < 0.001 else f"p={p_value:.3f}"
