"""What a run finds for what it costs: the true gain of the harness a run ends with, and how often it ends worse.

    python benchmarks/search.py [--runs 100] [--seeds 1,2,3] [--budgets 1000,2000,4000] [--worlds large,...]
                                [--strategies ...] [--proposal-cost 3] [--tries 3] [--jobs N] [--quick]

A simulated world whose truth is known (docs/search.md says why each number is what it is):

  tasks      40 gate tasks and 40 train tasks; a third nearly always fail (pass rate ~ U(0, 0.1)), a
             third nearly always pass (U(0.9, 1)), a third in between (U(0.1, 0.9)): about a fifth of
             the tasks flip between two identical runs and two runs' scores differ by ~6 points.
  proposals  from the parent's rates: 60% change nothing; 25% break 3-8 tasks of each set (a broken
             task passes at its rate times U(0, 0.5)); 15% help: each task that can improve is fixed
             with a probability set so that, from the base, the mean rises by G points (a fixed task
             closes U(0.5, 1) of its gap to 1), and 3 in 10 helpful ones break one task of each set
             on the side. Returns diminish along a lineage: a fix closes a share of the gap left,
             and each helpful change already kept makes the next helpful proposal 10% rarer.
  worlds     large   G ~ U(5, 20) points
             small   G ~ U(0.5, 2.5) points
             drift   large, and every evaluation window moves every task by a common logit offset
                     (an AR(1) walk, step sd 0.1, stationary sd 0.32); 10% of trials are lost to
                     infrastructure errors (None)
             barren  no proposal helps: 70% change nothing, 30% break tasks
             rich    large gains, 40% nothing, 30% harm, 30% help   } no constant of evolver's policies
             sparse  large gains, 80% nothing, 15% harm, 5% help    } was tuned on these two
  true gain  the mean over all 80 tasks of the final harness's pass rate minus the base's, in points,
             at no drift; "worse" is a true gain below zero.

What a user pays counts against the budget, which is in simulations: every simulation a strategy runs
(baselines, references, screens, minibatches, gate arms, audits, regression suites, smoke tests, and the
try simulations of evolver's proposer, --tries a proposal, by default proposer_tries), and every proposal
at --proposal-cost simulations (by default what `evolver run --dry-run` expects the default meta model to
cost for one proposal, against one retail simulation of gpt-4.1-mini as agent and user, SIM_TOKENS: the
first line printed says the figure). What every strategy's proposer reads (the incumbent's analysis runs)
is counted for none. A run stops where its next step would pass the budget; it then ends with what its
rule holds at that moment.

Printed per world, strategy and budget: the runs (--runs for each seed), the proposals and simulations a
run made and what it cost in all (means), the mean true gain with its 95% bootstrap interval, and the
share of runs that ended worse with its 95% Wilson interval. The rows with budget "own" are runs with no
budget, each stopped by its own rule: evolver's defaults (`evolver run --iterations 10`) and auto-harness's
stop after 5 iterations in a row that kept nothing. docs/search.md has the table and its time.

Strategies (evolver's are driven through evolver.evolution.gate.search and .population, the code the loop runs):

  per-decision K=1        a lineage: a reference of the incumbent (6 trials per gate task) for every new
                          incumbent, the gate sized to its noise, decide_set at alpha 0.05
  audited K=1             a lineage under the lenient gate, no reference after the base's, and the
                          end-of-run audit of the best against the base (rolled back unless shown better)
  population K=1, K=4     the default: a pool, each iteration's parent drawn from its per-task Pareto
                          front, a minibatch of train tasks for the parent (drawn again while it passes
                          all), K children, each screened beside it on the minibatch (the proposer's tries
                          of the failing tasks reused), then the gate tasks in two parts; the pool's best
                          audited against the base, two looks' worth of the budget kept for the audit
  auto-harness            neosigmaai/auto-harness's gating.py: the base's score on the gate tasks
                          (one trial each); per candidate a regression suite of train tasks (pass
                          rate >= 0.8), one trial of every gate task, kept when its score is at least the
                          best recorded; on a keep, train tasks the parent failed are run again and
                          those now passed join the suite
  gepa-like               gepa-ai/gepa's default loop: a parent drawn from the per-task Pareto front,
                          a minibatch of 3 train tasks (epoch-shuffled) run by parent and child, the
                          child kept when its minibatch sum is strictly higher (skipped when the
                          parent's are all perfect), then one trial of every gate task; the run
                          returns the pool's best mean gate score
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from evolver.config import Config  # noqa: E402
from evolver.evolution.gate import GateConfig, Stage  # noqa: E402
from evolver.evolution.gate.population import draw_parent, first_part_holds, minibatch, passes_everything, pick, screen  # noqa: E402
from evolver.evolution.gate.search import AuditLook, Policy, audit_cost, audit_holds, evaluate_audit, judge_iteration, make_policy  # noqa: E402

TASKS = 40  # of each set, gate and train
PERMUTATIONS = 1000  # as benchmarks/gate_power.py: coarser p-values, still valid, several times faster
BUDGETS = (1000, 2000, 4000)
WORLDS = ("large", "small", "drift", "barren", "rich", "sparse")
STRATEGIES = ("per-decision K=1", "audited K=1", "population K=1", "population K=4", "auto-harness", "gepa-like")
# Each run with its own stop rule and no budget: evolver's defaults (`evolver run --iterations 10`) and auto-harness's.
DEFAULT_RUNS = ("evolver defaults", "auto-harness stall 5")
SIM_TOKENS = 100_000  # of one retail simulation, agent and user together, 90% prompt (DESIGN.md's estimate)


@dataclass(frozen=True)
class World:
    gain: tuple[float, float]  # a helpful proposal's gain from the base, points
    mix: tuple[float, float, float]  # shares of proposals that change nothing, break tasks, help
    drift: float = 0.0  # step sd of the windows' common logit offset
    errors: float = 0.0  # share of trials lost to infrastructure errors


SPECS = {
    "large": World(gain=(5, 20), mix=(0.60, 0.25, 0.15)),
    "small": World(gain=(0.5, 2.5), mix=(0.60, 0.25, 0.15)),
    "drift": World(gain=(5, 20), mix=(0.60, 0.25, 0.15), drift=0.1, errors=0.1),
    "barren": World(gain=(5, 20), mix=(0.70, 0.30, 0.0)),
    # Not used to tune any constant of evolver's policies: two other proposers.
    "rich": World(gain=(5, 20), mix=(0.40, 0.30, 0.30)),
    "sparse": World(gain=(5, 20), mix=(0.80, 0.15, 0.05)),
}
GATE, TRAIN = np.arange(TASKS), np.arange(TASKS, 2 * TASKS)


class OutOfBudget(Exception):
    pass


@dataclass(frozen=True)
class Harness:
    rates: np.ndarray  # true pass rate of every task (gate tasks first), at no drift
    fixes: int = 0  # helpful changes in its lineage


class Sim:
    """One run's world: the base, the proposer, the windows and their drift, the budget.

    The budget is in simulations; a proposal costs ``proposal_cost`` of them (what a user pays for the meta model's
    side, priced in simulations), and ``tries`` try simulations of the proposer's own are charged with it."""

    def __init__(self, world: World, seed: int, budget: int, proposal_cost: float = 0.0, tries: int = 0):
        self.world, self.budget, self.spent, self.proposals = world, budget, 0.0, 0
        self.proposal_cost, self.tries, self.sims = proposal_cost, tries, 0
        self.rng = np.random.default_rng(seed)
        third = 2 * TASKS // 3
        rates = np.concatenate(
            [self.rng.uniform(0, 0.1, third), self.rng.uniform(0.9, 1, third), self.rng.uniform(0.1, 0.9, 2 * TASKS - 2 * third)]
        )
        self.base = Harness(self.rng.permutation(rates))
        self.gap = float(np.mean(1 - self.base.rates))
        self.offset = 0.0

    def window(self) -> None:
        """A new evaluation window: the drift moves on."""
        if self.world.drift:
            self.offset = 0.95 * self.offset + self.rng.normal(0, self.world.drift)

    def gain(self, harness: Harness) -> float:
        return 100 * float(np.mean(harness.rates - self.base.rates))

    def checkpoint(self, checkpoints: list, harness: Harness) -> None:
        """What the run would end with if its budget ended here: (budget spent, true gain, proposals, simulations)."""
        checkpoints.append((self.spent, self.gain(harness), self.proposals, self.sims))

    def afford(self, sims: int, reserve: int = 0) -> None:
        if self.spent + sims > self.budget - reserve:
            raise OutOfBudget

    def trials(self, harness: Harness, tasks: np.ndarray, n: int, reserve: int = 0) -> np.ndarray:
        """n trials of each task in this window: (tasks, n) of 1.0, 0.0, or nan for an infrastructure error."""
        self.afford(len(tasks) * n, reserve)
        self.spent += len(tasks) * n
        self.sims += len(tasks) * n
        return self.draw(harness, tasks, n)

    def draw(self, harness: Harness, tasks: np.ndarray, n: int) -> np.ndarray:
        """n trials of each task in this window, charged already (the proposer's tries of the version it submitted)."""
        p = harness.rates[tasks]
        if self.offset:
            logit = np.log(np.clip(p, 1e-6, 1 - 1e-6) / np.clip(1 - p, 1e-6, 1)) + self.offset
            p = 1 / (1 + np.exp(-logit))
        out = (self.rng.random((len(tasks), n)) < p[:, None]).astype(float)
        if self.world.errors:
            out[self.rng.random(out.shape) < self.world.errors] = np.nan
        return out

    def propose(self, parent: Harness, reserve: int = 0) -> Harness:
        """A proposal from ``parent``, its price and its proposer's try simulations charged."""
        self.afford(self.proposal_cost + self.tries, reserve)
        self.spent += self.proposal_cost + self.tries
        self.sims += self.tries
        self.proposals += 1
        _, harm, helps = self.world.mix
        u, rates = self.rng.random(), parent.rates.copy()
        if u < harm:
            self._break(rates, self.rng.integers(3, 9), self.rng.integers(3, 9))
        if not harm <= u < harm + helps * 0.9**parent.fixes:  # the helpful share lost along the lineage does nothing
            return Harness(rates, parent.fixes)
        target = self.rng.uniform(*self.world.gain) / 100
        chance = min(1.0, target / (0.75 * self.gap))  # from the base, the mean rises by `target`
        fixed = self.rng.random(2 * TASKS) < chance
        rates[fixed] += (1 - rates[fixed]) * self.rng.uniform(0.5, 1, int(fixed.sum()))
        if self.rng.random() < 0.3:
            self._break(rates, 1, 1)
        return Harness(rates, parent.fixes + 1)

    def _break(self, rates: np.ndarray, in_gate: int, in_train: int) -> None:
        for tasks, count in ((GATE, in_gate), (TRAIN, in_train)):
            chosen = self.rng.choice(tasks, size=count, replace=False)
            rates[chosen] *= self.rng.uniform(0, 0.5, count)


def table(trials: np.ndarray, tasks: np.ndarray) -> dict[str, list]:
    return {f"t{t}": [None if math.isnan(x) else float(x) for x in row] for t, row in zip(tasks, trials)}


class Arm:
    """One harness's trials on the gate tasks, grown window by window as a stage asks."""

    def __init__(self, sim: Sim, harness: Harness):
        self.sim, self.harness, self.rows = sim, harness, np.empty((TASKS, 0))

    def grow(self, total: int, reserve: int = 0) -> dict[str, list]:
        if total > self.rows.shape[1]:
            self.rows = np.hstack([self.rows, self.sim.trials(self.harness, GATE, total - self.rows.shape[1], reserve)])
        return table(self.rows[:, :total], GATE)


# --- evolver's loop, through the policy the loop runs


def evolver_run(sim: Sim, policy: Policy, k: int, checkpoints: list) -> Harness:
    """The loop's gate orchestration: the base's reference, then iterations of K candidates from the incumbent
    judged by the policy (one smoke simulation each). The incumbent's reference: per-decision, measured
    afresh for each new incumbent; audited, its history (the base's reference, then the kept candidate's
    gate trials, and the incumbent's trials beside later candidates). At the end, the policy's audit,
    with the simulations it may need kept aside from the start."""
    reserve = audit_cost(policy, TASKS)
    incumbent, reference = sim.base, None
    try:
        sim.window()
        reference = Arm(sim, sim.base).grow(policy.reference_trials, reserve)
        while True:
            candidates = {f"c{j}": sim.propose(incumbent, reserve) for j in range(k)}
            sim.trials(incumbent, GATE[:1], k, reserve)  # the smoke tests (their outcome is not used here)
            arms, inc = {n: Arm(sim, h) for n, h in candidates.items()}, Arm(sim, incumbent)
            last: dict[str, dict] = {}

            def run(stage: Stage):
                sim.window()
                for name in stage.alive:
                    last[name] = arms[name].grow(stage.candidate_trials, reserve)
                return inc.grow(stage.incumbent_trials, reserve), dict(last)

            verdicts = judge_iteration(policy, list(candidates), run, reference=reference)
            kept = verdicts[-1].kept if verdicts else None
            if kept and policy.fresh_reference:
                reference = Arm(sim, candidates[kept]).grow(policy.reference_trials, reserve)
            elif kept:  # its trials beside the incumbent; the screen's (its first) left out
                reference = {t: r[1:] for t, r in last[kept].items()}
            elif not policy.fresh_reference:
                reference = {t: [*reference[t], *inc.grow(inc.rows.shape[1])[t]] for t in reference}
            incumbent = candidates[kept] if kept else incumbent
            sim.checkpoint(checkpoints, incumbent)
    except OutOfBudget:
        pass
    if policy.audit is None or incumbent is sim.base:
        return incumbent
    return incumbent if audited(sim, policy, incumbent) else sim.base


def population_run(sim: Sim, policy: Policy, k: int, checkpoints: list, seed: int, iterations: int = 0, stall: int = 0) -> Harness:
    """The population search as the loop runs it (evolver.evolution.gate.population): the base's gate trials start the
    pool; each iteration draws a parent from the pool's Pareto front and a minibatch of train tasks it fails some of
    (up to config.draws minibatches), and K children from it; each child's proposer tries the version it submits on the
    failing tasks of the minibatch (those tries are its screen there), the child runs the rest of the minibatch, and
    passes its screen when it does strictly better than its parent; a child that passes runs the first part of the
    gate tasks, and the rest unless it is clearly below its parent there, and joins the pool. The run stops at its
    budget (the audit's reserve kept aside), or after ``iterations`` (0: none) or ``stall`` iterations in a row that
    added no member (0: never); then the pool's pick is audited against the base."""
    config = policy.population
    reserve = 2 * TASKS * config.audit_reserve
    names = {f"t{t}": t for t in TRAIN}
    first, second = (np.array([int(t[1:]) for t in part], dtype=int) for part in config.parts([f"t{t}" for t in GATE]))
    pool: dict[str, Harness] = {"base": sim.base}
    tables: dict[str, dict] = {}
    idle = 0
    try:
        sim.window()
        tables["base"] = table(sim.trials(sim.base, GATE, config.gate_trials, reserve), GATE)
        for n in range(1, iterations + 1 if iterations else 1 << 30):
            if stall and idle >= stall:
                break
            sim.window()
            parent_name = draw_parent(tables, seed * 7919 + n)
            parent, joined = pool[parent_name], False
            for draw in range(config.draws):  # the loop's numbering: each iteration its own minibatches
                batch = np.array([names[t] for t in minibatch(list(names), seed, (n - 1) * config.draws + draw, config.minibatch)])
                mini = table(sim.trials(parent, batch, 1, reserve), batch)
                if not passes_everything(mini):
                    break
            else:
                idle += 1
                continue
            failing = np.array([names[t] for t, r in mini.items() if r[0] is not None and r[0] < 1], dtype=int)
            for j in range(k):
                child = sim.propose(parent, reserve)
                rows = {}
                if sim.tries >= max(1, len(failing)):  # the version it submits, tried on the failing tasks it read
                    rows.update(table(sim.draw(child, failing, 1), failing))
                else:
                    sim.trials(child, TRAIN[:1], 1, reserve)  # the smoke test
                rest = np.array([t for t in batch if f"t{t}" not in rows], dtype=int)
                if len(rest):
                    rows.update(table(sim.trials(child, rest, 1, reserve), rest))
                if not screen(mini, rows).passed:
                    continue
                gate = table(sim.trials(child, first, config.gate_trials, reserve), first)
                if len(second):
                    if not first_part_holds(tables[parent_name], gate, config.margin).passed:
                        continue
                    gate.update(table(sim.trials(child, second, config.gate_trials, reserve), second))
                name = f"{n}{'abcdefgh'[j]}"
                tables[name], pool[name], joined = gate, child, True
            idle = 0 if joined else idle + 1
            sim.checkpoint(checkpoints, pool[pick(tables)])
    except OutOfBudget:
        pass
    best = pool[pick(tables)] if tables else sim.base
    if best is sim.base:
        return best
    return best if audited(sim, policy, best) else sim.base


def audited(sim: Sim, policy: Policy, best: Harness) -> bool:
    """The policy's audit of ``best`` against the base, side by side on fresh trials."""
    base_arm, best_arm = Arm(sim, sim.base), Arm(sim, best)

    def look(at: AuditLook):
        sim.window()
        try:
            return base_arm.grow(at.trials), best_arm.grow(at.trials)
        except OutOfBudget:
            return None

    return audit_holds(evaluate_audit(policy, look))


# --- the anchors, rendered from their own code


def valid_mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else 0.0


def auto_harness(sim: Sim, checkpoints: list, stall: int = 0) -> Harness:
    """gating.py: suite >= 0.8, then the gate tasks' score >= the best recorded (ties pass), then suite promotion;
    with ``stall``, PROGRAM.md's stop after that many iterations in a row that kept nothing."""
    incumbent, suite, idle = sim.base, np.array([], dtype=int), 0
    try:
        sim.window()
        best = valid_mean(sim.trials(sim.base, GATE, 1))  # prepare.py's baseline: results.tsv, iteration 0
        while not stall or idle < stall:
            sim.window()
            train = sim.trials(incumbent, TRAIN, 1)[:, 0]  # benchmark.py: train_results.json (the proposer's reading, not counted)
            sim.spent -= len(TRAIN)
            sim.sims -= len(TRAIN)
            candidate = sim.propose(incumbent)
            suite_ok = True
            if len(suite):
                results = sim.trials(candidate, suite, 1)[:, 0]
                valid = results[~np.isnan(results)]
                suite_ok = (valid >= 0.5).mean() >= 0.8 if len(valid) else False
            val = valid_mean(sim.trials(candidate, GATE, 1))
            idle += 1
            if suite_ok and val >= best:
                incumbent, best, idle = candidate, val, 0
                failing = np.array([t for t, r in zip(TRAIN, train) if not np.isnan(r) and r < 0.5 and t not in suite], dtype=int)
                if len(failing):
                    recheck = sim.trials(candidate, failing, 1)[:, 0]
                    suite = np.union1d(suite, failing[recheck >= 0.5])
            sim.checkpoint(checkpoints, incumbent)
    except OutOfBudget:
        pass
    return incumbent


def gepa_like(sim: Sim, checkpoints: list) -> Harness:
    pool: list[Harness] = [sim.base]
    scores: list[np.ndarray] = []
    rng = random.Random(int(sim.rng.integers(1 << 30)))
    order: list[int] = []
    try:
        sim.window()
        scores.append(np.nan_to_num(sim.trials(sim.base, GATE, 1)[:, 0]))  # a failed rollout scores 0, as gepa's adapters do
        while True:
            sim.window()
            # gepa's select_program_candidate_from_pareto_front, as evolver's population draws its parents
            parent = int(draw_parent({str(i): table(row[:, None], GATE) for i, row in enumerate(scores)}, rng.randrange(1 << 30)))
            if len(order) < 3:
                order += rng.sample(list(TRAIN), len(TRAIN))  # epoch-shuffled minibatches
            batch, order = np.array(order[:3]), order[3:]
            before = np.nan_to_num(sim.trials(pool[parent], batch, 1)[:, 0])
            if before.min() >= 1:
                continue  # skip_perfect_score
            child = sim.propose(pool[parent])
            after = np.nan_to_num(sim.trials(child, batch, 1)[:, 0])
            if after.sum() > before.sum():
                scores.append(np.nan_to_num(sim.trials(child, GATE, 1)[:, 0]))
                pool.append(child)
            sim.checkpoint(checkpoints, best_of(pool, scores))
    except OutOfBudget:
        return best_of(pool, scores)


def best_of(pool: list[Harness], scores: list[np.ndarray]) -> Harness:
    means = [float(s.mean()) for s in scores]
    return pool[means.index(max(means))] if means else pool[0]


# --- runs, cells and the table


def policy_of(name: str) -> Policy:
    return make_policy(name, replace(GateConfig(), permutations=PERMUTATIONS))


def proposal_cost() -> float:
    """A proposal's price in simulations: what `evolver run --dry-run` expects the meta model (gpt-4.1, list prices)
    to cost for one proposal, against one retail simulation of gpt-4.1-mini as agent and user (SIM_TOKENS)."""
    from evolver.config import Config
    from evolver.evolution.plan import forecast
    from evolver.llm import prepare_environment, price_of

    prepare_environment()
    cfg = replace(Config(), candidates=1)
    meta = forecast(
        cfg, 0, 0, 0, iterations=1, per_simulation={}, meta_price=price_of("gpt-4.1"), meta_prompt_tokens=0, baseline=False
    ).roles["meta"][2]
    prompt, completion = price_of("gpt-4.1-mini")
    return meta / (SIM_TOKENS * (0.9 * prompt + 0.1 * completion))


def one_run(job: tuple) -> tuple[str, str, list[tuple]]:
    """One run of a strategy in a world: (strategy, world, [(budget, true gain, proposals, simulations, cost)])."""
    strategy, world, budgets, seed, price, tries = job
    spec = SPECS[world]
    ours = tries if strategy.split()[0] in ("audited", "per-decision", "population", "evolver") else 0

    def sim_of(budget: int) -> Sim:
        return Sim(spec, seed, budget, price, ours)

    def ended(sim: Sim, budget, harness: Harness) -> tuple:
        return budget, sim.gain(harness), sim.proposals, sim.sims, sim.spent

    if strategy == "evolver defaults":  # `evolver run --iterations 10`: the default policy, candidates and stall
        sim, cfg = sim_of(1 << 30), Config()
        policy = policy_of(cfg.gate_policy)
        return (
            strategy,
            world,
            [ended(sim, "own", population_run(sim, policy, cfg.candidates, [], seed, iterations=cfg.iterations, stall=cfg.stall))],
        )
    if strategy == "auto-harness stall 5":
        sim = sim_of(1 << 30)
        return strategy, world, [ended(sim, "own", auto_harness(sim, [], stall=5))]
    if strategy.startswith(("audited", "population")):  # sized to its budget (the audit is set aside): one run per budget
        out = []
        for budget in budgets:
            sim = sim_of(budget)
            if strategy.startswith("audited"):
                end = evolver_run(sim, policy_of("audited"), int(strategy[-1]), [])
            else:
                end = population_run(sim, policy_of("population"), int(strategy[-1]), [], seed)
            out.append(ended(sim, budget, end))
        return strategy, world, out
    sim, checkpoints = sim_of(max(budgets)), [(0.0, 0.0, 0, 0)]
    if strategy.startswith("per-decision"):
        evolver_run(sim, policy_of("per-decision"), int(strategy[-1]), checkpoints)
    elif strategy == "auto-harness":
        auto_harness(sim, checkpoints)
    else:
        gepa_like(sim, checkpoints)
    # A run of budget B ends with what the rule held after its last decision within B (these rules do not look at B).
    return strategy, world, [(b, *[(*c[1:], c[0]) for c in checkpoints if c[0] <= b][-1]) for b in budgets]


def wilson(k: int, n: int) -> tuple[float, float]:
    z = 1.96
    centre, half = (k + z * z / 2) / (n + z * z), z * math.sqrt(k * (n - k) / n + z * z / 4) / (n + z * z)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(values: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    means = rng.choice(values, size=(2000, len(values))).mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per cell and seed")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--worlds", default=",".join(WORLDS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES + DEFAULT_RUNS))
    parser.add_argument("--proposal-cost", type=float, default=None, help="a proposal's price in simulations (default: from the estimator)")
    parser.add_argument(
        "--tries", type=int, default=None, help="try simulations charged per proposal of evolver's (default: proposer_tries)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="a few runs of every cell, for a test")
    args = parser.parse_args()
    try:
        budgets = tuple(int(b) for b in args.budgets.split(","))
        seeds = tuple(int(x) for x in args.seeds.split(","))
    except ValueError:
        budgets, seeds = (0,), ()
    worlds, strategies = args.worlds.split(","), args.strategies.split(",")
    unknown = [w for w in worlds if w not in SPECS] + [s for s in strategies if s not in STRATEGIES + DEFAULT_RUNS]
    if unknown or min(budgets) < 1 or args.runs < 1 or not seeds:
        print(
            f"search.py: unknown {', '.join(unknown) or 'budgets, seeds or runs'}; worlds: {', '.join(SPECS)}; "
            f"strategies: {', '.join(STRATEGIES + DEFAULT_RUNS)}",
            file=sys.stderr,
        )
        sys.exit(2)
    price = proposal_cost() if args.proposal_cost is None else args.proposal_cost
    tries = Config().proposer_tries if args.tries is None else args.tries
    runs = 4 if args.quick else args.runs
    jobs = [(s, w, budgets, seed * 1_000_003 + i, price, tries) for w in worlds for s in strategies for seed in seeds for i in range(runs)]
    print(
        f"# a proposal costs {price:.2f} simulations; each of evolver's charges {tries} try simulations; "
        f"{runs} runs per cell and seed, seeds {', '.join(map(str, seeds))}"
    )
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one_run, jobs, chunksize=4))
    cells: dict[tuple, list[tuple]] = {}
    for strategy, world, rows in results:
        for budget, *row in rows:
            cells.setdefault((world, strategy, budget), []).append(tuple(row))
    rng = np.random.default_rng(seeds[0])
    print(
        f"{'world':<7} {'strategy':<21} {'budget':>6} {'runs':>5} {'proposals':>9} {'sims':>6} {'cost':>6} {'true gain':>9} "
        f"{'95% interval':>13} {'worse':>6} {'95% interval':>13}"
    )
    for (world, strategy, budget), rows in cells.items():
        gains, proposals, sims, cost = (np.array(column, dtype=float) for column in zip(*rows))
        worse = int((gains < -1e-9).sum())
        low, high = bootstrap(gains, rng)
        w_low, w_high = wilson(worse, len(gains))
        print(
            f"{world:<7} {strategy:<21} {budget:>6} {len(gains):>5} {proposals.mean():>9.1f} {sims.mean():>6.0f} {cost.mean():>6.0f} "
            f"{gains.mean():>9.1f} {f'[{low:.1f}, {high:.1f}]':>13} {worse / len(gains):>6.3f} {f'[{w_low:.3f}, {w_high:.3f}]':>13}"
        )
    print(f"# {len(jobs)} runs in {time.monotonic() - started:.0f} s with {args.jobs} process(es)")


if __name__ == "__main__":
    main()
