"""The statistical acceptance gate: keep a candidate harness only on real evidence (docs/gate.md).

Pure Python and numpy, so it imports without tau2. Its modules:

    set_gate     the per-iteration set gate: GateConfig, decide_set (one stage of an iteration), set_stages
                 (its plan), evaluate_set (the stage driver the loop runs), the verdicts
    permutation  the permutation engine: block layouts, the staged and the exact p-values
    power        power and sizing: sized, noise_floor, and the noise model pass_rates, shift_rates
    search       the run's gate policy (audited, per-decision or population): what an iteration judges, and the audit
    population   the population search's decisions: a parent drawn from the pool, a child's screen, the pool's best
    compare      the two-sided staged comparison of `evolver compare` (and the audit's one-sided one)
    sequential   the exact group-sequential boundaries compare tests against
"""

from evolver.evolution.gate.power import MOST_STRETCH, noise_floor, pass_rates, shift_rates, sized
from evolver.evolution.gate.set_gate import (
    Decision,
    GateConfig,
    Regression,
    RewardTable,
    SetVerdict,
    Stage,
    Verdict,
    decide_set,
    evaluate_set,
    set_stages,
)

__all__ = [
    "Decision",
    "GateConfig",
    "MOST_STRETCH",
    "Regression",
    "RewardTable",
    "SetVerdict",
    "Stage",
    "Verdict",
    "decide_set",
    "evaluate_set",
    "noise_floor",
    "pass_rates",
    "set_stages",
    "shift_rates",
    "sized",
]
