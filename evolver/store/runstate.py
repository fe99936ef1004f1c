"""A run's records and their schemas: what the run is (run.json, Manifest), where it stands
(state.json, RunState) and each iteration with its candidates (iterations/NNN.json, IterationRecord),
with the named steps that bring an older record up to this evolver's, and the usage charged to them.

Each record carries its schema and is brought up to this evolver's by named steps when an older one
is read (evolver.store.records); the run's folder that holds them is evolver.store.rundir.RunDir.
docs/run-directory.md is the contract.
"""

from __future__ import annotations

import hashlib
import string
from typing import Iterable, Literal, Optional

from pydantic import BaseModel, Field

from evolver.data import RateTally, RoleModel, RoleUsage, SimRecord, add_tallies
from evolver.store.records import Versioned

IterationStatus = Literal[
    "proposing",
    "no_patch",
    "refused",
    "invalid",
    "evaluating",
    "accepted",
    "rejected",
    "undecided",
]
FINAL_STATUSES = ("no_patch", "refused", "invalid", "accepted", "rejected", "undecided")


MANIFEST_SCHEMA = 5
STATE_SCHEMA = 4
ITERATION_SCHEMA = 3


def _manifest_v1_to_v2(data: dict) -> dict:
    """v1 recorded the embedded server's address among the settings (it is learnt at run time now,
    never a setting), predates the user-role adapter (a v1 run ran its local user without it) and
    the proposer setting (a v1 run proposed with one completion over the digest, and goes on so)."""
    config = {k: v for k, v in data.get("config", {}).items() if k != "local_api_base"}
    return {**data, "config": {"local_user_adapter": False, "proposer": "oneshot", **config}}


def _state_v1_to_v2(data: dict) -> dict:
    """v1 is state.json as evolver wrote it before the file carried a schema: the same fields, kept
    as they are (fields added before the schema, like `charged` or `updated_at`, have defaults)."""
    return dict(data)


def _iteration_v1_to_v2(data: dict) -> dict:
    """v1 is an iteration record as evolver wrote it before the file carried a schema: the same fields,
    kept as they are (its candidates' `investigation`, added with the proposers, defaults to empty)."""
    return dict(data)


def _manifest_v2_to_v3(data: dict) -> dict:
    """v2 predates per-role model arguments (reasoning efforts, the agent_args ... judge_args tables)
    and the learnings file: a v2 run sent no such argument and read no earlier learnings, and goes on so.
    (An evolver that knows only v2 refuses a v3 run rather than meet settings it cannot take.)"""
    none = {f"{role}_reasoning_effort": "" for role in ("agent", "user", "meta")}
    none.update({f"{role}_args": {} for role in ("agent", "user", "meta", "judge")}, learnings_file="")
    return {**data, "config": {**none, **data.get("config", {})}, "schema": 3}


def _manifest_v3_to_v4(data: dict) -> dict:
    """v3 predates configured rate limits (rate_limits): a v3 run configured none, and goes on learning each
    provider's limit from its answers, as every run does for a model it has no limit for."""
    return {**data, "config": {"rate_limits": {}, **data.get("config", {})}}


def _manifest_v4_to_v5(data: dict) -> dict:
    """v4 predates the gate policy (gate_policy): a v4 run gated every decision on its own, measured a reference
    for every new incumbent and audited nothing, and goes on so (its policy is rebuilt from its `gate`)."""
    return {**data, "config": {"gate_policy": "per-decision", **data.get("config", {})}}


def _state_v2_to_v3(data: dict) -> dict:
    """v2 predates the end-of-run audit: a v2 run was audited by nothing."""
    return {"audits": [], **data}


def _state_v3_to_v4(data: dict) -> dict:
    """v3 predates the population search: a v3 run kept one lineage, had no pool, and named its best by iteration
    only (best_label None: the kept candidate of that iteration, RunState.best)."""
    return {"pool": [], "best_label": None, **data}


def _iteration_v2_to_v3(data: dict) -> dict:
    """v2 predates the population search: its candidates came from the iteration's parent by number, with no
    screen on analysis tasks and no record of the proposer's tries."""
    return dict(data)


# Named steps from each older schema to the next; a run is opened through all it needs.
MANIFEST_MIGRATIONS = {1: _manifest_v1_to_v2, 2: _manifest_v2_to_v3, 3: _manifest_v3_to_v4, 4: _manifest_v4_to_v5}
STATE_MIGRATIONS = {1: _state_v1_to_v2, 2: _state_v2_to_v3, 3: _state_v3_to_v4}
ITERATION_MIGRATIONS = {1: _iteration_v1_to_v2, 2: _iteration_v2_to_v3}


class Manifest(Versioned):
    """What the run is (run.json): the first file of its folder, written before anything else, and
    written again once its tasks are chosen."""

    SCHEMA, MIGRATIONS, WHAT = MANIFEST_SCHEMA, MANIFEST_MIGRATIONS, "run.json"

    run_id: str
    created: float
    repo: str
    base_commit: str
    base_branch: Optional[str]
    config: dict
    versions: dict[str, str]
    models: dict[str, RoleModel]
    analysis_tasks: list[str]
    gate_tasks: list[str]
    holdout_tasks: list[str]
    split_note: str
    gate: dict
    policy: dict = Field(default_factory=dict)  # the gate policy (gate.search.Policy); empty in a v4 run: per-decision around `gate`

    @property
    def tasks_chosen(self) -> bool:
        """False for a run killed while it listed its tasks (a run has two gate tasks at least): `--resume` chooses them."""
        return bool(self.gate_tasks)


class BestChange(BaseModel):
    iteration: int
    commit: str
    label: Optional[str] = None  # the candidate ("base" for the base); None in a run from before the pool: the iteration's kept one
    reason: str
    at: float


class PoolMember(BaseModel):
    """A member of a population run's pool (gate_policy "population"): a child that passed its screen and the first
    part of the gate (the base is a member too, never recorded); its gate trials are its evaluations iter-NNN-gate
    and iter-NNN-gate2 (the base's: reference-g0)."""

    label: str  # the candidate's label ("3", "3b"); "base" for the base
    commit: str
    parent: str  # the member it came from; "" for the base
    iteration: int  # 0 for the base


class AuditLook(BaseModel):
    """One look of an end-of-run audit: the staged one-sided comparison of the best (B) against the base (A) as it
    judged that look (evolver.evolution.gate.compare.Comparison, recorded field for field)."""

    decision: str  # "better", "worse", "no evidence" or "continue"
    reason: str
    effect: float  # mean per-task delta, best - base
    ci: Optional[tuple[float, float]]
    p_value: Optional[float]
    alpha_spent: float
    information: Optional[float] = None  # None in an audit recorded before comparisons measured it
    look: int
    final: bool
    n_tasks: int
    n_a_sims: int  # the base's simulations
    n_b_sims: int  # the best's


class Audit(BaseModel):
    """An end-of-run audit of the run's best against its base (audited and population policies, gate.search)."""

    best: int  # the best's iteration (0 never: the base is not audited)
    label: Optional[str] = None  # the candidate judged; None in a run from before audits recorded it: `best`'s kept one
    best_commit: str
    holds: bool  # the best was shown better; else the run was rolled back to its base
    reason: str
    looks: list[AuditLook] = Field(default_factory=list)

    @property
    def candidate(self) -> str:
        """The label of the candidate judged, as `named` takes it: the recorded one, else its iteration's number."""
        return self.label or str(self.best)


class RunState(Versioned):
    """Where the run stands (state.json)."""

    SCHEMA, MIGRATIONS, WHAT = STATE_SCHEMA, STATE_MIGRATIONS, "state.json"

    status: Literal["running", "interrupted", "paused", "finished"] = "running"  # paused: the meta-LLM stayed down
    stop_reason: Optional[str] = None
    iterations_target: int
    next_iteration: int = 1
    incumbent: int = 0  # iteration number of the incumbent (the run's best); 0 is the base
    incumbent_commit: str
    # The candidate the run's best is ("" the base); None in a run from before the pool: the kept one of `incumbent`.
    best_label: Optional[str] = ""
    pool: list[PoolMember] = Field(default_factory=list)  # a population run's members, in the order they joined
    generation: int = 0  # bumps when the incumbent changes: fresh reference trials, fresh seeds
    consecutive_rejections: int = 0
    decisions: int = 0  # candidates that reached the gate's final word
    usage: dict[str, RoleUsage] = Field(default_factory=dict)
    rate_limits: dict[str, RateTally] = Field(default_factory=dict)  # per provider endpoint and model, as usage is per role
    best_history: list[BestChange] = Field(default_factory=list)
    # The end-of-run audits of the best against the base (audited policy): what was audited, each look, the outcome.
    audits: list[Audit] = Field(default_factory=list)
    elapsed: float = 0.0  # seconds spent driving the run, summed over resumes
    updated_at: float = 0.0  # when the driver last wrote this file (status adds the time since, while it runs)
    current_step: str = ""
    # Evaluation name -> {simulation: fingerprint} already in `usage`: each one is charged once,
    # and saved in the same write as the usage it added, so no kill can lose or double it.
    charged: dict[str, dict[str, str]] = Field(default_factory=dict)


class CandidateRecord(BaseModel):
    """One proposal of an iteration: its patch, branch, and how far it got."""

    label: str  # "3" when the iteration has one candidate; "3a", "3b", ... when it has several
    status: IterationStatus = "proposing"
    title: str = ""
    rationale: str = ""
    edits: list[dict] = Field(default_factory=list)
    responses: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    branch: Optional[str] = None
    commit: Optional[str] = None
    reason: str = ""
    findings: list[str] = Field(default_factory=list)  # the static scan's, one line each: path:line: rule: detail
    investigation: dict = Field(
        default_factory=dict
    )  # what the proposer did: turns, tools, edits, tries, transcript (proposers.ProposalResult.stats)
    verdicts: list[dict] = Field(default_factory=list)
    gate_candidate: Optional[float] = None
    # The proposer's tries: {"evaluation", "agent" (the digest of the agent/ it ran), "tasks"}; a population run's
    # screen reuses those of the very agent it submitted.
    tries: list[dict] = Field(default_factory=list)
    screen: dict = Field(default_factory=dict)  # population: its screen beside its parent (gate.population.ScreenVerdict)
    gate_part: dict = Field(default_factory=dict)  # population: the first part of the gate against its parent's trials


class IterationRecord(Versioned):
    """One iteration: its candidates, all from the same parent, and the one kept, if any."""

    SCHEMA, MIGRATIONS, WHAT = ITERATION_SCHEMA, ITERATION_MIGRATIONS, "the iteration record"

    iteration: int
    parent: int
    parent_commit: str
    generation: int
    parent_label: str = ""  # population: the pool member the candidates come from ("base", "3b"); "" in a lineage run
    minibatch: list[str] = Field(default_factory=list)  # population: the analysis tasks of its parent's screen
    evidence: str = ""  # population: the evaluation its proposers read (its parent on the minibatch); lineage: analysis-g<generation>
    status: IterationStatus = "proposing"  # the furthest any candidate got; "accepted" when one was kept
    reason: str = ""
    candidates: list[CandidateRecord] = Field(default_factory=list)
    kept: Optional[str] = None  # the label of the kept candidate
    gate_incumbent: Optional[float] = None  # the incumbent measured beside the candidates (or its reference, before)
    gate_stages: list[dict] = Field(default_factory=list)  # the gate's decision over the set, stage by stage
    analysis: Optional[float] = None  # the kept candidate's analysis score, once measured
    usage: dict[str, RoleUsage] = Field(default_factory=dict)  # every role, all candidates together
    # Per provider endpoint and model: permits, 429s and seconds waited for the rate limit (evolver.ratelimit), meta-LLM included.
    rate_limits: dict[str, RateTally] = Field(default_factory=dict)
    charged: dict[str, dict[str, str]] = Field(default_factory=dict)  # as RunState.charged, for this iteration's evaluations

    def candidate(self, label: str) -> CandidateRecord:
        return next(c for c in self.candidates if c.label == label)

    @property
    def winner(self) -> Optional[CandidateRecord]:
        return self.candidate(self.kept) if self.kept else None


def slug(label: str) -> str:
    """A candidate's label as file and branch names use it: "3" -> "003", "3b" -> "003b"."""
    digits = label.rstrip(string.ascii_lowercase)
    return f"{int(digits):03d}{label[len(digits) :]}"


def named(label: str) -> str:
    """A candidate as a sentence names it: "the base", "iteration 3" (its iteration's one candidate), "candidate 3b"."""
    return "the base" if label in ("", "base") else f"iteration {label}" if label.isdigit() else f"candidate {label}"


def charge(holder: RunState | IterationRecord, name: str, simulations: Iterable[SimRecord]) -> None:
    """Add to ``holder`` (the run, or the iteration whose evaluation ``name`` is) the usage of every simulation
    it has not been charged for yet. Each is charged once, whatever reuses it later: gate stages that grow one
    evaluation, an evaluation measured again after an interruption; a retried infrastructure error is a new
    simulation, charged again. The caller saves ``holder`` before the evaluation's result is kept, so no kill
    can lose or double a charge."""
    charged = holder.charged.setdefault(name, {})
    for sim in simulations:
        key, mark = f"{sim.task_id}#{sim.trial}", _fingerprint(sim)
        if charged.get(key) == mark:
            continue
        charged[key] = mark
        for role, usage in sim.usage.items():
            holder.usage[role] = holder.usage.get(role, RoleUsage()).add(usage)
        add_tallies(holder.rate_limits, sim.rate_limits)


def _fingerprint(sim: SimRecord) -> str:
    """Tells one run of a simulation from another (a retry after an infrastructure error)."""
    return hashlib.sha1(sim.model_dump_json().encode()).hexdigest()[:16]
