"""Monte-Carlo figures for evolver.evolution.gate: false keeps, power and cost, per noise shape and design.

    python benchmarks/gate_power.py [--decisions 400] [--seed 1] [--jobs 1] [--tasks 40]
                                    [--from-result PATH]
    python benchmarks/gate_power.py --compare ...   `evolver compare` instead (benchmarks/compare_power.py)

One world per decision: each of the 40 tasks gets a pass probability from the
noise shape, the incumbent's reference (6 trials per task, measured before
the iteration) is drawn at those rates, and the iteration runs at the same
rates moved by the shape's drift. A candidate with effect d passes each task
at the iteration's rates moved by one common logit shift that raises their
mean by d (gate.shift_rates). Noise shapes:

  uniform      pass rates ~ Beta(1, 1): a third of tasks flip between two runs
  bimodal      Beta(0.3, 0.3): most tasks nearly always pass or nearly always fail
  coin flips   every task passes half the time: the most noise there can be
  30% fixed    12 of 40 tasks always pass or always fail, the rest uniform
  10% errors   uniform, and each trial is lost to an infrastructure error (None) 1 time in 10
  drift +d     uniform, and the iteration runs d points above the reference (everything moves together)
  (--from-result adds the per-task rates of a real run)

Designs (each decision of every design sees the same kind of world):

  today        decide() below, the gate before decide_set: the candidate's stages
               against the reference, measured once and reused; one candidate.
               Sims: the candidate's only.
  new          gate.decide_set() with gate.sized(): K candidates; with K > 1 each runs
               GateConfig.screen trials and only the best goes on; its gate runs
               beside the incumbent's own trials (the reference only sharpens
               the early stops). Sims: the screen, the candidate's and the incumbent's.
  new, no ref  the same without the reference (every look concurrent only).
  Bonferroni   every candidate runs its own gate at alpha / K beside one shared
               incumbent arm; the largest passing gain is kept.

Columns: "final": the gate's last stage, trials per task per arm (sized to
the noise, averaged over worlds). "false keep": all K candidates do nothing,
the share of iterations that keep one. "+5/+10/+15": one candidate that good
among K-1 that do nothing, the share that keep it. "sims": simulations per
iteration, over candidates drawn from an equal mix of -10, 0, +5 and +10
points. "fixed" (K = 1): the sims of a fixed-size exact test, on the same
arms as the design (today: the candidate against the reference; new: both
arms counted), that keeps +10 as often as the design does, its trials per
arm interpolated between whole counts (generous to it); "ratio" = sims / fixed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from bisect import bisect_right
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from benchmarks.compare_power import run_compare_table  # noqa: E402
from benchmarks.noise_shapes import NULL_SHARE, cut, drift_of, interpolated_size, shape_rates  # noqa: E402
from evolver.evolution.gate import (  # noqa: E402
    GateConfig,
    RewardTable,
    Stage,
    Verdict,
    decide_set,
    evaluate_set,
    pass_rates,
    set_stages,
    shift_rates,
    sized,
)
from evolver.evolution.gate.permutation import Block  # noqa: E402
from evolver.evolution.gate.set_gate import look  # noqa: E402

REFERENCE_TRIALS = 6
# 1,000 relabellings instead of 5,000 make the decisions that keep several times faster; the p-values
# are coarser but still valid (noise_floor makes the same trade).
PERMUTATIONS = 1000
FIXED_SIZES = range(1, 17)  # trials per arm of the fixed-size test
MIX = (-0.10, 0.0, 0.05, 0.10)
POWER = (0.05, 0.10, 0.15)
SHAPES = ("uniform", "bimodal", "coin flips", "30% fixed", "10% errors", "drift +2", "drift +5", "drift +10")


class World:
    """One decision's tasks, pass rates and reference; arm() draws an arm's 0/1 trials in the iteration's window."""

    def __init__(self, rng: random.Random, shape: str, args: dict) -> None:
        self.rng = rng
        self.missing = 0.1 if shape == "10% errors" else 0.0
        self.rates = shape_rates(rng, shape, args["tasks"], args["rates"])
        self.now = shift_rates(self.rates, drift_of(shape)) if drift_of(shape) else self.rates
        self.reference = self.draw(self.rates, REFERENCE_TRIALS)

    def draw(self, rates: list[float], n: int) -> dict[str, list[float | None]]:
        rng, missing = self.rng, self.missing
        return {
            f"t{i}": [None if missing and rng.random() < missing else float(rng.random() < p) for _ in range(n)]
            for i, p in enumerate(rates)
        }

    def arm(self, effect: float, n: int) -> dict[str, list[float | None]]:
        """Trials in the iteration's window of an arm `effect` better than the incumbent."""
        return self.draw(shift_rates(self.now, effect) if effect else self.now, n)


# --- today's gate: the single-candidate gate decide_set replaced, kept here as the baseline it is measured against


def decide(incumbent: RewardTable, candidate: RewardTable, config: GateConfig, *, stage: int) -> Verdict:
    """One candidate's look at `stage` against the incumbent's reference results, measured once and reused.

    The same looks as decide_set's (futility, then the final test and the
    regression suite), but every look compares with the reference alone, so a
    drift between the reference and the candidate's window passes for an
    effect. A non-final look returns "reject" or "continue"; only the final
    one may "accept".
    """
    if not 0 <= stage < len(config.stages):
        raise ValueError(f"stage {stage} outside config.stages")
    return look(incumbent, candidate, config, stage, alpha=config.alpha, layout=reference_blocks)


def evaluate(incumbent: RewardTable, run_candidate: Callable[[int], RewardTable], config: GateConfig) -> list[Verdict]:
    """decide's stages in turn; ``run_candidate(n)`` returns the candidate's table with n trials per task (cumulative)."""
    verdicts = []
    for stage, trials in enumerate(config.stages):
        verdicts.append(decide(incumbent, run_candidate(trials), config, stage=stage))
        if verdicts[-1].decision != "continue":
            break
    return verdicts


def reference_blocks(incumbent: RewardTable, candidate: RewardTable, stages: tuple[int, ...]) -> dict[str, list[Block]]:
    """decide's relabelling: one block per task, the candidate's valid trials, each seen from the look that
    ran it, and every valid trial of the reference, seen at every look (it was measured before the first)."""
    blocks = {}
    for task in sorted(candidate.keys() & incumbent.keys()):
        cand = [(float(r), min(bisect_right(stages, j), len(stages) - 1)) for j, r in enumerate(candidate[task]) if r is not None]
        inc = [float(r) for r in incumbent[task] if r is not None]
        if cand and inc:
            blocks[task] = [([r for r, _ in cand], tuple(at for _, at in cand), inc, tuple(range(len(stages))))]
    return blocks


def run_today(world: World, effects: list[float], config: GateConfig) -> tuple[str | None, int]:
    candidate = world.arm(effects[0], config.stages[-1])
    verdict = evaluate(world.reference, lambda n: cut(candidate, n), config)[-1]
    return ("c0" if verdict.decision == "accept" else None), verdict.n_candidate_sims


def run_new(world: World, effects: list[float], config: GateConfig, reference: bool) -> tuple[str | None, int, dict]:
    depth = config.screen + max(config.stages[-1], max(FIXED_SIZES))
    incumbent = world.arm(0.0, depth)
    arms = {f"c{j}": world.arm(e, depth) for j, e in enumerate(effects)}
    ran = {name: 0 for name in arms}

    def run(stage: Stage):
        ran.update({name: stage.candidate_trials for name in stage.alive})
        ran["incumbent"] = stage.incumbent_trials
        return cut(incumbent, stage.incumbent_trials), {name: cut(arms[name], ran[name]) for name in arms}

    verdicts = evaluate_set(list(arms), run, config, reference=world.reference if reference else None)
    sims = sum(ran.values()) * len(world.rates)
    return verdicts[-1].kept, sims, {"incumbent": incumbent, "arms": arms, "first": verdicts[0]}


def run_bonferroni(world: World, effects: list[float], config: GateConfig) -> tuple[str | None, int]:
    """Each candidate's own gate at alpha / K; the incumbent arm runs as long as any candidate does."""
    each = replace(config, alpha=config.alpha / len(effects))
    incumbent = world.arm(0.0, config.stages[-1])
    arms = {f"c{j}": world.arm(e, config.stages[-1]) for j, e in enumerate(effects)}
    passed, ran, inc_ran = {}, 0, 0
    for name, table in arms.items():

        def run(stage: Stage, name: str = name, table: dict = table) -> tuple[dict, dict]:
            return cut(incumbent, stage.incumbent_trials), {name: cut(table, stage.candidate_trials)}

        verdicts = evaluate_set([name], run, each, reference=world.reference)
        last = verdicts[-1]
        ran += last.verdicts[name].n_candidate_sims
        inc_ran = max(inc_ran, last.n_incumbent_sims)
        if last.kept:
            passed[name] = last.verdicts[name].effect
    kept = max(sorted(passed), key=passed.get, default=None)
    return kept, ran + inc_ran


def fixed_input(detail: dict) -> tuple[dict, dict]:
    """The +10 candidate's trials and the incumbent's, for a fixed-size test (one candidate: no screen)."""
    return detail["incumbent"], detail["arms"]["c0"]


def fixed_keeps(inputs: list[tuple[dict, dict]], n: int, concurrent: bool) -> int:
    """How many of the +10 decisions a fixed-size exact test with n trials per arm keeps."""
    one = replace(GateConfig(), stages=(n,), futility=())
    kept = 0
    for incumbent, candidate in inputs:
        if concurrent:
            kept += decide_set(cut(incumbent, n), {"c0": cut(candidate, n)}, one, stage=0).kept == "c0"
        else:
            kept += decide(incumbent, cut(candidate, n), one, stage=0).decision == "accept"
    return kept


def fixed_curve(inputs: list, kept: int, concurrent: bool) -> dict[int, int]:
    """Keeps of the fixed-size test at n = 1, 2, ... up to the first n that keeps as many as the gate did
    (larger n cost the most to compute and are not needed to interpolate)."""
    curve = {}
    for n in FIXED_SIZES:
        curve[n] = fixed_keeps(inputs, n, concurrent)
        if curve[n] >= kept:
            break
    return curve


def scenario_effects(rng: random.Random, scenario: str, k: int) -> list[float]:
    """The K candidates' effects: the named one first, the rest do nothing; "mix" draws each from MIX."""
    if scenario == "mix":
        return [rng.choice(MIX) for _ in range(k)]
    return [float(scenario)] + [0.0] * (k - 1)


def run_row(job: tuple) -> dict:
    """`count` decisions of one (shape, design, K, scenario)."""
    shape, design, k, scenario, count, seed, args = job
    rng = random.Random(f"{seed}:{shape}:{design}:{k}:{scenario}")
    base = GateConfig(permutations=PERMUTATIONS)
    out = {"kept": 0, "noop_kept": 0, "sims": 0, "final": 0, "fixed": {}}
    inputs = []  # for the fixed-size test, at +10
    for _ in range(count):
        world = World(rng, shape, args)
        effects = scenario_effects(rng, scenario, k)
        config = base if design == "today" else sized(base, world.reference)
        if design == "today":
            kept, sims = run_today(world, effects, config)
            if scenario == "0.1" and has_fixed(shape, design, k):
                inputs.append((world.reference, world.arm(0.10, max(FIXED_SIZES))))
        elif design == "Bonferroni":
            kept, sims = run_bonferroni(world, effects, config)
        else:
            kept, sims, detail = run_new(world, effects, config, reference=design == "new")
            if scenario == "0.1" and has_fixed(shape, design, k):
                inputs.append(fixed_input(detail))
        real = kept is not None and effects[int(kept[1:])] > 0
        out["kept"] += real if scenario not in ("0.0", "mix") else kept is not None
        out["noop_kept"] += kept is not None and effects[int(kept[1:])] == 0
        out["sims"] += sims
        out["final"] += config.stages[-1]
    if inputs and has_fixed(shape, design, k):
        out["fixed"] = fixed_curve(inputs, out["kept"], concurrent=design != "today")
    return out


def has_fixed(shape: str, design: str, k: int) -> bool:
    """Rows compared with a fixed-size test: one candidate; not today's gate under drift (both keep
    no-ops far more often than alpha, so "the same error rates" means nothing); not with missing
    trials (its exact test then takes seconds per decision)."""
    return (
        k == 1
        and design in ("today", "new", "new, no ref")
        and shape != "10% errors"
        and not (design == "today" and shape.startswith("drift"))
    )


def rows_to_run(shapes: list[str]) -> list[tuple[str, str, int]]:
    rows = [(shape, "today", 1) for shape in shapes if shape in ("uniform", "coin flips") or shape.startswith("drift")]
    rows += [(shape, "new", k) for shape in shapes for k in (1, 2, 4)]
    rows += [("uniform", "new, no ref", 1), ("uniform", "Bonferroni", 2), ("uniform", "Bonferroni", 4)]
    return rows


def scenarios_of(k: int) -> list[str]:
    return ["0.0", *map(str, POWER), *(["-0.1"] if k == 1 else ["mix"])]


def summarise(shape: str, design: str, k: int, parts: dict[str, dict], decisions: int, tasks: int) -> dict:
    count = {s: decisions * (NULL_SHARE if s == "0.0" else 1) for s in parts}
    rate = {s: parts[s]["kept"] / count[s] for s in parts}
    sims = {s: parts[s]["sims"] / count[s] for s in parts}
    mix = sum(sims[str(e)] for e in MIX) / len(MIX) if k == 1 else sims["mix"]
    power = {n: kept / decisions for n, kept in parts["0.1"]["fixed"].items()}
    size = interpolated_size(power, rate["0.1"]) if has_fixed(shape, design, k) else math.nan
    arms = 1 if design == "today" else 2  # today's reference is reused, not counted
    fixed = arms * size * tasks
    return {
        "shape": shape,
        "design": design,
        "k": k,
        "false": rate["0.0"],
        **{f"+{round(100 * e)}": rate[str(e)] for e in POWER},
        "noop_beside": parts["0.1"]["noop_kept"] / decisions,
        "sims": mix,
        "fixed": fixed,
        "final": parts["0.0"]["final"] / count["0.0"],
    }


def print_table(results: list[dict]) -> None:
    print(
        f"{'shape':<12}{'design':<13}{'K':>2}{'final':>6}{'false keep':>11}{'+5':>7}{'+10':>7}{'+15':>7}{'sims':>7}{'fixed':>7}{'ratio':>7}"
    )
    for r in results:
        fixed = f"{r['fixed']:>7.0f}{r['sims'] / r['fixed']:>7.2f}" if math.isfinite(r["fixed"]) else f"{'-':>7}{'-':>7}"
        print(
            f"{r['shape']:<12}{r['design']:<13}{r['k']:>2}{r['final']:>6.1f}{r['false']:>11.3f}{r['+5']:>7.3f}"
            f"{r['+10']:>7.3f}{r['+15']:>7.3f}{r['sims']:>7.0f}{fixed}"
        )


def load_rates(path: str) -> list[float]:
    """Per-task pass rates from an `evolver eval` result.json (infrastructure errors left out)."""
    table: dict[str, list[float | None]] = {}
    for sim in json.loads(Path(path).read_text())["simulations"]:
        table.setdefault(sim["task_id"], []).append(None if sim["outcome"] == "infra_error" else sim["reward"])
    return list(pass_rates(table).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=400, help="decisions per cell of the table")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=40, help="gate tasks (ignored with --from-result)")
    parser.add_argument("--from-result", help="an `evolver eval` result.json: one more shape, its per-task rates")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--compare", action="store_true", help="the two-sided comparison of `evolver compare` instead of the gate")
    args = parser.parse_args()
    if args.compare:
        started = time.perf_counter()
        run_compare_table(args, {"tasks": args.tasks, "rates": None})
        print(f"({time.perf_counter() - started:.0f} s)")
        return

    started = time.perf_counter()
    rates = load_rates(args.from_result) if args.from_result else None
    shapes = [*SHAPES, *([f"from {Path(args.from_result).name}"] if rates else [])]
    shared = {"tasks": len(rates) if rates else args.tasks, "rates": rates}
    rows = rows_to_run(shapes)
    jobs = [
        (shape, design, k, s, args.decisions * (NULL_SHARE if s == "0.0" else 1), args.seed, shared)
        for shape, design, k in rows
        for s in scenarios_of(k)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        parts = iter(pool.map(run_row, jobs, chunksize=1))
    results = [
        summarise(shape, design, k, {s: next(parts) for s in scenarios_of(k)}, args.decisions, shared["tasks"]) for shape, design, k in rows
    ]

    config = GateConfig()
    null = NULL_SHARE * args.decisions
    print(
        f"{shared['tasks']} tasks; {args.decisions} decisions per cell, {null} for false keeps (2 SE: at most "
        f"{2 * math.sqrt(0.25 / args.decisions):.3f}; {2 * math.sqrt(0.05 * 0.95 / null):.3f} near 0.05); "
        f"seed {args.seed}; alpha {config.alpha}; base stages {config.stages}, futility {config.futility}; "
        f"screen {config.screen} trial(s) per task; {PERMUTATIONS} relabellings per final test"
    )
    print()
    print_table(results)
    print()
    beside = [r for r in results if r["k"] > 1]
    print(
        "a candidate that does nothing kept beside a +10 one: "
        + ", ".join(f"{r['shape']} {r['design']} K={r['k']}: {r['noop_beside']:.3f}" for r in beside if r["shape"] == "uniform")
    )
    print(
        "(incumbent trials, candidate trials) per task after each stage, before sizing: "
        + "; ".join(f"K={k} {set_stages(config, k)}" for k in (1, 2))
    )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
