"""What a run's configuration asks of the evolution side: the gate's parameters and the most
simulations the run can take (its cost bound, which `evolver run` estimates up front, the loop
re-prices from its baseline and `evolver status` shows as planned).

Here, not in evolver.config, because both read the gate (evolver.evolution.gate), and the shared
configuration does not import the evolution side.
"""

from __future__ import annotations

import math

from evolver.config import Config
from evolver.errors import UsageError


def gate_config(cfg: Config):
    """The gate's parameters from the configuration (defaults tuned in benchmarks/gate_power.py)."""
    from evolver.evolution.gate import GateConfig

    default = GateConfig()
    try:
        stages = tuple(int(x) for x in cfg.gate_stages) or default.stages
        # The tuned futility boundaries belong to the tuned stages; other stages reject only a negative estimate.
        futility = default.futility if stages == default.stages else tuple(0.0 for _ in stages[1:])
        return GateConfig(alpha=cfg.gate_alpha, min_effect=cfg.gate_min_effect, stages=stages, futility=futility)
    except ValueError as exc:
        raise UsageError(f"gate settings: {exc}; gate_stages are increasing trial counts such as 1,2,3,4,6") from None


def proposer_budget(cfg: Config):
    """What one proposal may spend (evolver.evolution.proposers.Budget) under this configuration."""
    from evolver.evolution.proposers import Budget

    return Budget(turns=cfg.proposer_turns, tokens=cfg.proposer_tokens, tries=cfg.proposer_tries if cfg.proposer == "agent" else 0,
                  seconds=cfg.proposer_seconds)


def max_simulations(cfg: Config, n_analysis: int, n_gate: int, n_holdout: int, *, iterations: int, baseline: bool = True) -> int:
    """The most simulations a run can take: per iteration each candidate's smoke test (and, with
    several, their screen), the full gate of one candidate and of the incumbent beside it, at
    the longest the gate may be sized to, a fresh reference and analysis for a new incumbent;
    plus the baseline and the holdout."""
    from evolver.evolution.gate import MOST_STRETCH

    gate = gate_config(cfg)
    longest = math.ceil(gate.stages[-1] * MOST_STRETCH)
    screen = gate.screen if cfg.candidates > 1 else 0
    # each candidate's try simulations (the agent proposer), smoke test and, with several, screen
    per_iteration = cfg.candidates * (proposer_budget(cfg).tries + 1 + n_gate * screen) + 2 * n_gate * longest + n_gate * gate.stages[-1] + n_analysis * cfg.analysis_trials
    start = n_analysis * cfg.analysis_trials + n_gate * gate.stages[-1] if baseline else 0
    return start + iterations * per_iteration + 2 * n_holdout * cfg.holdout_trials
