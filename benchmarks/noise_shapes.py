"""What benchmarks/gate_power.py and benchmarks/compare_power.py share: the noise shapes that draw the
tasks' pass rates (described in gate_power.py), and the fixed-size test's size at a given power."""

from __future__ import annotations

import math
import random

NULL_SHARE = 3  # no-op cells run this many times the decisions: they are cheap and carry the main claim
STEADY = 1e-4  # the closest a drawn pass rate gets to 0 or 1 (logits stay finite)


def shape_rates(rng: random.Random, shape: str, tasks: int, given: list[float] | None) -> list[float]:
    def clip(p: float) -> float:
        return min(max(p, STEADY), 1 - STEADY)

    if shape == "bimodal":
        return [clip(rng.betavariate(0.3, 0.3)) for _ in range(tasks)]
    if shape == "coin flips":
        return [0.5] * tasks
    if shape == "30% fixed":
        fixed = round(0.3 * tasks)
        return [clip(rng.random()) for _ in range(tasks - fixed)] + [clip(float(i % 2)) for i in range(fixed)]
    if shape.startswith("from "):
        return list(given)
    return [clip(rng.random()) for _ in range(tasks)]


def drift_of(shape: str) -> float:
    return float(shape.split("+")[1]) / 100 if shape.startswith("drift") else 0.0


def cut(table: dict, n: int) -> dict:
    return {t: r[:n] for t, r in table.items()}


def interpolated_size(power_by_size: dict[int, float], power: float) -> float:
    """Trials per arm a fixed test needs for `power`, interpolated between whole counts (its power is concave
    in size, so this is generous to it)."""
    previous_n, previous_power = 0, 0.0
    for n, p in power_by_size.items():
        if p >= power:
            return previous_n + (n - previous_n) * (power - previous_power) / (p - previous_power)
        previous_n, previous_power = n, p
    return math.inf
