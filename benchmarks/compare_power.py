"""How often `evolver compare` (gate/compare.py) is right, and what it costs against a fixed-size test.

    python benchmarks/gate_power.py --compare [--decisions 400] [--seed 1] [--jobs 1] [--tasks 40]

Per noise shape (gate_power.py's; "look drift +d": both arms move d points at every look) and true effect
(0, +/-5, +/-10, +/-15 points, a common logit shift), how often compare calls B better and worse, and the
simulations it spends, both arms and errors counted. "exact": the mean over the no-op decisions of the
design's exact chance of calling a no-op anything given the pooled results it saw (sequential.plan's error),
at most alpha by construction; the simulated share scatters around it. The fixed-size test is compare's exact
test run once on n trials per task of each arm, in one window with no drift; its n for the power compare has
at +/-10 points is interpolated between whole counts, on the same draws (common random numbers), and "ratio"
is compare's simulations over its, with a bootstrap interval over decisions.
"""

from __future__ import annotations

import math
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from benchmarks.noise_shapes import NULL_SHARE, cut, drift_of, interpolated_size, shape_rates  # noqa: E402
from evolver.evolution.gate import shift_rates  # noqa: E402
from evolver.evolution.gate.compare import CompareConfig, run_compare  # noqa: E402
from evolver.evolution.gate.sequential import plan, windows  # noqa: E402

COMPARE_EFFECTS = (0.0, 0.05, -0.05, 0.10, -0.10, 0.15, -0.15)
COMPARE_SHAPES = ("uniform", "bimodal", "coin flips", "30% fixed", "10% errors", "look drift +2", "look drift +5", "look drift +10")


def compare_cell(job: tuple) -> dict:
    """One shape and true effect, per decision: compare's verdict, its simulations (both arms, errors
    included) and looks; at +/-10 points also whether the fixed-size test rejects at each size. Common
    random numbers: the fixed test's trials are the comparison's own (the same uniforms against the rates
    without drift), so their powers are compared on the same luck."""
    shape, effect, decisions, seed, args = job
    rng = random.Random(f"compare {seed} {shape} {effect}")
    uniforms = np.random.default_rng(rng.getrandbits(64))
    config = CompareConfig()
    drift = drift_of(shape)  # between looks: every window moves both arms by the drift
    missing = 0.1 if shape == "10% errors" else 0.0
    looks, tasks = config.max_trials, args["tasks"]
    out: dict = {"decision": [], "sims": [], "looks": [], "fixed": [], "error": []}
    for _ in range(decisions):
        rates = np.array(shape_rates(rng, shape.replace("look ", ""), tasks, args["rates"]))
        better = np.array(shift_rates(list(rates), effect)) if effect else rates
        now, moved = rates[:, None], better[:, None]  # tasks x looks, broadcast when nothing drifts
        if drift:
            now = np.array([shift_rates(list(rates), drift * j) for j in range(looks)]).T
            moved = np.array([shift_rates(list(now[:, j]), effect) if effect else now[:, j] for j in range(looks)]).T
        u_a, u_b = uniforms.random((tasks, looks)), uniforms.random((tasks, looks))
        lost_a, lost_b = uniforms.random((tasks, looks)) < missing, uniforms.random((tasks, looks)) < missing

        def table(u, rates_now, lost) -> dict:
            return {
                f"t{i}": [None if gone else float(x) for x, gone in zip(row, lost_row)]
                for i, (row, lost_row) in enumerate(zip(u < rates_now, lost))
            }

        a, b = table(u_a, now, lost_a), table(u_b, moved, lost_b)
        verdict = run_compare(a, b, config)
        if not effect:  # the design's exact chance of calling a no-op anything, given these pooled results
            out["error"].append(plan(windows(a, b, config.stages, config.settle), config.spending(), looks - 1, stop=False)[-1].error)
        out["decision"].append(verdict.decision)
        out["sims"].append(verdict.n_a_sims + verdict.n_b_sims)
        out["looks"].append(verdict.look + 1)
        if abs(effect) == 0.10:  # one window, no drift: generous to the fixed test
            a, b = table(u_a, rates[:, None], lost_a), table(u_b, better[:, None], lost_b)
            out["fixed"].append([fixed_rejects(cut(a, n), cut(b, n), config) for n in config.stages])
    return out


def fixed_rejects(a: dict, b: dict, config: CompareConfig) -> bool:
    """The fixed-size test at the same alpha: compare's exact test on one window, all of a task's trials in
    one block (the sum of B's passes given each task's pooled passes: the most powerful for a common shift,
    and exact), two-sided with alpha/2 a tail."""
    [look] = plan(windows(a, b, (max(map(len, a.values())),)), config.spending(), last=0)
    return look.decision() in ("better", "worse")


def compare_row(shape: str, cells: dict, config: CompareConfig, tasks: int, rng: np.random.Generator) -> str:
    """The table's row of one shape; the ratio's 95% interval by bootstrap over decisions."""

    def share(effect: float, words: tuple[str, ...]) -> float:
        return float(np.mean([d in words for d in cells[effect]["decision"]]))

    wrong = share(0.0, ("better", "worse"))
    right = {e: share(e, ("better",) if e > 0 else ("worse",)) for e in COMPARE_EFFECTS if e}
    sims = {e: float(np.mean(cells[e]["sims"])) for e in COMPARE_EFFECTS}
    arms = [
        (
            np.array([d == ("better" if e > 0 else "worse") for d in cells[e]["decision"]]),
            np.array(cells[e]["sims"]),
            np.array(cells[e]["fixed"]),
        )
        for e in (0.10, -0.10)
    ]

    def ratio(picks: list) -> tuple[float, float, float]:
        power = np.mean([called[i].mean() for (called, _, _), i in zip(arms, picks)])
        spent = np.mean([used[i].mean() for (_, used, _), i in zip(arms, picks)])
        curve = np.mean([fixed[i].mean(axis=0) for (_, _, fixed), i in zip(arms, picks)], axis=0)
        size = 2 * tasks * interpolated_size(dict(zip(config.stages, curve)), power)
        return spent / size, power, size

    whole = [np.arange(len(called)) for called, _, _ in arms]
    point, _, size = ratio(whole)
    boot = sorted(ratio([rng.integers(0, len(i), len(i)) for i in whole])[0] for _ in range(400))
    looks = sorted(cells[0.10]["looks"] + cells[-0.10]["looks"])
    exact = float(np.mean(cells[0.0]["error"]))
    return (
        f"| {shape} | {wrong:.3f} ({exact:.4f}) | {right[-0.15]:.3f} | {right[-0.10]:.3f} | {right[-0.05]:.3f} | {right[0.05]:.3f} | {right[0.10]:.3f} "
        f"| {right[0.15]:.3f} | {sims[0.0]:.0f} | {(sims[0.10] + sims[-0.10]) / 2:.0f} | {looks[len(looks) // 2]}, "
        f"{looks[int(0.9 * len(looks))]} | {size:.0f} | {point:.2f} ({boot[10]:.2f}-{boot[389]:.2f}) |"
    )


def run_compare_table(args, shared: dict) -> None:
    jobs = [
        (shape, e, args.decisions * (NULL_SHARE if e == 0 else 1), args.seed, shared) for shape in COMPARE_SHAPES for e in COMPARE_EFFECTS
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        cells = dict(zip(((j[0], j[1]) for j in jobs), pool.map(compare_cell, jobs, chunksize=1)))
    config = CompareConfig()
    null = NULL_SHARE * args.decisions
    print(
        f"evolver compare, two-sided: {shared['tasks']} tasks; alpha {config.alpha}, sized for {config.power:.0%} power at "
        f"{100 * config.effect:g} points; a look per trial per task, at most {config.max_trials}; {args.decisions} decisions per cell "
        f"(2 SE of a power near 0.8: {2 * math.sqrt(0.16 / args.decisions):.3f}), {null} with no effect (2 SE near 0.05: "
        f"{2 * math.sqrt(0.05 * 0.95 / null):.3f}); seed {args.seed}"
    )
    print("'look drift +d': both arms move d points at every look (the fixed test gets one window, no drift)\n")
    print(
        "| shape | no-op called better or worse (exact) | -15 worse | -10 worse | -5 worse | +5 better | +10 better | +15 better "
        "| sims (no-op) | sims (+/-10) | looks (+/-10: median, 90th pct) | fixed-size test's sims at the same power (+/-10) "
        "| ratio (95% interval) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(args.seed)
    for shape in COMPARE_SHAPES:
        print(compare_row(shape, {e: cells[(shape, e)] for e in COMPARE_EFFECTS}, config, shared["tasks"], rng))
