"""What the run report shows, read from the run store through evolver.cli.history: plain data, no rendering."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from evolver import __version__
from evolver.cli.compare import transfer_rows
from evolver.cli.history import gate_table, history_rows, judged, latest_rewards, parent_of, policy_lines, show, status
from evolver.cli.turns import failed_analysis
from evolver.data import RoleUsage, cached_text
from evolver.evaluation.metrics import mean_reward
from evolver.evolution.triage import triage
from evolver.store.rundir import RunDir, measured

ROLE_ORDER = ("agent", "user", "judge", "meta")
OUTSIDE_ITERATIONS = "baseline, references, holdout"  # what the run measured outside any iteration's own candidates


@dataclass(frozen=True)
class Cost:
    """One role's usage; ``usd`` is None when tokens were used but no price is known (a local or
    self-hosted model, a model litellm has no price for): unknown, never $0.00."""

    prompt_tokens: int
    completion_tokens: int
    usd: Optional[float]
    cached_tokens: int = 0  # of the prompt tokens, read from the provider's prompt cache
    cache_reported_tokens: int = 0  # of the prompt tokens, those whose provider said how many it read from its cache

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def cached_text(self) -> str:
        return cached_text(self.cached_tokens, self.prompt_tokens, self.cache_reported_tokens)

    def text(self) -> str:
        if self.usd is not None:
            return f"${self.usd:.4f}"
        return "unknown" if self.tokens else "-"


def cost_of(usage: RoleUsage) -> Cost:
    tokens = usage.prompt_tokens + usage.completion_tokens
    cost = getattr(usage, "cost", None)
    usd = None if cost is None or (cost == 0 and tokens) else cost
    return Cost(usage.prompt_tokens, usage.completion_tokens, usd, usage.cached_tokens, usage.cache_reported_tokens)


@dataclass(frozen=True)
class CostRow:
    name: str  # "iteration 3", or OUTSIDE_ITERATIONS
    iteration: Optional[int]
    roles: dict[str, Cost]


@dataclass(frozen=True)
class Candidate:
    label: str  # "3", or "3a", "3b" in an iteration of several
    iteration: int
    parent: str  # the label of the candidate it was built on (the kept one, or a pool member), or "base"
    title: str
    rationale: str
    status: str  # accepted (joined the pool, in a population run), rejected, undecided, invalid, refused, no_patch
    reason: str
    kept: bool  # on the path from the base to the run's best (a lineage's kept candidates)
    best: bool  # the run's best now (after any rollback)
    branch: Optional[str]
    commit: Optional[str]
    gate_incumbent: Optional[float]
    gate_candidate: Optional[float]
    effect: Optional[float]  # the gate's last look: mean per-task gain, reward units
    ci_low: Optional[float]  # its one-sided lower confidence bound
    p_value: Optional[float]
    looks: int  # gate stages the candidate went through
    analysis: Optional[float]  # a kept candidate's analysis score, once measured
    diff: str
    flips: list[dict]  # gate tasks whose pass rate changed against the incumbent: task, incumbent, candidate
    findings: list[str]  # the static scan's
    investigation: dict = field(default_factory=dict)  # what its proposer did (proposers.ProposalResult.stats), with the transcript's path
    joined: bool = False  # a member of a population run's pool
    screen: dict = field(default_factory=dict)  # a population child's screen beside its parent (gate.population.ScreenVerdict)
    audit: str = ""  # what the run's audit made of it, if it judged this one

    @property
    def verdict(self) -> str:
        """As the report says it: kept (on the best's path), joined (the pool), or its status."""
        return "kept" if self.kept else "joined" if self.joined else self.status.replace("_", " ")


@dataclass(frozen=True)
class TaskGrid:
    """Pass rate of every gate task (rows) for the base and each candidate measured on the gate
    (columns); ``flips`` is +1/-1 where a candidate's rate rose/fell against its incumbent's."""

    tasks: list[str]
    columns: list[str]
    rates: list[list[Optional[float]]]
    flips: list[list[int]]


@dataclass(frozen=True)
class RunFacts:
    run_id: str
    repo: str
    status: str
    stop_reason: Optional[str]
    created: float
    elapsed: float
    domain: str
    split_note: str
    models: dict[str, str]
    settings: dict[str, str]
    gate: dict[str, str]
    versions: dict[str, str]
    base_commit: str
    base_branch: Optional[str]
    task_counts: dict[str, int]
    iterations_done: int
    iterations_target: int
    baseline_gate: Optional[float]
    baseline_analysis: Optional[float]
    candidates: list[Candidate]
    best_label: str  # "base" or a candidate's label
    best_commit: str
    best_moves: list[dict]  # iteration, label, reason, at: every time `best` moved, rollbacks included
    costs: list[CostRow]
    grid: TaskGrid
    holdout: Optional[dict]  # base, best, tasks, trials; None when none was measured
    decisions: int
    alpha: float
    policy: list[str] = field(default_factory=list)  # what the gate policy promised and did (history.policy_lines), audits included
    transfers: list[dict] = field(default_factory=list)  # evolver.cli.compare.transfer_rows
    triage: list[dict] = field(default_factory=list)  # the flagged tasks (evolver.evolution.triage): task, flags, why
    # Per iteration (None: outside the iterations), per provider endpoint and model: permits, 429s, seconds waited.
    rate_limits: list[tuple[Optional[int], dict]] = field(default_factory=list)
    # The failed simulations of the analysis evaluations (what the proposers read): what the harness changed, the command to see it.
    failed_analysis: list[dict] = field(default_factory=list)
    population: bool = False  # a population run: its pool is the base and the candidates that joined
    generated: float = field(default_factory=time.time)
    evolver_version: str = __version__

    @property
    def best_branch(self) -> str:
        return f"evolver/{self.run_id}/best"

    @property
    def best(self) -> Optional[Candidate]:
        return next((c for c in self.candidates if c.label == self.best_label), None)

    def best_remeasured(self) -> Optional[float]:
        """The best's gate score measured afresh as the next iteration's reference: free of the luck that selected it (a pool's
        children are judged against their parent's own trials, so a population run measures it again only in its audit)."""
        if self.population:
            return None
        return next((c.gate_incumbent for c in self.candidates if c.parent == self.best_label and c.gate_incumbent is not None), None)

    def total_costs(self) -> dict[str, Cost]:
        """Per role over the whole run; a role's dollars are unknown when any part of them is."""
        out = {}
        for role in self.roles():
            parts = [row.roles[role] for row in self.costs if role in row.roles]
            known = all(p.usd is not None or not p.tokens for p in parts)
            out[role] = Cost(
                sum(p.prompt_tokens for p in parts),
                sum(p.completion_tokens for p in parts),
                sum(p.usd or 0.0 for p in parts) if known else None,
                sum(p.cached_tokens for p in parts),
                sum(p.cache_reported_tokens for p in parts),
            )
        return out

    def roles(self) -> list[str]:
        seen = {role for row in self.costs for role in row.roles}
        return [r for r in ROLE_ORDER if r in seen] + sorted(seen - set(ROLE_ORDER))


def collect(run: RunDir) -> RunFacts:
    manifest, state = run.manifest(), run.state()
    records = run.iterations()
    kept = {r.iteration: r.kept for r in records}

    def label_of(iteration: int) -> str:
        return "base" if iteration == 0 else kept.get(iteration) or str(iteration)

    best_label = run.best_label(state) or "base"
    parents = {c.label: str(parent_of(r)) for r in records for c in r.candidates}
    on_path, at = set(), best_label  # a population run's best and its ancestors, back to the base
    while at in parents and at not in on_path:
        on_path.add(at)
        at = parents[at]
    rows = {row["candidate"]: row for row in history_rows(run)}
    candidates = []
    for record in records:
        for cand in record.candidates:
            info = show(run, cand.label)
            last = cand.verdicts[-1] if cand.verdicts else {}
            if last and last.get("p_value") is None and record.gate_incumbent is not None and cand.gate_candidate is not None:
                # Stopped before the final test (early, or screened out among several, where the effect is
                # the gap to the best candidate): the gain shown is against the incumbent's gate score.
                last = {**last, "effect": cand.gate_candidate - record.gate_incumbent}
            if not last and cand.gate_candidate is not None and record.gate_incumbent is not None:  # a pool child: against its parent
                last = {"effect": cand.gate_candidate - record.gate_incumbent}
            audit = next((a for a in state.audits if judged(a, record, cand)), None)
            candidates.append(
                Candidate(
                    label=cand.label,
                    iteration=record.iteration,
                    parent=str(parent_of(record)) if record.parent_label else label_of(record.parent),
                    title=cand.title,
                    rationale=cand.rationale,
                    status=cand.status,
                    reason=cand.reason,
                    kept=record.kept == cand.label if not record.parent_label else cand.label in on_path,
                    best=rows[cand.label]["is_best"],
                    branch=cand.branch,
                    commit=cand.commit,
                    gate_incumbent=record.gate_incumbent,
                    gate_candidate=cand.gate_candidate,
                    effect=last.get("effect"),
                    ci_low=last.get("ci_low"),
                    p_value=last.get("p_value"),
                    looks=len(cand.verdicts),
                    analysis=rows[cand.label]["analysis"],
                    diff=info["diff"],
                    flips=info["flips"],
                    findings=list(cand.findings),
                    investigation=dict(cand.investigation),
                    joined=info["joined"],
                    screen=dict(cand.screen),
                    audit="" if audit is None else f"{'stands' if audit.holds else 'rolled back to the base'}: {audit.reason}",
                )
            )
    scores = run.holdout()
    holdout = None
    if scores is not None:
        holdout = {
            "base": scores.get("base"),
            "best": scores.get("best"),
            "tasks": len(manifest.holdout_tasks),
            "trials": manifest.config.get("holdout_trials"),
        }
    return RunFacts(
        run_id=run.run_id,
        repo=manifest.repo,
        status=status(run)["status"],
        stop_reason=state.stop_reason,
        created=manifest.created,
        elapsed=state.elapsed,
        domain=manifest.config.get("domain", ""),
        split_note=manifest.split_note,
        models={role: m.model + (f" at {m.api_base}" if m.api_base else "") for role, m in manifest.models.items()},
        settings={k: _text(v) for k, v in sorted(manifest.config.items())},
        gate={k: _text(v) for k, v in manifest.gate.items()},
        versions=dict(manifest.versions),
        base_commit=manifest.base_commit,
        base_branch=manifest.base_branch,
        task_counts={"analysis": len(manifest.analysis_tasks), "gate": len(manifest.gate_tasks), "holdout": len(manifest.holdout_tasks)},
        iterations_done=state.next_iteration - 1,
        iterations_target=state.iterations_target,
        baseline_gate=mean_reward(latest_rewards(run, "reference-g0")),
        baseline_analysis=mean_reward(latest_rewards(run, "analysis-g0")),
        candidates=candidates,
        best_label=best_label,
        best_commit=state.incumbent_commit,
        best_moves=[
            {"iteration": b.iteration, "label": b.label or label_of(b.iteration), "reason": b.reason, "at": b.at}
            for b in state.best_history
        ],
        costs=_costs(records, state),
        grid=_grid(run, manifest.gate_tasks, candidates),
        holdout=holdout,
        decisions=state.decisions,
        alpha=float(manifest.gate.get("alpha", 0.05)),
        policy=policy_lines(manifest, state),
        transfers=transfer_rows(run.transfers()),
        triage=[{"task": t.task, "flags": t.flags, "why": t.why} for t in triage(measured(run.repo, run.run_id)) if t.flags],
        rate_limits=_rate_limits(records, state),
        failed_analysis=failed_analysis(run),
        population=bool(manifest.policy.get("population")),
    )


def _rate_limits(records, state) -> list[tuple[Optional[int], dict]]:
    """Each iteration's rate-limit counts, then what the run met outside them (the run's total minus its iterations')."""
    rows = [(r.iteration, {lane: t.model_dump() for lane, t in r.rate_limits.items()}) for r in records]
    outside = {}
    for lane, total in state.rate_limits.items():
        spent = [r.rate_limits[lane] for r in records if lane in r.rate_limits and r.iteration < state.next_iteration]
        left = {k: getattr(total, k) - sum(getattr(t, k) for t in spent) for k in ("calls", "limited", "waited")}
        if any(v > 0 for v in left.values()):
            outside[lane] = left
    return rows + ([(None, outside)] if outside else [])


def _costs(records, state) -> list[CostRow]:
    """Each iteration's usage, then what the run charged outside them: the baseline, the fresh
    reference and analysis of each new incumbent, the holdout (the run's total minus its iterations')."""
    rows = [CostRow(f"iteration {r.iteration}", r.iteration, {role: cost_of(u) for role, u in r.usage.items()}) for r in records]
    outside = {}
    finished = [r for r in records if r.iteration < state.next_iteration]  # the run's total holds finished iterations only
    for role, total in state.usage.items():
        spent = [r.usage[role] for r in finished if role in r.usage]
        rest = RoleUsage(
            prompt_tokens=total.prompt_tokens - sum(u.prompt_tokens for u in spent),
            completion_tokens=total.completion_tokens - sum(u.completion_tokens for u in spent),
            cost=max(0.0, total.cost - sum(u.cost for u in spent)),
            cached_tokens=max(0, total.cached_tokens - sum(u.cached_tokens for u in spent)),
            cache_reported_tokens=max(0, total.cache_reported_tokens - sum(u.cache_reported_tokens for u in spent)),
        )
        if rest.prompt_tokens or rest.completion_tokens:
            outside[role] = cost_of(rest)
    return [CostRow(OUTSIDE_ITERATIONS, None, outside)] + rows if outside else rows


def _grid(run: RunDir, tasks: list[str], candidates: list[Candidate]) -> TaskGrid:
    columns = [("base", latest_rewards(run, "reference-g0") or {}, {})]
    for cand in candidates:
        table = gate_table(run, cand.label) if cand.gate_candidate is not None else None
        if table:
            columns.append((cand.label, table, {f["task"]: 1 if f["candidate"] > f["incumbent"] else -1 for f in cand.flips}))
    return TaskGrid(
        tasks=list(tasks),
        columns=[name for name, _, _ in columns],
        rates=[[_rate(table.get(task)) for _, table, _ in columns] for task in tasks],
        flips=[[flips.get(task, 0) for _, _, flips in columns] for task in tasks],
    )


def _rate(rewards) -> Optional[float]:
    valid = [r for r in rewards or [] if r is not None]
    return sum(valid) / len(valid) if valid else None


def _text(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "(default)"
    return str(value)
