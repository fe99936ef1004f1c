"""Monte-Carlo figures for evolver.gate under tau2-like noise.

    python benchmarks/gate_power.py [--tasks 40] [--decisions 2000] [--seed 1]
                                    [--from-result PATH] [--jobs 2]

Noise model: each task has a pass probability, drawn per decision from
Beta(a, b) (default Beta(1, 1), i.e. uniform, whose expected flip rate between
two identical single-trial runs, E[2p(1-p)], is exactly 1/3), or taken from a
result file through gate.pass_rates (each task's observed noise). A candidate
with effect d shifts every task's probability by the same amount in logit
space (gate.shift_rates), solved by bisection so that the mean over tasks
moves by exactly d; tasks near 0 or 1 move less, as real tasks do.

Compared on the same simulated data:
  * the gate with the default GateConfig (sequential, futility stops);
  * "best so far": one candidate trial, accept when its score >= the best of
    the incumbent's previous single-trial runs (--history, default 3, which
    reproduces the 25-28% no-op acceptance measured on tau2);
  * a fixed-size paired test: the same final test at n trials per task, no
    interim looks, for n = 1..8.
Two more rows: "+10, breaks 3" gains 10 points on average but drops its 3 most
reliable tasks to 0.2 (the regression suite should catch it); "floor" runs each
of 8 task sets at its own noise_floor(), which should give ~80% acceptance.

Simulations counted are the candidate's. The incumbent's reference results
(--incumbent-trials per task, default the gate's final stage) are run once
when it is accepted and reused for every later decision, so they are printed
separately as a one-off cost and not added per decision.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from evolver.gate import GateConfig, decide, evaluate, noise_floor, pass_rates, shift_rates  # noqa: E402

FIXED_SIZES = range(1, 9)
MIX = ("-10", "0", "+5", "+10")  # candidates averaged for the sims ratio
BREAKING = "+10, breaks 3"  # +10 on average, but its 3 most reliable tasks drop to 0.2
BROKEN_TASKS, BROKEN_RATE = 3, 0.2
SCENARIOS = {"-10": -0.10, "0": 0.0, "+5": 0.05, "+10": 0.10, "+15": 0.15, BREAKING: 0.10}
FLOOR = "noise floor"  # effect: noise_floor() of the task set, aimed at 0.80 acceptance


def load_rates(path: str) -> list[float]:
    """Per-task pass rates from an `evolver eval` result.json (infrastructure errors left out)."""
    table: dict[str, list[float | None]] = {}
    for sim in json.loads(Path(path).read_text())["simulations"]:
        table.setdefault(sim["task_id"], []).append(None if sim["outcome"] == "infra_error" else sim["reward"])
    return list(pass_rates(table).values())


def draw_rates(rng: random.Random, args: dict) -> list[float]:
    if args["rates"]:
        return args["rates"]
    return [min(max(rng.betavariate(*args["beta"]), 1e-4), 1 - 1e-4) for _ in range(args["tasks"])]


def candidate_rates(rates: list[float], name: str, effect: float) -> list[float]:
    if name != BREAKING:
        return shift_rates(rates, effect)
    # Its most reliable tasks drop to BROKEN_RATE; the others gain enough for the mean effect.
    broken = set(sorted(range(len(rates)), key=rates.__getitem__)[-BROKEN_TASKS:])
    others = [p for i, p in enumerate(rates) if i not in broken]
    gain = (effect * len(rates) - sum(BROKEN_RATE - rates[i] for i in broken)) / len(others)
    moved = iter(shift_rates(others, gain))
    return [BROKEN_RATE if i in broken else next(moved) for i in range(len(rates))]


def trials(rng: random.Random, rates: list[float], n: int) -> dict[str, list[float]]:
    return {f"t{i}": [float(rng.random() < p) for _ in range(n)] for i, p in enumerate(rates)}


def run_chunk(job: tuple) -> dict:
    """Simulate `count` decisions of one candidate kind; returns summed counts."""
    name, effect, count, seed, args = job
    rng = random.Random(f"{seed}:{name}")
    config = GateConfig()
    fixed = {n: replace(config, stages=(n,), futility=()) for n in FIXED_SIZES}
    depth = max(config.stages[-1], max(FIXED_SIZES))
    out = {"accept": 0, "regression": 0, "sims": 0, "best": 0, "flips": 0.0, "effect": effect * count,
           "seconds": 0.0, "fixed": {n: 0 for n in FIXED_SIZES}}
    if name == FLOOR:  # one task set per chunk: its noise floor, estimated from one incumbent run
        started = time.perf_counter()
        args = {**args, "rates": draw_rates(rng, args)}
        effect = noise_floor(trials(rng, args["rates"], args["incumbent_trials"]), config)
        out["effect"], out["seconds"] = effect * count, time.perf_counter() - started
    for _ in range(count):
        rates = draw_rates(rng, args)
        incumbent = trials(rng, rates, args["incumbent_trials"])
        candidate = trials(rng, candidate_rates(rates, name, effect), depth)

        verdict = evaluate(incumbent, lambda n: {t: r[:n] for t, r in candidate.items()}, config)[-1]
        out["accept"] += verdict.decision == "accept"
        out["regression"] += len(verdict.regressions) > config.max_regressions
        out["sims"] += verdict.n_candidate_sims
        best = max(sum(r[j] for r in incumbent.values()) for j in range(args["history"]))
        out["best"] += sum(r[0] for r in candidate.values()) >= best
        out["flips"] += sum(r[0] != r[1] for r in incumbent.values()) / len(incumbent)
        if name in ("0", "+10"):
            for n, cfg in fixed.items():
                table = {t: r[:n] for t, r in candidate.items()}
                out["fixed"][n] += decide(incumbent, table, cfg, stage=0).decision == "accept"
    return out


def merge(parts: list[dict]) -> dict:
    total = {key: sum(p[key] for p in parts) for key in parts[0] if key != "fixed"}
    total["fixed"] = {n: sum(p["fixed"][n] for p in parts) for n in FIXED_SIZES}
    return total


def equivalent_size(power_by_size: dict[int, float], power: float) -> float:
    """Trials per task a fixed test needs for `power`, interpolated between integer sizes.

    Interpolating is generous to the fixed test: its power is concave in size.
    """
    previous_n, previous_power = 0, 0.0
    for n, p in power_by_size.items():
        if p >= power:
            return previous_n + (n - previous_n) * (power - previous_power) / (p - previous_power)
        previous_n, previous_power = n, p
    return math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=40, help="gate tasks (ignored with --from-result)")
    parser.add_argument("--decisions", type=int, default=2000, help="decisions per candidate kind")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--beta", type=float, nargs=2, default=(1.0, 1.0), metavar=("A", "B"))
    parser.add_argument("--from-result", help='JSON {"tasks": {id: [rewards...]}}: per-task rates from a real run')
    parser.add_argument("--incumbent-trials", type=int, default=GateConfig().stages[-1])
    parser.add_argument("--history", type=int, default=3, help='incumbent runs behind "best so far"')
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    if args.incumbent_trials < max(2, args.history):
        parser.error("--incumbent-trials must be at least 2 and at least --history")

    started = time.perf_counter()
    config = GateConfig()
    shared = {"tasks": args.tasks, "beta": tuple(args.beta), "incumbent_trials": args.incumbent_trials,
              "history": args.history, "rates": load_rates(args.from_result) if args.from_result else None}
    n_tasks = len(shared["rates"] or range(args.tasks))
    kinds = {**SCENARIOS, FLOOR: 0.0}
    chunks = 8  # per kind, so that the workers stay busy
    jobs = [(name, effect, args.decisions // chunks + (c < args.decisions % chunks), f"{args.seed}:{c}", shared)
            for name, effect in kinds.items() for c in range(chunks)]
    with ProcessPoolExecutor(args.jobs) as pool:
        parts = list(pool.map(run_chunk, jobs))
    results = {name: merge(parts[i * chunks:(i + 1) * chunks]) for i, name in enumerate(kinds)}

    d = args.decisions
    source = f"rates from {args.from_result}" if args.from_result else f"pass rates ~ Beta{tuple(args.beta)}"
    flip = sum(results[name]["flips"] for name in SCENARIOS) / (d * len(SCENARIOS))
    print(f"{n_tasks} tasks, {source}; flip rate between two identical single-trial runs: {flip:.3f}")
    print(f"gate: alpha {config.alpha}, stages {config.stages}, futility z < {config.futility}; "
          f"regression: >{config.max_regressions} reliable tasks dropping by >{config.regression_drop}")
    print(f"incumbent reference: {args.incumbent_trials} trials/task = {args.incumbent_trials * n_tasks} sims "
          f"once per accepted incumbent, reused, not counted below. {d} decisions per row: "
          f"rates +-{2 * math.sqrt(0.25 / d):.3f} at most (2 SE)")
    print()
    print(f"{'candidate':<16}{'gate accept':>12}{'regr. rej':>10}{'gate sims':>10}{'best-so-far':>13}{'sims':>6}")
    for name, r in results.items():
        label = f"floor {100 * r['effect'] / d:+.1f}" if name == FLOOR else name
        print(f"{label:<16}{r['accept'] / d:>12.3f}{r['regression'] / d:>10.3f}{r['sims'] / d:>10.1f}"
              f"{r['best'] / d:>13.3f}{n_tasks:>6}")
    print(f"(accepting -10 or 0 is the error. 'floor': each of {chunks} task sets at its own noise_floor(), "
          f"estimated from one incumbent run in {results[FLOOR]['seconds'] / chunks:.1f} s; aimed at 0.80)")

    power = {n: results["+10"]["fixed"][n] / d for n in FIXED_SIZES}
    false_accept = {n: results["0"]["fixed"][n] / d for n in FIXED_SIZES}
    print()
    print("fixed-size paired test, trials/task: " + " ".join(f"{n:>6}" for n in FIXED_SIZES))
    print("  accept at +10 (power):             " + " ".join(f"{power[n]:>6.3f}" for n in FIXED_SIZES))
    print("  accept at 0 (false accept):        " + " ".join(f"{false_accept[n]:>6.3f}" for n in FIXED_SIZES))
    gate_power = results["+10"]["accept"] / d
    size = equivalent_size(power, gate_power)
    if math.isinf(size):
        print(f"no fixed test up to {max(FIXED_SIZES)} trials/task reaches the gate's power at +10")
        return
    whole = math.ceil(size)
    mix = sum(results[name]["sims"] for name in MIX) / (d * len(MIX))
    print(f"same power as the gate at +10 ({gate_power:.3f}): {size:.2f} trials/task interpolated "
          f"= {size * n_tasks:.0f} sims; {whole} whole trials = {whole * n_tasks} sims")
    print(f"gate sims averaged over candidates {', '.join(MIX)}: {mix:.1f} = {mix / (size * n_tasks):.3f} x "
          f"the interpolated fixed test, {mix / (whole * n_tasks):.3f} x the whole-trial one")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
