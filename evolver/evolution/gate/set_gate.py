"""The set gate: how an iteration judges its candidates, stage by stage, and keeps at most one.

decide_set() judges one stage: a screen when there are several candidates,
then the winner's looks beside the incumbent (futility stops, the final
permutation test, the regression suite); set_stages() plans the trials of
every stage; evaluate_set() drives the stages, measuring through the
caller's function. docs/gate.md explains what the gate does and why its
false-accept bound holds; the p-values come from permutation.py.
Rewards are per task, per trial, floats in [0, 1]; ``None`` marks an
infrastructure error (a missing result, never a failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from statistics import fmean
from typing import Callable, Literal, Mapping, Sequence

from evolver.evolution.gate.permutation import (
    Block,
    RewardTable,
    concurrent_blocks,
    exact_p_value,
    p_text,
    staged_p_value,
    t_quantile,
    z_score,
)

Decision = Literal["accept", "reject", "continue"]


@dataclass(frozen=True)
class GateConfig:
    """Gate parameters. The defaults come from benchmarks/gate_power.py on a
    40-task gate with tau2-like noise (docs/gate.md has the measured table):
    decide_set, sized to the noise, keeps a no-op in at most 5% of iterations
    and a +10-point candidate over 80% of the time on every stationary noise
    shape measured, at 0.62-0.67x the simulations of a fixed-size test with
    the same alpha and power (both arms counted). The single-candidate baseline of
    benchmarks/gate_power.py uses the same stages and boundaries."""

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


@dataclass(frozen=True)
class Stage:
    """One stage of an iteration, as evaluate_set asks its measuring function to run it."""

    index: int  # 0 for the first
    count: int  # the stages the iteration has, if none decides earlier
    incumbent_trials: int  # trials per task in all the incumbent needs (0 in the screen)
    candidate_trials: int  # trials per task in all each alive candidate needs
    alive: tuple[str, ...]  # the candidates that run this stage


def decide_set(
    incumbent: RewardTable,
    candidates: Mapping[str, RewardTable],
    config: GateConfig,
    *,
    stage: int,
    reference: RewardTable | None = None,
) -> SetVerdict:
    """Judge candidates from the same parent; keep at most one (docs/gate.md, "What happens in one iteration").

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
        verdicts[winner] = replace(
            verdict, stage=verdict.stage + stage - gate_stage, n_candidate_sims=sum(len(r) for r in candidates[winner].values())
        )
    verdicts = {name: verdicts[name] for name in sorted(verdicts)}
    kept = winner if winner is not None and verdicts[winner].decision == "accept" else None
    alive = (winner,) if winner is not None and verdicts[winner].decision == "continue" else ()
    after = plan[stage + 1] if alive else (None, None)
    return SetVerdict(
        stage=stage,
        decided=not alive,
        kept=kept,
        alive=alive,
        next_incumbent_trials=after[0],
        next_trials=after[1],
        n_incumbent_sims=sum(len(r[: plan[stage][0]]) for r in incumbent.values()),
        reason=_set_reason(verdicts, winner, kept, bool(alive)),
        verdicts=verdicts,
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
    names: Sequence[str],
    run: Callable[[Stage], tuple[RewardTable, Mapping[str, RewardTable]] | None],
    config: GateConfig,
    *,
    reference: RewardTable | None = None,
    on_stage: Callable[[Stage, SetVerdict], None] | None = None,
) -> list[SetVerdict]:
    """Run an iteration's stages on a set of candidates, decide_set judging each; stops at the first decided one.

    ``run(stage)`` must bring the incumbent to ``stage.incumbent_trials`` and
    every candidate in ``stage.alive`` to ``stage.candidate_trials`` trials per
    task, interleaved in one window, and return the incumbent's table and
    those candidates' tables (others' may be included; a candidate's last
    table stands until it runs again). It returns None when the stage cannot
    be judged (most of its simulations failed, say): the stages end there,
    with no verdict for it. ``on_stage(stage, verdict)`` sees each stage's
    verdict before the next stage runs (to save it).
    """
    plan = set_stages(config, len(names))
    verdicts: list[SetVerdict] = []
    alive = tuple(sorted(names))
    tables: dict[str, RewardTable] = {}
    for index, (inc_trials, cand_trials) in enumerate(plan):
        stage = Stage(index, len(plan), inc_trials, cand_trials, alive)
        measured = run(stage)
        if measured is None:
            break
        incumbent, ran = measured
        tables.update(ran)
        verdicts.append(decide_set(incumbent, tables, config, stage=index, reference=reference))
        if on_stage is not None:
            on_stage(stage, verdicts[-1])
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
    valid = {
        name: {task: [float(r) for r in rewards[:trials] if r is not None] for task, rewards in table.items()}
        for name, table in candidates.items()
    }
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
            decision, reason = (
                "reject",
                f"Screened out: {_points(score[name] - score[winner])} behind {winner} after {trials} trial(s) per task.",
            )
        verdicts[name] = Verdict(
            decision=decision,
            reason=reason,
            effect=score[name] - score[winner] if winner is not None else 0.0,
            stderr=None,
            ci_low=None,
            p_value=None,
            n_tasks=len(shared),
            n_dropped=len(candidates[name]) - len(shared),
            n_candidate_sims=sum(len(r) for r in candidates[name].values()),
            stage=0,
            final=False,
            suite_size=0,
            regressions=(),
        )
    return winner, verdicts


def _replay(incumbent: RewardTable, candidate: RewardTable, config: GateConfig, stage: int, reference: RewardTable | None) -> Verdict:
    """The candidate's looks up to `stage`, each on the trials both sides had then; the first that stops it, or the last.

    Looks before the last compare with the incumbent's concurrent trials and
    its reference results together; the last with the concurrent trials only.
    """
    last = len(config.stages) - 1
    layout = partial(concurrent_blocks, reference=reference)
    for at in range(stage + 1):
        trials = config.stages[at]
        seen = first_trials(incumbent, trials)
        if reference and at < last:
            seen = {task: [*reference.get(task, ()), *rewards] for task, rewards in seen.items()}
        verdict = look(seen, first_trials(candidate, trials), config, at, alpha=config.alpha, layout=layout)
        if verdict.decision != "continue":
            break
    return verdict


def first_trials(table: RewardTable, trials: int) -> dict[str, list[float | None]]:
    """Each task's first `trials` trials."""
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


def look(
    incumbent: RewardTable,
    candidate: RewardTable,
    config: GateConfig,
    stage: int,
    *,
    alpha: float,
    layout: Callable[[RewardTable, RewardTable, tuple[int, ...]], dict[str, list[Block]]],
) -> Verdict:
    """One look at one candidate: futility before the final stage; the final test, at level alpha, at it.
    layout says which trials the final test may exchange (permutation.concurrent_blocks for decide_set)."""
    final = stage == len(config.stages) - 1
    pairs = paired(incumbent, candidate)
    deltas = [fmean(c) - fmean(i) for c, i in pairs.values()]
    n = len(deltas)
    effect = fmean(deltas) if deltas else 0.0
    stderr = math.sqrt(sum((d - effect) ** 2 for d in deltas) / (n - 1) / n) if n >= 2 else None
    ci_low = None if stderr is None else effect - t_quantile(1 - alpha, n - 1) * stderr
    suite, broken = _regressions(incumbent, candidate, config) if final else (0, [])
    if final and n >= 2:
        p_value, stopped = _final_test(pairs, layout(incumbent, candidate, config.stages), config, alpha)
    else:
        p_value, stopped = None, None

    def verdict(decision: Decision, reason: str) -> Verdict:
        return Verdict(
            decision=decision,
            reason=reason,
            effect=effect,
            stderr=stderr,
            ci_low=ci_low,
            p_value=p_value,
            n_tasks=n,
            n_dropped=len(candidate) - n,
            n_candidate_sims=sum(len(trials) for trials in candidate.values()),
            stage=stage,
            final=final,
            suite_size=suite,
            regressions=tuple(broken),
        )

    summary = f"{_points(effect)} over {n} tasks"
    if len(broken) > config.max_regressions:
        names = ", ".join(r.task for r in broken)
        return verdict("reject", f"Rejected: broke {len(broken)} of {suite} reliably passed tasks ({names}).")
    if not final:
        z = z_score(effect, stderr)
        if z is not None and z < config.futility[stage]:
            return verdict("reject", f"Rejected early: {summary} (z={z:.2f}) cannot plausibly pass.")
        return verdict("continue", f"Continue: {summary} after {config.stages[stage]} trial(s) per task.")
    if p_value is None:
        return verdict("reject", f"Rejected: only {n} paired task(s), too few to compare.")
    # Judged out of turn: the staged procedure would not have got here. The final table is all this look
    # sees, so a trial an infrastructure error hid at a look and a retry filled in later counts as seen
    # there: the test may reject what the real looks let through, never the other way.
    if stopped is not None:
        return verdict(
            "reject", f"Rejected: {summary}, but the look after {config.stages[stopped]} trial(s) per task would have stopped it."
        )
    if effect <= 0:
        return verdict("reject", f"Rejected: no improvement ({summary}).")
    if p_value > alpha:
        return verdict("reject", f"Rejected: {summary} is within noise ({p_text(p_value)} > {alpha:.3g}).")
    # min_effect is a floor on the estimate, not the null hypothesis: a no-op is still kept with
    # probability <= alpha, and a candidate whose true gain is min_effect about half the time.
    if effect < config.min_effect:
        return verdict("reject", f"Rejected: {summary} is below the minimum effect {_points(config.min_effect)}.")
    # The decision is the permutation test's; the t-approximation's bound is shown only when it agrees
    # (with few tasks it can dip below zero for an effect the exact test confirms).
    bound = f", lower bound {_points(ci_low)}" if ci_low is not None and ci_low > 0 else ""
    return verdict("accept", f"Accepted: {summary}, {p_text(p_value)} (permutation test){bound}.")


def paired(incumbent: RewardTable, candidate: RewardTable) -> dict[str, tuple[list[float], list[float]]]:
    """Valid (candidate, incumbent) trials of each task present on both sides, sorted by task."""
    pairs = {}
    for task in sorted(candidate.keys() & incumbent.keys()):
        cand = [float(r) for r in candidate[task] if r is not None]
        inc = [float(r) for r in incumbent[task] if r is not None]
        if cand and inc:
            pairs[task] = (cand, inc)
    return pairs


def _regressions(incumbent: RewardTable, candidate: RewardTable, config: GateConfig) -> tuple[int, list[Regression]]:
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
    pairs: dict[str, tuple[list[float], list[float]]], blocks: dict[str, list[Block]], config: GateConfig, alpha: float
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
        return exact_p_value(list(pairs.values())), None
    return staged_p_value(blocks, config.futility, config.permutations, alpha)


def _points(value: float) -> str:
    return f"{100 * value:+.1f} points"
