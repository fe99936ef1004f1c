"""The run's gate policies (evolver.evolution.gate.search) and the run-level benchmark (benchmarks/search.py).

The audited policy's promise is about the run: it ends worse than it began at most alpha of the time,
because its audit keeps the best only when a one-sided comparison with the base, on fresh trials side
by side, says "better". The held-out check below draws audits of a best that is no better than the
base, with the whole task set drifting between looks, and counts how often one holds.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import binom

from evolver.evolution.gate import GateConfig, Stage, shift_rates
from evolver.evolution.gate.search import AuditLook, audit_holds, evaluate_audit, judge_iteration, make_policy, recorded_policy

ROOT = Path(__file__).resolve().parent.parent
AUDITED = make_policy("audited", dataclasses.replace(GateConfig(), permutations=1000))


def draw(rng: random.Random, rates: list[float], n: int) -> dict[str, list[float]]:
    return {f"t{i}": [float(rng.random() < p) for _ in range(n)] for i, p in enumerate(rates)}


def driven(rng: random.Random, incumbent: list[float], candidates: dict[str, list[float]], most: int = 8):
    """A run(stage) over fixed arms: the incumbent's and each candidate's trials, drawn once and cut per stage."""
    inc, arms, asked = draw(rng, incumbent, most), {n: draw(rng, r, most) for n, r in candidates.items()}, []

    def run(stage: Stage):
        asked.append((stage.index, stage.incumbent_trials, stage.candidate_trials, stage.alive))
        return (
            {t: r[: stage.incumbent_trials] for t, r in inc.items()},
            {n: {t: r[: stage.candidate_trials] for t, r in arms[n].items()} for n in stage.alive},
        )

    return run, asked


def test_the_policies_are_named_recorded_and_rebuilt_as_recorded():
    gate = GateConfig(alpha=0.05)
    decision, audited = make_policy("per-decision", gate), make_policy("audited", gate)
    assert decision.gate == gate and decision.audit is None and decision.fresh_reference
    assert audited.gate.alpha == 0.2 and audited.gate.stages == (1, 2, 4) and audited.audit.alpha == 0.05 and not audited.fresh_reference
    # gate_alpha is the run's bound under the audited policy; configured stages are kept
    custom = make_policy("audited", GateConfig(alpha=0.1, stages=(1, 2), futility=(0.0,)))
    assert custom.audit.alpha == 0.1 and custom.gate.alpha == 0.2 and custom.gate.stages == (1, 2)
    for policy in (decision, audited):
        assert recorded_policy(json.loads(json.dumps(policy.to_json())), {}) == policy
    # a run from before the policies recorded only its gate: it goes on per decision with that gate
    assert recorded_policy({}, dataclasses.asdict(gate)) == decision
    with pytest.raises(ValueError, match="unknown gate policy"):
        make_policy("lucky", gate)


def test_a_screen_against_the_incumbents_history_stops_losers_alone_and_sends_the_best_on_fresh_trials():
    rng = random.Random(7)
    rates = [rng.uniform(0.2, 0.8) for _ in range(40)]
    history = draw(rng, rates, 4)
    worse, better = [p * 0.3 for p in rates], shift_rates(rates, 0.25)
    run, asked = driven(rng, rates, {"a": worse, "b": better, "c": worse})
    seen = []
    verdicts = judge_iteration(AUDITED, ["a", "b", "c"], run, reference=history, on_stage=lambda stage, v: seen.append((stage.index, v)))
    assert asked[0] == (0, 0, 1, ("a", "b", "c"))  # the screen: one trial each, the incumbent not run
    assert all(alive == ("b",) for *_, alive in asked[1:])
    assert [a[1:3] for a in asked[1:]] == [(1, 2), (2, 3), (4, 5)][: len(asked) - 1]  # fresh trials after the screen's
    screen = verdicts[0]
    assert screen.alive == ("b",) and not screen.decided
    assert {n: v.decision for n, v in screen.verdicts.items()} == {"a": "reject", "b": "continue", "c": "reject"}
    assert screen.verdicts["a"].reason.startswith("Screened out")
    assert verdicts[-1].kept == "b" and verdicts[-1].stage == len(verdicts) - 1
    assert verdicts[-1].verdicts["b"].n_candidate_sims == 40 * 5  # the screen's trial counted with the gate's
    assert [i for i, _ in seen] == list(range(len(verdicts))) and [v for _, v in seen] == verdicts
    # replayed on the same tables, the same verdicts (a killed run resumes to the same decisions)
    assert judge_iteration(AUDITED, ["a", "b", "c"], run, reference=history) == verdicts


def test_a_screen_that_none_passes_decides_at_once():
    rng = random.Random(3)
    rates = [rng.uniform(0.3, 0.9) for _ in range(40)]
    run, asked = driven(rng, rates, {"a": [p * 0.2 for p in rates]})
    [verdict] = judge_iteration(AUDITED, ["a"], run, reference=draw(rng, rates, 3))
    assert verdict.decided and verdict.kept is None and len(asked) == 1 and "none reached" in verdict.reason


def audit_of(rng: random.Random, base: list[float], best: list[float], drift: float):
    """One audit of arms at these rates, each look in a window of its own moved by a random drift."""
    tables = {"base": {}, "best": {}}

    def run(look: AuditLook):
        move = rng.uniform(-drift, drift)
        for side, rates in (("base", base), ("best", best)):
            now = shift_rates(rates, move) if move else rates
            have = len(next(iter(tables[side].values()), []))
            extra = draw(rng, now, look.trials - have)
            tables[side] = {t: [*tables[side].get(t, []), *extra[t]] for t in extra}
        return tables["base"], tables["best"]

    return evaluate_audit(AUDITED, run)


def test_the_audit_keeps_a_real_gain_and_stops_early_when_it_is_large():
    rng = random.Random(11)
    rates = [min(max(rng.random(), 0.02), 0.98) for _ in range(40)]
    looks = audit_of(rng, rates, shift_rates(rates, 0.25), drift=0.0)
    assert audit_holds(looks) and len(looks) < len(AUDITED.audit.stages)


def mixed(rates: list[float]) -> list[float]:
    """A best that helps six tasks and breaks six others by as much: about the base's mean, with effects of both signs."""
    out = list(rates)
    for i in range(6):
        out[i] = min(0.999, out[i] + 0.3)
        out[-1 - i] = max(0.001, out[-1 - i] - 0.32)
    return out


# Held-out audits: enough that the exact binomial bound below tells an audit that holds at alpha from one at twice alpha.
AUDITS = 1500
RARE = 0.001  # how rarely an audit at alpha exceeds the bound, and how rarely one at twice alpha stays within it


def test_held_out_an_audit_keeps_a_best_no_better_than_the_base_at_most_alpha_of_the_time_under_drift():
    """The bound of the audited policy: 1,500 audits of a best no better than the base (every other one a no-op, the
    others a mixed change, the case where the permutation test is only approximate), every look in its own window
    drifting by up to 10 points, tau2-like pass rates (a third near 0, a third near 1, a third between). The count that
    held may exceed alpha's share only as far as an audit at alpha exceeds it one time in a thousand (the exact binomial
    tail); the audits are enough that an audit at twice alpha stays within that one time in a thousand too."""
    alpha = AUDITED.audit.alpha
    bound = binom.isf(RARE, AUDITS, alpha)  # at alpha, more than this many hold with probability RARE at most
    assert binom.cdf(bound, AUDITS, 2 * alpha) <= RARE  # sized: at twice alpha, this few hold with probability RARE at most
    rng = random.Random(20261126)
    held = 0
    for i in range(AUDITS):
        rates = [rng.uniform(0.001, 0.1), rng.uniform(0.9, 0.999), rng.uniform(0.1, 0.9)] * 13 + [rng.uniform(0.1, 0.9)]
        rng.shuffle(rates)
        held += audit_holds(audit_of(rng, rates, rates if i % 2 else mixed(rates), drift=0.10))
    assert held <= bound, f"{held} of {AUDITS} audits held a best no better than the base: more than alpha = {alpha} allows ({bound:.0f})"


def test_the_run_level_benchmark_runs_quick_and_prints_every_cell():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "search.py"), "--quick", "--budgets", "500,1000", "--jobs", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line and not line.startswith(("world", "#"))]
    strategies = {" ".join(r[1:-11]) for r in rows}
    own = {"evolver defaults", "auto-harness stall 5"}  # each with its own stop rule, no budget
    assert {"per-decision K=1", "audited K=1", "population K=4", "auto-harness", "gepa-like"} | own <= strategies
    assert len(rows) == 6 * ((len(strategies) - len(own)) * 2 + len(own))  # every world, strategy and budget
    assert {r[-11] for r in rows if " ".join(r[1:-11]) in own} == {"own"}
    assert all(0 <= float(r[-3]) <= 1 for r in rows)  # the share of runs that ended worse
    # a proposal priced by the dry-run estimator (gpt-4.1) against a retail simulation (gpt-4.1-mini), its tries charged
    assert "# a proposal costs 3.00 simulations; each of evolver's charges 3 try simulations" in proc.stdout


def test_the_benchmark_refuses_an_unknown_world_in_one_line():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search.py"), "--worlds", "atlantis"], capture_output=True, text=True)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "atlantis" in proc.stderr and not proc.stdout
