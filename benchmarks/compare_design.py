"""Where `evolver compare`'s spending shapes come from, and how far early stopping can go at all.

    python benchmarks/compare_design.py [--looks 4.3,6.5,10]

On the normal model of a group-sequential test (a Brownian motion in information, looks every
1/L of the information a fixed-size test needs for 80% power at the effect; two-sided alpha 0.05),
for each L:

  optimum    the Bayes-optimal two-sided design for expected trials at the effect (backward
             induction; the costs of each error tuned until alpha is 0.05 and power 0.80): no
             design with these looks needs fewer trials on average there
  compare    the spending design of gate/compare.py (alpha and beta spent log-logistically in
             the information share tau, everything spent at tau 2): its power, its expected
             trials at the effect and at no effect, over a fixed-size test's
  Wald       the sequential probability ratio test looking after every trial (the limit of
             any design), from Wald's approximation
  cap        what the optimum loses when it must decide by 1.5x or 2x a fixed-size test's
             information (compare stops at 2x), at the middle L

With --fit the spending shapes are fitted again (Nelder-Mead over the two shapes, the mean ratio
at L = 4.3, 6.5 and 10, power held at 0.80 or more): gate/compare.py's constants are its result,
rounded. L for 40 tasks: about 6.5 with uniform pass rates, 10 with coin flips, 4.3 when most
tasks nearly always pass or fail.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from evolver.evolution.gate.compare import ALPHA_SHAPE, BETA_SHAPE, MOST  # noqa: E402

ALPHA, BETA = 0.05, 0.20
DRIFT = norm.ppf(1 - ALPHA / 2) + norm.ppf(1 - BETA)  # a fixed-size test's z at the effect
UNCAPPED = 3.0  # the optimum decides well before 3x a fixed-size test's information: a cap there changes nothing


def fixed_share(power: float) -> float:
    """The information a fixed-size test needs for ``power``, over what it needs for 1 - BETA."""
    return ((norm.ppf(1 - ALPHA / 2) + norm.ppf(power)) / DRIFT) ** 2


def spent(tau: float, shape: tuple[float, float]) -> float:
    half, steep = shape
    return 1.0 if tau >= MOST - 1e-9 else tau**steep / (tau**steep + half**steep)


def spending_design(looks: float, alpha_shape, beta_shape, step: float = 0.03) -> dict:
    """Power and expected information (over a fixed-size test's) of the two-sided spending design with an
    inner no-evidence wedge, by numerical integration on a grid of the score statistic."""
    theta = DRIFT / np.sqrt(looks)  # the score's drift per look; each look adds information 1
    last = int(np.ceil(MOST * looks - 1e-9))
    x = np.arange(-9 * np.sqrt(last) - theta * last, 9 * np.sqrt(last) + theta * last + step / 2, step)
    kernel = norm.pdf(np.arange(-int(7 / step), int(7 / step) + 1) * step) * step
    density = {0: norm.pdf(x, 0, 1) * step, 1: norm.pdf(x, theta, 1) * step}
    called = {0: 0.0, 1: 0.0}
    futile = 0.0
    expected = {0: 0.0, 1: 0.0}
    for k in range(1, last + 1):
        if k > 1:
            density = {
                0: np.convolve(density[0], kernel, "same"),
                1: np.interp(x - theta, x, np.convolve(density[1], kernel, "same"), left=0, right=0),
            }
        for h in (0, 1):
            expected[h] += density[h].sum()
        tau = k / looks
        tail = np.cumsum(density[0][::-1])[::-1]
        side = (ALPHA * spent(tau, alpha_shape) - called[0]) / 2
        upper = max(x[np.searchsorted(-tail, -side)], 0.0) if side > 0 else np.inf
        if k == last:
            wedge = upper
        else:
            inside = np.cumsum(np.where(x > -upper, density[1], 0.0))
            left = BETA * spent(tau, beta_shape) - futile
            at = np.searchsorted(inside, left, side="right")
            wedge = min(x[at - 1] if at > 0 and left > 0 else -np.inf, upper)
        called[0] += density[0][np.abs(x) >= upper].sum()
        called[1] += density[1][x >= upper].sum()
        futile += density[1][np.abs(x) < wedge].sum() if wedge > 0 else 0.0
        going = (np.abs(x) < upper) & ~(np.abs(x) < wedge)
        density = {h: np.where(going, d, 0.0) for h, d in density.items()}
        if k == last or wedge >= upper:
            break
    return {"power": called[1], "alpha": called[0], "at effect": expected[1] / looks, "at none": expected[0] / looks}


def optimum(looks: float, cost_alpha: float, cost_beta: float, cap: float, step: float = 0.04) -> dict:
    """The Bayes design minimising expected information at +-effect + cost_alpha P0(call) + cost_beta P(miss),
    with every decision taken by ``cap`` times a fixed-size test's information."""
    theta = DRIFT / np.sqrt(looks)
    last = int(np.ceil(cap * looks - 1e-9))
    x = np.arange(-9 * np.sqrt(last) - theta * last, 9 * np.sqrt(last) + theta * last + step / 2, step)
    kernel = norm.pdf(np.arange(-int(7 / step), int(7 / step) + 1) * step) * step
    risk, actions = None, []
    for k in range(last, 0, -1):  # in units of the no-effect density: up, down, no evidence, go on
        up_ratio, down_ratio = np.exp(theta * x - theta**2 * k / 2), np.exp(-theta * x - theta**2 * k / 2)
        either = (up_ratio + down_ratio) / 2
        go_on = np.full_like(x, np.inf) if risk is None else either + np.convolve(risk, kernel, "same")
        costs = np.vstack([cost_alpha + cost_beta * down_ratio / 2, cost_alpha + cost_beta * up_ratio / 2, cost_beta * either, go_on])
        actions.append(np.argmin(costs, axis=0))
        risk = costs.min(axis=0)
    actions.reverse()
    out = {}
    for h in (0, 1):
        density, expected, called = norm.pdf(x, theta * h, 1) * step, 0.0, 0.0
        for k, act in enumerate(actions, 1):
            expected += density.sum()
            called += density[(act == 0) | (act == 1) if h == 0 else act == 0].sum()
            density = np.where(act == 3, density, 0.0)
            if k < last:
                density = np.convolve(density, kernel, "same")
                density = np.interp(x - theta, x, density, left=0, right=0) if h else density
        out[h] = (called, expected / looks)
    return {"alpha": out[0][0], "power": out[1][0], "at effect": out[1][1], "at none": out[0][1]}


def tuned_optimum(looks: float, cap: float = UNCAPPED) -> dict:
    """optimum() with its costs bisected until alpha is 0.05 and power 0.80."""

    def for_beta(cost_beta: float) -> dict:
        low, high = np.log(2.0), np.log(5000.0)
        for _ in range(18):
            middle = (low + high) / 2
            low, high = (middle, high) if optimum(looks, np.exp(middle), cost_beta, cap)["alpha"] > ALPHA else (low, middle)
        return optimum(looks, np.exp(high), cost_beta, cap)

    low, high = np.log(0.5), np.log(200.0)
    for _ in range(13):
        middle = (low + high) / 2
        low, high = (middle, high) if for_beta(np.exp(middle))["power"] < 1 - BETA else (low, middle)
    return for_beta(np.exp(high))


def wald() -> float:
    """Expected information at the effect of Wald's test (one side at alpha / 2, power 1 - BETA), over a fixed-size test's."""
    a = ALPHA / 2
    return 2 * ((1 - BETA) * np.log((1 - BETA) / a) + BETA * np.log(BETA / (1 - a))) / DRIFT**2


def fit(grid: tuple[float, ...]) -> tuple[tuple[float, float], tuple[float, float]]:
    def score(p) -> float:
        if min(p) <= 0:
            return 9.0
        ratios = []
        for looks in grid:
            r = spending_design(looks, (p[0], p[1]), (p[2], p[3]), step=0.05)
            ratios.append(r["at effect"] / fixed_share(min(r["power"], 1 - BETA)) + 20 * max(0.0, 1 - BETA - r["power"]))
        return float(np.mean(ratios))

    best = minimize(score, [*ALPHA_SHAPE, *BETA_SHAPE], method="Nelder-Mead", options={"maxiter": 200, "xatol": 1e-3, "fatol": 1e-4})
    return (best.x[0], best.x[1]), (best.x[2], best.x[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--looks", default="4.3,6.5,10", help="looks per fixed-size test's information (comma-separated)")
    parser.add_argument("--fit", action="store_true", help="fit the spending shapes again")
    args = parser.parse_args()
    grid = tuple(float(v) for v in args.looks.split(","))
    shapes = fit(grid) if args.fit else (ALPHA_SHAPE, BETA_SHAPE)
    print(
        f"alpha {ALPHA} two-sided, power {1 - BETA:.2f} at the effect; spending shapes (half-way tau, steepness): alpha "
        f"{tuple(round(float(v), 2) for v in shapes[0])}, beta {tuple(round(float(v), 2) for v in shapes[1])}, all spent at tau {MOST}"
    )
    print(f"Wald's test, looking after every trial: {wald():.3f} of a fixed-size test's trials at the effect\n")
    print(
        "| looks per fixed test | optimum: trials at effect (at none) | compare's shape: power | trials at effect (at none) "
        "| over a fixed test at its power |"
    )
    print("|---|---|---|---|---|")
    for looks in grid:
        best, ours = tuned_optimum(looks), spending_design(looks, *shapes)
        print(
            f"| {looks:g} | {best['at effect']:.3f} ({best['at none']:.3f}) | {ours['power']:.3f} | {ours['at effect']:.3f} "
            f"({ours['at none']:.3f}) | {ours['at effect'] / fixed_share(ours['power']):.3f} |"
        )
    middle = grid[len(grid) // 2]
    free = tuned_optimum(middle)["at effect"]
    print(
        f"\nthe optimum at {middle:g} looks, every decision taken by 1.5x / 2x a fixed-size test's information: "
        + " / ".join(f"{100 * (tuned_optimum(middle, cap)['at effect'] / free - 1):+.1f}%" for cap in (1.5, MOST))
        + f" trials at the effect over no cap ({free:.3f})"
    )


if __name__ == "__main__":
    main()
