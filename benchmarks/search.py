"""What a run finds for its budget: the true gain of the harness a run ends with, and how often it ends worse.

    python benchmarks/search.py [--runs 200] [--budgets 500,1000,2000,4000] [--worlds large,small,drift,barren]
                                [--strategies ...] [--jobs N] [--seed 1] [--quick]

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
  true gain  the mean over all 80 tasks of the final harness's pass rate minus the base's, in points,
             at no drift; "worse" is a true gain below zero.

Every simulation a strategy's selection runs counts against the budget: baselines, references,
screens, gate arms, audits, regression suites, minibatches, smoke tests. What every strategy's
proposer reads (the incumbent's analysis runs) is not counted, for any strategy. A run stops where
its next measurement would pass the budget; it then ends with what its rule holds at that moment.

Printed per world, strategy and budget: the runs, the proposals a run made (mean), the mean true gain
with its 95% bootstrap interval, and the share of runs that ended worse with its 95% Wilson interval.
Defaults: 200 runs per cell, about 18 CPU-minutes, 9 on 2 idle cores (docs/search.md has the table and the time).

Strategies (evolver's are driven through evolver.evolution.gate.search, the code the loop runs):

  per-decision K=1, K=4   today's loop: a reference of the incumbent (6 trials per gate task) for
                          every new incumbent, the gate sized to its noise, decide_set at alpha 0.05
  audited K=1, K=4        the default policy: the lenient gate, no reference after the base's, and
                          the end-of-run audit of the best against the base (rolled back unless shown better)
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

from evolver.evolution.gate import GateConfig, Stage  # noqa: E402
from evolver.evolution.gate.search import AuditLook, Policy, audit_cost, audit_holds, evaluate_audit, judge_iteration, make_policy  # noqa: E402

TASKS = 40  # of each set, gate and train
PERMUTATIONS = 1000  # as benchmarks/gate_power.py: coarser p-values, still valid, several times faster
BUDGETS = (500, 1000, 2000, 4000)
WORLDS = ("large", "small", "drift", "barren")
STRATEGIES = ("per-decision K=1", "per-decision K=4", "audited K=1", "audited K=4", "auto-harness", "gepa-like")


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
}
GATE, TRAIN = np.arange(TASKS), np.arange(TASKS, 2 * TASKS)


class OutOfBudget(Exception):
    pass


@dataclass(frozen=True)
class Harness:
    rates: np.ndarray  # true pass rate of every task (gate tasks first), at no drift
    fixes: int = 0  # helpful changes in its lineage


class Sim:
    """One run's world: the base, the proposer, the windows and their drift, the budget."""

    def __init__(self, world: World, seed: int, budget: int):
        self.world, self.budget, self.spent, self.proposals = world, budget, 0, 0
        self.rng = np.random.default_rng(seed)
        third = 2 * TASKS // 3
        rates = np.concatenate([self.rng.uniform(0, 0.1, third), self.rng.uniform(0.9, 1, third),
                                self.rng.uniform(0.1, 0.9, 2 * TASKS - 2 * third)])
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
        """What the run would end with if its budget ended here: (simulations spent, true gain, proposals made)."""
        checkpoints.append((self.spent, self.gain(harness), self.proposals))

    def afford(self, sims: int, reserve: int = 0) -> None:
        if self.spent + sims > self.budget - reserve:
            raise OutOfBudget

    def trials(self, harness: Harness, tasks: np.ndarray, n: int, reserve: int = 0) -> np.ndarray:
        """n trials of each task in this window: (tasks, n) of 1.0, 0.0, or nan for an infrastructure error."""
        self.afford(len(tasks) * n, reserve)
        self.spent += len(tasks) * n
        p = harness.rates[tasks]
        if self.offset:
            logit = np.log(np.clip(p, 1e-6, 1 - 1e-6) / np.clip(1 - p, 1e-6, 1)) + self.offset
            p = 1 / (1 + np.exp(-logit))
        out = (self.rng.random((len(tasks), n)) < p[:, None]).astype(float)
        if self.world.errors:
            out[self.rng.random(out.shape) < self.world.errors] = np.nan
        return out

    def propose(self, parent: Harness) -> Harness:
        self.proposals += 1
        _, harm, helps = self.world.mix
        u, rates = self.rng.random(), parent.rates.copy()
        if u < harm:
            self._break(rates, self.rng.integers(3, 9), self.rng.integers(3, 9))
        if not harm <= u < harm + helps * 0.9 ** parent.fixes:  # the helpful share lost along the lineage does nothing
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
            candidates = {f"c{j}": sim.propose(incumbent) for j in range(k)}
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
    base_arm, best_arm = Arm(sim, sim.base), Arm(sim, incumbent)

    def look(at: AuditLook):
        sim.window()
        try:
            return base_arm.grow(at.trials), best_arm.grow(at.trials)
        except OutOfBudget:
            return None

    return incumbent if audit_holds(evaluate_audit(policy, look)) else sim.base


# --- the anchors, rendered from their own code


def valid_mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else 0.0


def auto_harness(sim: Sim, checkpoints: list) -> Harness:
    """gating.py: suite >= 0.8, then the gate tasks' score >= the best recorded (ties pass), then suite promotion."""
    incumbent, suite = sim.base, np.array([], dtype=int)
    try:
        sim.window()
        best = valid_mean(sim.trials(sim.base, GATE, 1))  # prepare.py's baseline: results.tsv, iteration 0
        while True:
            sim.window()
            train = sim.trials(incumbent, TRAIN, 1)[:, 0]  # benchmark.py: train_results.json (the proposer's reading, not counted)
            sim.spent -= len(TRAIN)
            candidate = sim.propose(incumbent)
            suite_ok = True
            if len(suite):
                results = sim.trials(candidate, suite, 1)[:, 0]
                valid = results[~np.isnan(results)]
                suite_ok = (valid >= 0.5).mean() >= 0.8 if len(valid) else False
            val = valid_mean(sim.trials(candidate, GATE, 1))
            if suite_ok and val >= best:
                incumbent, best = candidate, val
                failing = np.array([t for t, r in zip(TRAIN, train) if not np.isnan(r) and r < 0.5 and t not in suite], dtype=int)
                if len(failing):
                    recheck = sim.trials(candidate, failing, 1)[:, 0]
                    suite = np.union1d(suite, failing[recheck >= 0.5])
            sim.checkpoint(checkpoints, incumbent)
    except OutOfBudget:
        return incumbent


def pareto_parent(scores: list[np.ndarray], rng: random.Random) -> int:
    """gepa's select_program_candidate_from_pareto_front: per gate task the programs at its best score, the
    dominated ones removed, one drawn with weight = the number of fronts it is on."""
    grid = np.array(scores)
    fronts = [set(np.flatnonzero(column == column.max())) for column in grid.T]
    means = grid.mean(axis=1)
    programs = sorted({p for f in fronts for p in f}, key=lambda p: means[p])
    dominated: set[int] = set()
    changed = True
    while changed:
        changed = False
        for y in programs:
            if y in dominated:
                continue
            others = set(programs) - {y} - dominated
            if all(f & others for f in fronts if y in f):
                dominated.add(y)
                changed = True
                break
    weights = [p for f in fronts for p in sorted(f - dominated)]
    return rng.choice(weights)


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
            parent = pareto_parent(scores, rng)
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


def one_run(job: tuple) -> tuple[str, str, list[tuple[int, float, int]]]:
    """One run of a strategy in a world: (strategy, world, [(budget, true gain, proposals)])."""
    strategy, world, budgets, seed = job
    spec = SPECS[world]
    if strategy.startswith("audited"):  # sized to its budget (the audit is set aside): one run per budget
        out = []
        for budget in budgets:
            sim = Sim(spec, seed, budget)
            out.append((budget, sim.gain(evolver_run(sim, policy_of("audited"), int(strategy[-1]), [])), sim.proposals))
        return strategy, world, out
    sim, checkpoints = Sim(spec, seed, max(budgets)), [(0, 0.0, 0)]
    if strategy.startswith("per-decision"):
        evolver_run(sim, policy_of("per-decision"), int(strategy[-1]), checkpoints)
    elif strategy == "auto-harness":
        auto_harness(sim, checkpoints)
    else:
        gepa_like(sim, checkpoints)
    # A run of budget B ends with what the rule held after its last decision within B (these rules do not look at B).
    return strategy, world, [(b, *[c[1:] for c in checkpoints if c[0] <= b][-1]) for b in budgets]


def wilson(k: int, n: int) -> tuple[float, float]:
    z = 1.96
    centre, half = (k + z * z / 2) / (n + z * z), z * math.sqrt(k * (n - k) / n + z * z / 4) / (n + z * z)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(values: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    means = rng.choice(values, size=(2000, len(values))).mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--worlds", default=",".join(WORLDS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a few runs of every cell, for a test")
    args = parser.parse_args()
    try:
        budgets = tuple(int(b) for b in args.budgets.split(","))
    except ValueError:
        budgets = (0,)
    worlds, strategies = args.worlds.split(","), args.strategies.split(",")
    unknown = [w for w in worlds if w not in SPECS] + [s for s in strategies if s not in STRATEGIES]
    if unknown or min(budgets) < 1 or args.runs < 1:
        print(f"search.py: unknown {', '.join(unknown) or 'budgets or runs below 1'}; worlds: {', '.join(SPECS)}; "
              f"strategies: {', '.join(STRATEGIES)}", file=sys.stderr)
        sys.exit(2)
    runs = 4 if args.quick else args.runs
    jobs = [(s, w, budgets, args.seed * 1_000_003 + i) for w in worlds for s in strategies for i in range(runs)]
    started = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(one_run, jobs, chunksize=4))
    gains: dict[tuple, list[float]] = {}
    proposals: dict[tuple, list[int]] = {}
    for strategy, world, rows in results:
        for budget, gain, made in rows:
            gains.setdefault((world, strategy, budget), []).append(gain)
            proposals.setdefault((world, strategy, budget), []).append(made)
    rng = np.random.default_rng(args.seed)
    print(f"{'world':<8} {'strategy':<17} {'budget':>6} {'runs':>5} {'proposals':>9} {'true gain':>9} {'95% interval':>15} {'worse':>6} "
          f"{'95% interval':>13}")
    for world in worlds:
        for strategy in strategies:
            for budget in budgets:
                values = np.array(gains[(world, strategy, budget)])
                worse = int((values < -1e-9).sum())
                low, high = bootstrap(values, rng)
                w_low, w_high = wilson(worse, len(values))
                print(f"{world:<8} {strategy:<17} {budget:>6} {len(values):>5} {np.mean(proposals[(world, strategy, budget)]):>9.1f} "
                      f"{values.mean():>9.1f} {f'[{low:.1f}, {high:.1f}]':>15} {worse / len(values):>6.3f} {f'[{w_low:.3f}, {w_high:.3f}]':>13}")
    print(f"# {len(jobs)} runs in {time.monotonic() - started:.0f} s with {args.jobs} process(es), seed {args.seed}")


if __name__ == "__main__":
    main()
