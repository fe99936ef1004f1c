"""What a run's configuration asks of the evolution side: the gate's parameters and the most
simulations the run can take (its cost bound, which `evolver run` estimates up front, the loop
re-prices from its baseline and `evolver status` shows as planned).

Here, not in evolver.config, because both read the gate (evolver.evolution.gate), and the shared
configuration does not import the evolution side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from evolver.config import Config
from evolver.data import RoleUsage
from evolver.errors import UsageError

# Of a candidate's full gate, what candidates spend on average: benchmarks/gate_power.py's mix of -10, 0,
# +5 and +10 point candidates at the default stages (docs/gate.md, the "sims" column: 135 of 240). A
# single-stage gate stops nothing early.
GATE_SHARE = 0.56
# The audit's expected trials per task of each arm: the best it audits was kept on evidence, so its first
# or second look (1 or 2 trials) usually decides. An assumption, not a measurement (a large gain stops at
# the first: tests/test_compare.py's dry-run check); the budget checks hold a run to the audit's most.
AUDIT_TRIALS = 1.5
# The meta-LLM's side of a request, before any is measured: its prompt and its answer, in about this split (each
# proposer kind says how many such requests, or what share of its budget, a proposal takes: Proposer.meta_tokens).
PROMPT_SHARE = 0.9
# The population search, expected: its parent runs this many minibatches an iteration (one it passes whole is drawn
# again; at a pass rate of 0.6 about 1 in 5 is), and of its children this share passes the screen, and of those this
# share the first part of the gate (benchmarks/search.py's large world: 0.31 and 0.66; barren and small: 0.23 and
# 0.57). Assumptions for a real proposer, not measurements of one.
DRAWS_EXPECTED, SCREEN_PASS, PART_PASS = 1.25, 0.3, 0.65
# Of the investigating proposer's prompt tokens, the share its provider reads from its prompt cache: the least of
# the three providers measured on a 16-turn proposal (benchmarks/prompt_cost.py, docs/models.md: 85-89%).
CACHED_SHARE = 0.85


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


def policy_of(cfg: Config):
    """The run's gate policy (evolver.evolution.gate.search) around the gate's parameters."""
    from evolver.evolution.gate.search import make_policy

    return make_policy(cfg.gate_policy, gate_config(cfg))


def proposer_budget(cfg: Config):
    """What one proposal may spend (evolver.evolution.proposers.Budget) under this configuration."""
    from evolver.evolution.proposers import Budget
    from evolver.kinds import PROPOSERS

    tries = cfg.proposer_tries if "proposer_tries" in PROPOSERS[cfg.proposer].settings else 0  # a kind that runs no tries
    return Budget(turns=cfg.proposer_turns, tokens=cfg.proposer_tokens, tries=tries, seconds=cfg.proposer_seconds)


def max_simulations(
    cfg: Config,
    n_analysis: int,
    n_gate: int,
    n_holdout: int,
    *,
    iterations: int,
    baseline: bool = True,
    gate_share: Optional[float] = None,
    gate_trials: Optional[int] = None,
) -> int:
    """The most simulations a run can take: per iteration each candidate's smoke test (and, with
    several, their screen), the full gate of one candidate and of the incumbent beside it, at
    the longest the gate may be sized to, a fresh reference (if the policy takes one) and analysis
    for a new incumbent; plus the baseline, the audit (if the policy has one) and the holdout."""
    from evolver.evolution.gate import MOST_STRETCH
    from evolver.evolution.gate.search import audit_cost

    policy = policy_of(cfg)
    if policy.population is not None:
        return _population_simulations(
            cfg, policy, n_analysis, n_gate, n_holdout, iterations=iterations, baseline=baseline, expected=gate_share is not None
        )
    gate = policy.gate
    longest = math.ceil(gate.stages[-1] * (MOST_STRETCH if policy.fresh_reference else 1))
    screen = 1 if policy.screen_bar is not None else gate.screen if cfg.candidates > 1 else 0  # trials per task of each candidate alone
    reference = n_gate * policy.reference_trials
    holdout = 2 * n_holdout * cfg.holdout_trials
    # each candidate's try simulations (the agent proposer), smoke test and, with several, screen
    if gate_share is not None:  # what is expected: the gate unstretched, its usual share of it, and no keep (no fresh reference)
        trials = gate_trials or gate.stages[-1]  # the gate sized to the noise, when it is known
        per_iteration = cfg.candidates * (proposer_budget(cfg).tries + 1 + n_gate * screen) + 2 * n_gate * trials * gate_share
        # the audit is a staged test too: it stops early on what is clear either way, as the gate does
        end = (2 * n_gate * AUDIT_TRIALS if policy.audit else 0) + holdout
        return math.ceil((n_analysis * cfg.analysis_trials + reference if baseline else 0) + iterations * per_iteration + end)
    end = audit_cost(policy, n_gate) + holdout
    fresh = reference if policy.fresh_reference else 0
    per_iteration = (
        cfg.candidates * (proposer_budget(cfg).tries + 1 + n_gate * screen)
        + 2 * n_gate * longest
        + fresh
        + n_analysis * cfg.analysis_trials
    )
    start = n_analysis * cfg.analysis_trials + reference if baseline else 0
    return start + iterations * per_iteration + end


def _population_simulations(
    cfg: Config, policy, n_analysis: int, n_gate: int, n_holdout: int, *, iterations: int, baseline: bool, expected: bool
) -> int:
    """max_simulations under the population search: per iteration the parent's minibatches, and per child its
    proposer's tries, its screen (the minibatch, no try assumed reused) and its gate trials (all of them at most;
    expected, the shares that pass the screen and the first part); plus the baseline, the audit and the holdout."""
    from evolver.evolution.gate.search import audit_cost

    pop = policy.population
    first, second = (len(part) for part in pop.parts([str(i) for i in range(n_gate)]))
    gate = pop.gate_trials * ((first + PART_PASS * second) * SCREEN_PASS if expected else n_gate)
    parent = pop.minibatch * (DRAWS_EXPECTED if expected else pop.draws)
    per_iteration = parent + cfg.candidates * (proposer_budget(cfg).tries + pop.minibatch + gate)
    start = n_analysis * cfg.analysis_trials + n_gate * policy.reference_trials if baseline else 0
    audit = 2 * n_gate * AUDIT_TRIALS if expected else audit_cost(policy, n_gate)
    return math.ceil(start + iterations * per_iteration + audit + 2 * n_holdout * cfg.holdout_trials)


@dataclass(frozen=True)
class Forecast:
    """What a run (or the rest of it) is expected to take, and the most it can take."""

    simulations: int
    simulations_most: int
    proposals: int  # the meta model's proposals, at most (every iteration's candidates)
    # role -> (tokens expected, tokens at most, dollars expected, dollars at most); dollars None: no known price
    roles: dict[str, tuple[int, int, Optional[float], Optional[float]]]
    # the meta role's dollars (expected, at most) with CACHED_SHARE of its prompt read from the provider's cache; None
    # where the proposer resends no growing conversation or the price is unknown
    meta_cached: Optional[tuple[float, float]] = None

    def dollars(self, most: bool = False) -> Optional[float]:
        values = [v[3 if most else 2] for v in self.roles.values()]
        return None if any(v is None for v in values) else sum(values)

    def tokens(self, most: bool = False) -> int:
        return sum(v[1 if most else 0] for v in self.roles.values())


def forecast(
    cfg: Config,
    n_analysis: int,
    n_gate: int,
    n_holdout: int,
    *,
    iterations: int,
    per_simulation: dict[str, RoleUsage],
    meta_price: Optional[tuple[float, float]],
    meta_prompt_tokens: int,
    baseline: bool = True,
    noise: Optional[dict] = None,
    meta_cached_prompt_price: Optional[float] = None,
) -> Forecast:
    """Simulations expected and at most, and per role the tokens and dollars: the simulated roles at
    ``per_simulation`` (what one simulation used, measured on a pilot or the baseline; a role whose
    tokens had no known price costs None, never $0), the meta-LLM at ``meta_price`` (dollars per
    prompt and per completion token, None: unknown) for each proposal; and the investigating proposer's
    also with its prompt at ``meta_cached_prompt_price`` (dollars per prompt token with CACHED_SHARE of it
    read from the cache)."""
    args = (cfg, n_analysis, n_gate, n_holdout)
    stages = tuple(cfg.gate_stages) or (1, 2, 3, 4, 6)
    # ``noise``: rewards by task (the reference, or a pilot's), to size the gate as a run will (gate.sized)
    trials = None
    if noise:
        from evolver.evolution.gate.search import iteration_gate

        trials = iteration_gate(policy_of(cfg), noise).stages[-1]
    expected = max_simulations(
        *args, iterations=iterations, baseline=baseline, gate_share=GATE_SHARE if len(stages) > 1 else 1.0, gate_trials=trials
    )
    most = max_simulations(*args, iterations=iterations, baseline=baseline)
    roles: dict[str, tuple[int, int, Optional[float], Optional[float]]] = {}
    for role, u in per_simulation.items():
        price = (u.cost / u.tokens) if u.priced and u.tokens else (0.0 if not u.tokens else None)
        roles[role] = (
            round(expected * u.tokens),
            round(most * u.tokens),
            None if price is None else expected * u.tokens * price,
            None if price is None else most * u.tokens * price,
        )
    from evolver.evolution.proposers import proposer_kind

    proposals, kind = iterations * cfg.candidates, proposer_kind(cfg.proposer)
    per_expected, per_most = kind.meta_tokens(cfg, meta_prompt_tokens + round(meta_prompt_tokens * (1 - PROMPT_SHARE) / PROMPT_SHARE))

    def dollars(tokens: int, prompt_price: Optional[float] = None) -> Optional[float]:
        if meta_price is None:
            return None if tokens else 0.0
        return tokens * (PROMPT_SHARE * (meta_price[0] if prompt_price is None else prompt_price) + (1 - PROMPT_SHARE) * meta_price[1])

    roles["meta"] = (proposals * per_expected, proposals * per_most, dollars(proposals * per_expected), dollars(proposals * per_most))
    cached = None
    if kind.reuses_prompt and meta_price is not None and meta_cached_prompt_price is not None:
        cached = (dollars(proposals * per_expected, meta_cached_prompt_price), dollars(proposals * per_most, meta_cached_prompt_price))
    return Forecast(simulations=expected, simulations_most=most, proposals=proposals, roles=roles, meta_cached=cached)


def meta_prompt_tokens(guide: str, repo, digest_chars: int) -> int:
    """About what one one-shot prompt holds, in tokens: the guide, agent/'s editable files, a full digest."""
    from pathlib import Path

    from evolver.evolution.noop import agent_files

    files = sum(len(data) for data in agent_files(Path(repo)).values())
    return (len(guide) + files + digest_chars) // 4
