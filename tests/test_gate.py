"""Unit tests for evolver.gate on constructed reward tables (offline, deterministic)."""

import collections
import dataclasses
import itertools
import json
import math
import random

import pytest

from evolver.gate import GateConfig, decide, evaluate, noise_floor, pass_rates, shift_rates

CONFIG = GateConfig()
FINAL = len(CONFIG.stages) - 1


def table(passes_by_task, trials):
    """Tasks t0, t1, ... where task i passes passes_by_task[i] of `trials` trials."""
    return {f"t{i}": [1.0] * s + [0.0] * (trials - s) for i, s in enumerate(passes_by_task)}


def half_passing(n_tasks=40, trials=6):
    return table([trials // 2] * n_tasks, trials)


def test_clear_win_is_accepted_at_the_final_stage():
    verdict = decide(half_passing(), table([6] * 20 + [5] * 20, 6), CONFIG, stage=FINAL)
    assert verdict.decision == "accept"
    assert verdict.final and verdict.stage == FINAL
    assert verdict.effect == pytest.approx((0.5 + 2 / 6) / 2)
    assert verdict.p_value == 1 / (CONFIG.permutations + 1)  # no relabelling does as well
    assert 0 < verdict.ci_low < verdict.effect
    assert verdict.n_tasks == 40 and verdict.n_candidate_sims == 240


def test_clear_win_at_a_non_final_stage_continues():
    verdict = decide(half_passing(), table([1] * 40, 1), CONFIG, stage=0)
    assert verdict.decision == "continue"
    assert not verdict.final and verdict.p_value is None


def test_clear_loss_is_rejected_early():
    verdict = decide(half_passing(), table([0] * 40, 1), CONFIG, stage=0)
    assert verdict.decision == "reject"
    assert not verdict.final
    assert verdict.effect == pytest.approx(-0.5)


def test_identical_results_are_rejected():
    incumbent = table([i % 7 for i in range(40)], 6)
    verdict = decide(incumbent, incumbent, CONFIG, stage=FINAL)
    assert verdict.decision == "reject"
    assert verdict.effect == 0
    assert "no improvement" in verdict.reason


def test_a_tie_is_rejected():
    # Ten tasks gain a full point and ten lose one: the mean effect is exactly zero.
    candidate = table([6] * 10 + [0] * 10 + [3] * 20, 6)
    verdict = decide(half_passing(), candidate, CONFIG, stage=FINAL)
    assert verdict.effect == 0
    assert verdict.decision == "reject"
    assert "no improvement" in verdict.reason


def test_missing_results_are_excluded_not_counted_as_failures():
    # The candidate passes every trial that ran; half its trials hit infrastructure errors.
    with_errors = {t: [1.0, 1.0, 1.0, None, None, None] for t in half_passing()}
    with_errors["t0"] = [None] * 6  # no valid trial: the task drops out
    incumbent = half_passing()
    incumbent["t1"] = [None, None, 0.0, 0.0, 0.0, 0.0]  # the incumbent's errors drop out too: 0/4

    verdict = decide(incumbent, with_errors, CONFIG, stage=FINAL)
    assert verdict.decision == "accept"
    assert verdict.n_tasks == 39 and verdict.n_dropped == 1
    assert verdict.effect == pytest.approx((38 * 0.5 + 1.0) / 39)

    as_zeros = {t: [0.0 if r is None else r for r in rewards] for t, rewards in with_errors.items()}
    assert decide(incumbent, as_zeros, CONFIG, stage=FINAL).decision == "reject"


def test_breaking_reliable_tasks_is_rejected_and_reported():
    incumbent = table([3] * 30 + [6] * 10, 6)  # t30..t39 pass reliably
    improved = [6] * 30 + [6] * 10
    assert decide(incumbent, table(improved, 6), CONFIG, stage=FINAL).decision == "accept"

    broken = improved[:30] + [0, 1] + [6] * 8  # t30 and t31 now mostly fail
    verdict = decide(incumbent, table(broken, 6), CONFIG, stage=FINAL)
    assert verdict.decision == "reject"
    assert verdict.effect > 0.3  # a big overall gain does not buy off the regressions
    assert verdict.suite_size == 10
    assert [(r.task, r.incumbent_rate, r.candidate_rate) for r in verdict.regressions] == [
        ("t30", 1.0, 0.0),
        ("t31", 1.0, pytest.approx(1 / 6)),
    ]
    assert "t30, t31" in verdict.reason


def test_regressions_are_judged_on_full_results_only():
    incumbent = table([3] * 30 + [6] * 10, 6)
    # One trial each: every reliable task failed once, which is bad luck as often as a break.
    early = decide(incumbent, table([1] * 30 + [0] * 10, 1), CONFIG, stage=0)
    assert early.regressions == () and early.decision == "continue"
    # Full results: 2/6 on a 6/6 task is a drop of 0.67, within the default 0.7.
    late = decide(incumbent, table([6] * 30 + [2] * 10, 6), CONFIG, stage=FINAL)
    assert late.regressions == () and late.decision == "accept"


def test_regression_tolerance_is_configurable():
    incumbent = table([3] * 30 + [6] * 10, 6)
    candidate = table([6] * 30 + [0] + [6] * 9, 6)
    assert decide(incumbent, candidate, CONFIG, stage=FINAL).decision == "reject"
    lenient = dataclasses.replace(CONFIG, max_regressions=1)
    assert decide(incumbent, candidate, lenient, stage=FINAL).decision == "accept"


def test_a_significant_win_below_min_effect_is_rejected():
    incumbent = table([0] * 40, 6)
    candidate = table([3] * 8 + [0] * 32, 6)  # +10 points, all on eight tasks
    small_bar = decide(incumbent, candidate, dataclasses.replace(CONFIG, min_effect=0.05), stage=FINAL)
    assert small_bar.decision == "accept"
    high_bar = decide(incumbent, candidate, dataclasses.replace(CONFIG, min_effect=0.15), stage=FINAL)
    assert high_bar.decision == "reject"
    assert high_bar.p_value == small_bar.p_value < CONFIG.alpha
    assert "minimum effect" in high_bar.reason


def test_p_value_matches_brute_force_relabelling_with_unequal_trial_counts():
    incumbent = {"a": [1.0, 0.0, 1.0, 0.0], "b": [0.0, 0.0, 1.0], "c": [1.0, 1.0, 0.0, 1.0, 0.0]}
    candidate = {"a": [1.0, 1.0], "b": [1.0, 1.0, 0.0], "c": [1.0]}

    def total_delta(split):
        return sum(sum(c) / len(c) - sum(i) / len(i) for c, i in split)

    per_task = []
    for task in sorted(incumbent):
        pooled, k = candidate[task] + incumbent[task], len(candidate[task])
        per_task.append([
            ([pooled[j] for j in chosen], [pooled[j] for j in range(len(pooled)) if j not in chosen])
            for chosen in itertools.combinations(range(len(pooled)), k)
        ])
    observed = total_delta((candidate[t], incumbent[t]) for t in sorted(incumbent))
    splits = list(itertools.product(*per_task))
    expected = sum(total_delta(s) >= observed - 1e-12 for s in splits) / len(splits)

    one_look = dataclasses.replace(CONFIG, stages=(6,), futility=())  # no earlier looks: the exact test
    verdict = decide(incumbent, candidate, one_look, stage=0)
    assert verdict.p_value == pytest.approx(expected, rel=1e-12)


def _z(deltas):
    effect = sum(deltas) / len(deltas)
    stderr = math.sqrt(sum((d - effect) ** 2 for d in deltas) / (len(deltas) - 1) / len(deltas))
    return effect / stderr if stderr else math.copysign(math.inf, effect) if effect else 0.0


def test_staged_p_value_matches_brute_force_relabelling_through_the_earlier_look():
    # Relabellings that the look after 1 trial would have stopped cannot count against the candidate.
    config = GateConfig(alpha=0.3, stages=(1, 3), futility=(0.5,), permutations=40000)
    incumbent = {"a": [0.0, 1.0], "b": [0.0, 0.0, 1.0], "c": [1.0, 0.0], "d": [0.0, 1.0, 0.0]}
    candidate = {"a": [1.0, 0.0, 1.0], "b": [1.0, 0.0, 0.0], "c": [0.0, 1.0, 1.0], "d": [1.0, 1.0, 0.0]}

    def outcomes(task):
        """Distinct (first candidate trial, candidate mean, incumbent mean) over all relabellings, with counts."""
        pooled, k = candidate[task] + incumbent[task], len(candidate[task])
        seen = collections.Counter()
        for order in itertools.permutations(pooled):
            seen[order[0], sum(order[:k]) / k, sum(order[k:]) / (len(order) - k)] += 1
        return list(seen.items())

    def judged(split):
        """(passes the first look, final total delta) of one relabelling."""
        first = [c1 - i for c1, _, i in split]
        return _z(first) >= config.futility[0], sum(c - i for _, c, i in split)

    observed = [(candidate[t][0], sum(candidate[t]) / 3, sum(incumbent[t]) / len(incumbent[t])) for t in sorted(candidate)]
    passes, total = judged(observed)
    assert passes
    staged = plain = weight_sum = 0
    for combo in itertools.product(*(outcomes(t) for t in sorted(candidate))):
        weight = math.prod(w for _, w in combo)
        ok, delta = judged([o for o, _ in combo])
        weight_sum += weight
        plain += weight * (delta >= total - 1e-12)
        staged += weight * (ok and delta >= total - 1e-12)
    staged, plain = staged / weight_sum, plain / weight_sum
    assert staged < plain - 0.05  # the look matters in this example

    verdict = decide(incumbent, candidate, config, stage=1)
    se = math.sqrt(staged * (1 - staged) / config.permutations)
    assert abs(verdict.p_value - staged) < 4 * se
    assert verdict.decision == ("accept" if verdict.p_value <= config.alpha else "reject")


def test_results_the_earlier_look_would_have_stopped_are_not_accepted():
    # A strong final result whose first trials lost clearly: the staged procedure stops it at stage 0.
    candidate = table([5] * 40, 6)
    for rewards in candidate.values():
        rewards.reverse()  # every task's first trial fails
    verdict = decide(half_passing(), candidate, CONFIG, stage=FINAL)
    assert verdict.effect > 0.3
    assert verdict.decision == "reject"
    assert "would have stopped" in verdict.reason
    assert decide(half_passing(), table([5] * 40, 6), CONFIG, stage=FINAL).decision == "accept"


def test_fractional_rewards_use_a_reproducible_monte_carlo_test():
    incumbent = {f"t{i}": [0.5, 0.25, 0.5, 0.0, 0.5, 0.25] for i in range(40)}
    better = {f"t{i}": [0.75, 1.0, 0.5, 0.75, 1.0, 0.75] for i in range(40)}
    config = dataclasses.replace(CONFIG, permutations=500)
    win = decide(incumbent, better, config, stage=FINAL)
    assert win.decision == "accept"
    assert win.p_value == pytest.approx(1 / 501)  # no relabelling beats the observed split
    same = decide(incumbent, {t: list(reversed(r)) for t, r in incumbent.items()}, config, stage=FINAL)
    assert same.decision == "reject"
    assert same.p_value == decide(incumbent, {t: list(reversed(r)) for t, r in incumbent.items()},
                                  config, stage=FINAL).p_value


def test_evaluate_runs_stages_in_order_and_stops_at_the_first_decision():
    requested = []

    def run(rewards_per_trial):
        def candidate(n):
            requested.append(n)
            return table([rewards_per_trial * n] * 40, n)
        return candidate

    verdicts = evaluate(half_passing(), run(1), CONFIG)
    assert requested == list(CONFIG.stages)
    assert [v.decision for v in verdicts] == ["continue"] * FINAL + ["accept"]

    requested.clear()
    verdicts = evaluate(half_passing(), run(0), CONFIG)
    assert requested == [CONFIG.stages[0]]
    assert [v.decision for v in verdicts] == ["reject"]


def test_verdicts_are_json_serialisable():
    incumbent = table([3] * 30 + [6] * 10, 6)
    verdict = decide(incumbent, table([6] * 30 + [0] * 10, 6), CONFIG, stage=FINAL)
    assert verdict.regressions
    loaded = json.loads(json.dumps(dataclasses.asdict(verdict), allow_nan=False))
    assert loaded["decision"] == "reject"
    assert loaded["regressions"][0] == {"task": "t30", "incumbent_rate": 1.0, "candidate_rate": 0.0}


def test_pass_rates_carry_the_observed_noise():
    rates = pass_rates({"mixed": [1.0] * 7 + [0.0], "steady": [1.0] * 8, "one": [1.0, None], "none": [None]})
    assert rates["mixed"] * (1 - rates["mixed"]) == pytest.approx(7 / 8 * 1 / 8 * 8 / 7)  # unbiased variance
    assert rates["mixed"] > 0.5
    assert rates["steady"] == pytest.approx(0.999)  # no observed noise, but logits stay finite
    assert rates["one"] == 0.75 and "none" not in rates


def test_shift_rates_moves_the_mean_by_the_effect_and_extremes_least():
    rates = [0.02, 0.3, 0.5, 0.9]
    moved = shift_rates(rates, 0.1)
    assert sum(moved) / 4 == pytest.approx(sum(rates) / 4 + 0.1)
    gains = [after - before for before, after in zip(rates, moved)]
    assert gains[2] == max(gains) and gains[0] == min(gains)


def test_noise_floor_shrinks_with_more_tasks_and_grows_with_power():
    # A small, fast gate; no regression suite, whose false alarms grow with the task count.
    config = GateConfig(stages=(2, 4), futility=(0.0,), max_regressions=10**6)
    rng = random.Random(7)
    rates = [rng.random() for _ in range(100)]
    incumbent = {f"t{i}": [float(rng.random() < p) for _ in range(4)] for i, p in enumerate(rates)}
    quarter = dict(list(incumbent.items())[:25])
    floor = noise_floor(quarter, config, simulations=50)
    assert floor == noise_floor(quarter, config, simulations=50)  # seeded
    assert 0.1 < floor < 0.5
    assert noise_floor(incumbent, config, simulations=50) < 0.7 * floor  # 4x the tasks: about half
    assert noise_floor(quarter, config, simulations=50, power=0.95) > floor


def test_config_rejects_mismatched_futility_boundaries():
    with pytest.raises(ValueError):
        GateConfig(stages=(1, 2, 4), futility=(0.0,))


def test_false_accept_rate_of_the_sequential_gate_stays_under_alpha():
    """2,400 no-op candidates run through every stage under tau2-like noise."""
    rng = random.Random(20240607)
    decisions, accepted = 2400, 0
    for _ in range(decisions):
        rates = [rng.random() for _ in range(40)]  # uniform: a third of tasks flip between runs
        incumbent, candidate = (
            {f"t{i}": [float(rng.random() < p) for _ in range(CONFIG.stages[-1])] for i, p in enumerate(rates)}
            for _ in range(2)
        )
        verdicts = evaluate(incumbent, lambda n: {t: r[:n] for t, r in candidate.items()}, CONFIG)
        accepted += verdicts[-1].decision == "accept"
    rate, se = accepted / decisions, math.sqrt(CONFIG.alpha * (1 - CONFIG.alpha) / decisions)
    assert rate <= CONFIG.alpha + 3 * se


def test_an_accept_never_quotes_a_bound_that_contradicts_it():
    """Five tasks all better, one by a lot: the permutation test accepts (p = 1/32) while the
    t-approximation's lower bound is negative; the verdict must not say both."""
    from evolver.gate import GateConfig, decide

    incumbent = {f"t{i}": [0.0] for i in range(5)}
    candidate = {"t0": [1.0], **{f"t{i}": [0.05] for i in range(1, 5)}}
    verdict = decide(incumbent, candidate, GateConfig(stages=(1,), futility=()), stage=0)
    assert verdict.decision == "accept" and verdict.ci_low < 0
    assert "lower bound" not in verdict.reason and "(permutation test)" in verdict.reason
