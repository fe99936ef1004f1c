"""The run's gate policy: what a run measures, keeps and rolls back, judged for the run it ends with (docs/search.md).

Three policies, named by the ``gate_policy`` setting:

    population    (the default) a pool of candidates: each iteration's parent is drawn from the pool's per-task
                  Pareto front, its children are screened on a few analysis tasks beside it, and only those that
                  pass run the gate tasks and join the pool (gate.population); at the end the pool's pick is
                  audited against the base, as the audited policy's best is.
    audited       one lineage: a lenient staged gate per iteration, which spends little on most candidates and
                  keeps on modest evidence; no fresh reference per kept candidate; and at the end an audit of the
                  run's best against its base, side by side on fresh trials, that rolls the run back to its base
                  unless the best is shown better. The audit bounds the chance that a run ends worse than it
                  began by its alpha, whatever the proposals were.
    per-decision  one lineage under the gate of docs/gate.md: each keep's false-accept rate bounded by alpha,
                  the incumbent's reference measured afresh for every new incumbent, no audit.

Pure: a Policy is plain data recorded in the run's manifest; iteration_gate() and judge_iteration()
say how a lineage iteration's candidates are judged (evolver's decide_set, through evaluate_set), and
evaluate_audit() drives the audit's looks (evolver's staged one-sided comparison) through the
caller's measuring function, so a killed run replays to the same decisions, and
benchmarks/search.py drives the very code the loop runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

from evolver.evolution.gate.compare import CompareConfig, Comparison, decide_compare
from evolver.evolution.gate.permutation import RewardTable, concurrent_blocks
from evolver.evolution.gate.population import PopulationConfig
from evolver.evolution.gate.power import sized
from evolver.evolution.gate.set_gate import GateConfig, SetVerdict, Stage, Verdict, evaluate_set, first_trials, look
from evolver.kinds import GATE_POLICIES

# The audited policy's gate, measured in benchmarks/search.py (docs/search.md): kept at alpha 0.2, on a first look
# at one trial per task that stops most candidates (z below 0.5), a second at two and the last at four (unless
# gate_stages sets others).
LENIENT_ALPHA = 0.2
LENIENT_STAGES, LENIENT_FUTILITY = (1, 2, 4), (0.5, 1.0)
# Before it, each candidate runs one trial per task alone and goes on only when its z against everything
# measured of the incumbent so far (its history) reaches SCREEN_BAR; the best of those goes on, on fresh trials.
SCREEN_BAR = 0.5
# The audit: compare's exact one-sided test, one more trial per task of each arm a look, every task every look.
# Four trials at most: a lineage that four do not show better is rolled back (docs/search.md: five or six cost more
# of the search than they save).
AUDIT_TRIALS = 4
BASELINE_TRIALS = 2  # the audited policy's reference of the base: enough to see the noise and an all-pass task set


@dataclass(frozen=True)
class Policy:
    """A run's gate policy, as its manifest records it."""

    name: str
    gate: GateConfig  # each iteration's gate (per-decision: stretched to the noise of the incumbent's reference)
    reference_trials: int  # trials per gate task of the base's reference, measured before the first iteration
    fresh_reference: bool  # each new incumbent gets a reference of its own (per-decision), or none (audited)
    audit: Optional[CompareConfig]  # the end-of-run audit of the best against the base; None: no audit
    screen_bar: Optional[float] = None  # z a candidate's lone trials must reach against the incumbent's history; None: no such screen
    population: Optional[PopulationConfig] = None  # the population search's settings; None: one lineage

    def to_json(self) -> dict:
        return asdict(self)


def make_policy(name: str, gate: GateConfig) -> Policy:
    """The named policy (evolver.kinds.GATE_POLICIES) around the run's gate settings (``gate``: alpha, min_effect and
    stages as configured)."""
    if name not in GATE_POLICIES:
        raise ValueError(f"unknown gate policy {name!r}; one of {', '.join(GATE_POLICIES)}")
    return GATE_POLICIES[name].load(__package__)(gate)


def _audit(gate: GateConfig) -> CompareConfig:
    """The end-of-run audit: the best against the base, one-sided, at the configured alpha (the bound on ending worse)."""
    return CompareConfig(alpha=gate.alpha, sided="better", max_trials=AUDIT_TRIALS, settle=0)


def population_policy(gate: GateConfig) -> Policy:
    """No gate per iteration (its pool is judged by gate.population); audited at the configured alpha. Its gate is the
    audit's looks, which the run's noise floor describes."""
    config = PopulationConfig()
    looks = tuple(range(1, AUDIT_TRIALS + 1))
    described = replace(gate, stages=looks, futility=tuple(0.0 for _ in looks[1:]))
    return Policy(
        name="population", gate=described, reference_trials=config.gate_trials, fresh_reference=False, audit=_audit(gate), population=config
    )


def audited_policy(gate: GateConfig) -> Policy:
    """Each iteration judged at the lenient alpha (and the lenient stages, unless others are configured); audited at the
    configured alpha."""
    tuned = gate.stages == GateConfig().stages  # the configured stages are the default: the lenient ones replace them
    lenient = replace(gate, alpha=LENIENT_ALPHA, **(dict(stages=LENIENT_STAGES, futility=LENIENT_FUTILITY) if tuned else {}))
    return Policy(
        name="audited", gate=lenient, reference_trials=BASELINE_TRIALS, fresh_reference=False, audit=_audit(gate), screen_bar=SCREEN_BAR
    )


def per_decision_policy(gate: GateConfig) -> Policy:
    """The gate as configured, a fresh reference for every new incumbent, no audit."""
    return Policy(name="per-decision", gate=gate, reference_trials=gate.stages[-1], fresh_reference=True, audit=None)


def recorded_policy(policy: Mapping, gate: Mapping) -> Policy:
    """The policy a run recorded in its manifest (Policy.to_json()); a run from before the policies recorded
    none and gated per decision with its recorded ``gate``."""
    if not policy:
        return per_decision_policy(GateConfig(**_tupled(gate)))
    audit = policy.get("audit")
    if audit is not None and "stages" in audit:  # recorded before compare's exact test: its looks, judged by that test now
        audit = {"alpha": audit["alpha"], "sided": audit["sided"], "max_trials": audit["stages"][-1], "settle": 0}
    population = policy.get("population")
    return Policy(
        name=policy["name"],
        gate=GateConfig(**_tupled(policy["gate"])),
        reference_trials=policy["reference_trials"],
        fresh_reference=policy["fresh_reference"],
        audit=None if audit is None else CompareConfig(**audit),
        screen_bar=policy.get("screen_bar"),
        population=None if population is None else PopulationConfig(**population),
    )


def _tupled(data: Mapping) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


def iteration_gate(policy: Policy, reference: Optional[RewardTable]) -> GateConfig:
    """The gate of one iteration: per-decision's stretched to the noise of the incumbent's reference; audited's as it is."""
    if policy.fresh_reference and reference:
        return sized(policy.gate, reference)
    return policy.gate


def judge_iteration(
    policy: Policy,
    names: Sequence[str],
    run: Callable[[Stage], tuple[RewardTable, Mapping[str, RewardTable]] | None],
    *,
    reference: Optional[RewardTable],
    on_stage: Callable[[Stage, SetVerdict], None] | None = None,
) -> list[SetVerdict]:
    """An iteration's stages over its candidates; at most one is kept. Each stage's verdict is a SetVerdict.

    per-decision: gate.evaluate_set with the policy's gate. audited (``screen_bar`` set), when there is a
    history of the incumbent (``reference``: everything measured of it so far): first a screen, each
    candidate one trial per task alone, judged against that history; the best candidate whose z reaches
    the bar then runs evaluate_set's stages alone, on fresh trials beside the incumbent (the screen's
    trials, which chose it, never reach the test), stage numbers and simulation counts going on from the screen's.
    """
    gate = iteration_gate(policy, reference)
    if policy.screen_bar is None or not reference:
        return evaluate_set(names, run, gate, reference=reference, on_stage=on_stage)
    count = 1 + len(gate.stages)
    screen = Stage(0, count, 0, 1, tuple(sorted(names)))
    measured = run(screen)
    if measured is None:
        return []
    verdict = _screen_verdict(policy, reference, measured[1], names)
    if on_stage is not None:
        on_stage(screen, verdict)
    if verdict.decided:
        return [verdict]
    [name] = verdict.alive
    lone = {task: rewards[:1] for task, rewards in measured[1][name].items()}

    def shifted(stage: Stage) -> Stage:
        return Stage(stage.index + 1, count, stage.incumbent_trials, stage.candidate_trials + 1, stage.alive)

    def run_fresh(stage: Stage):
        got = run(shifted(stage))
        return None if got is None else (got[0], {name: {t: r[1:] for t, r in got[1][name].items()}})

    def counted(stage: SetVerdict) -> SetVerdict:
        mine = stage.verdicts[name]
        sims = mine.n_candidate_sims + sum(len(r) for r in lone.values())
        verdicts = {**verdict.verdicts, name: replace(mine, stage=mine.stage + 1, n_candidate_sims=sims)}
        return replace(
            stage,
            stage=stage.stage + 1,
            verdicts=dict(sorted(verdicts.items())),
            next_trials=None if stage.next_trials is None else stage.next_trials + 1,
        )

    def saved(stage: Stage, set_verdict: SetVerdict) -> None:
        if on_stage is not None:
            on_stage(shifted(stage), counted(set_verdict))

    return [verdict, *map(counted, evaluate_set([name], run_fresh, gate, reference=reference, on_stage=saved))]


def _screen_verdict(policy: Policy, history: RewardTable, tables: Mapping[str, RewardTable], names: Sequence[str]) -> SetVerdict:
    """The screen's verdict: each candidate's lone trial per task against the incumbent's history (a futility
    look at screen_bar); the best of those that reach it goes on, the others are screened out."""
    bar = replace(policy.gate, stages=(1, 2), futility=(policy.screen_bar,))
    verdicts: dict[str, Verdict] = {}
    for name in sorted(names):
        mine = look(history, first_trials(tables[name], 1), bar, 0, alpha=bar.alpha, layout=concurrent_blocks)
        if mine.decision == "reject":
            mine = replace(mine, reason=f"Screened out: {mine.reason.removeprefix('Rejected early: ')}")
        verdicts[name] = mine
    going = sorted((n for n, v in verdicts.items() if v.decision == "continue"), key=lambda n: -verdicts[n].effect)
    for other in going[1:]:
        verdicts[other] = replace(
            verdicts[other],
            decision="reject",
            reason=f"Screened out: behind {going[0]} against the incumbent's "
            f"history ({100 * verdicts[other].effect:+.1f} points, {going[0]} {100 * verdicts[going[0]].effect:+.1f}).",
        )
    winner = going[0] if going else None
    after = iteration_gate(policy, history).stages[0]
    reason = (
        f"{winner} of {len(names)} goes on: {verdicts[winner].reason}"
        if winner
        else f"Kept none of {len(names)}: none reached z={policy.screen_bar:g} against the incumbent's history."
    )
    return SetVerdict(
        stage=0,
        decided=winner is None,
        kept=None,
        alive=(winner,) if winner else (),
        next_incumbent_trials=after if winner else None,
        next_trials=after + 1 if winner else None,
        n_incumbent_sims=0,
        reason=reason,
        verdicts=verdicts,
    )


@dataclass(frozen=True)
class AuditLook:
    """One look of the audit, as evaluate_audit asks its measuring function to run it."""

    index: int
    count: int
    trials: int  # trials per task in all, of each arm (the base and the best), side by side


def evaluate_audit(
    policy: Policy,
    run: Callable[[AuditLook], tuple[RewardTable, RewardTable] | None],
    on_look: Callable[[AuditLook, Comparison], None] | None = None,
) -> list[Comparison]:
    """The audit's looks, each judged by the staged one-sided comparison; stops at the first that decides.

    ``run(look)`` brings the base and the best to ``look.trials`` trials per task, interleaved, and
    returns (base's table, best's table), or None when the look cannot be judged (most simulations
    failed): the audit ends there undecided, which keeps nothing it has not shown. The best stands
    only when the last comparison says "better"; audit_holds() says so.
    """
    if policy.audit is None:
        return []
    stages = policy.audit.stages
    out: list[Comparison] = []
    for index, trials in enumerate(stages):
        look = AuditLook(index, len(stages), trials)
        measured = run(look)
        if measured is None:
            break
        base, best = measured
        out.append(decide_compare(base, best, policy.audit, look=index))
        if on_look is not None:
            on_look(look, out[-1])
        if out[-1].decision != "continue":
            break
    return out


def audit_holds(looks: Sequence[Comparison]) -> bool:
    """Whether the audit showed the best better than the base."""
    return bool(looks) and looks[-1].decision == "better"


def audit_cost(policy: Policy, tasks: int) -> int:
    """The most simulations the audit can take: both arms at its last look."""
    return 0 if policy.audit is None else 2 * tasks * policy.audit.stages[-1]
