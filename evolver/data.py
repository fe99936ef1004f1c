"""Plain data that crosses process and module boundaries and lands on disk as JSON.

This module is the bottom layer: it imports nothing from evolver, tau2 or litellm.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, Field, model_validator

# The llm_args key that turns a `local/` user's adapter (evolver.local.customer) on (true, the
# default), off (false) or to some of its steps: evolver.config sets it, the `local/` provider
# (evolver.local.serving) takes it off before the request reaches the server.
USER_ADAPTER = "user_adapter"
# Set beside it by the worker, per simulation: how many of the customer's messages the task's own
# message history holds, so the adapter knows when the customer has not yet spoken live.
USER_HISTORY = "user_history"
# The litellm provider prefix of the local serving path (evolver.local.serving).
LOCAL_PROVIDER = "local"
# The environment variables a candidate's agent process gets (evolver.evaluation.agent_host), and the
# only ones the static scan lets its code read: the agent model's name and reasoning effort, never a key.
# auto-harness's agents read them; the model the trusted side calls stays the configured one.
AGENT_ENV = ("AGENT_MODEL", "AGENT_REASONING_EFFORT")


class RoleModel(BaseModel):
    """One LLM role: a litellm model string plus the arguments passed with every call."""

    model: str
    api_base: Optional[str] = None
    llm_args: dict = Field(default_factory=dict)

    def litellm_args(self) -> dict:
        args = dict(self.llm_args)
        if self.api_base:
            args["api_base"] = self.api_base
        return args

    def agent_names(self) -> dict[str, str]:
        """What an agent process is told of this model (AGENT_ENV): its name and reasoning effort, no key, no address."""
        effort = self.llm_args.get("reasoning_effort")
        return {"AGENT_MODEL": self.model, **({"AGENT_REASONING_EFFORT": str(effort)} if effort else {})}


class EvalRequest(BaseModel):
    """Everything a worker needs to evaluate one checkout; written as request.json."""

    checkout: str
    out_dir: str
    domain: str
    split: Optional[str] = None
    task_ids: Optional[list[str]] = None
    num_tasks: Optional[int] = None
    trials: int = 1
    concurrency: int = 4
    seed: int = 300
    max_steps: int = 30
    max_errors: int = 10
    llm_retries: int = 4
    # The candidate's agent runs in a sandboxed process of its own per simulation
    # (evolver.evaluation.sandbox); False only with --unsafe-no-sandbox.
    sandbox: bool = True
    agent_timeout: float = 120.0  # seconds of agent compute per turn, LLM calls not counted
    agent_memory_mb: int = 1024  # memory the agent process may add to what it starts with
    # Record the model's view of every agent turn beside each trajectory (evolver.evaluation.turnlog).
    record_turns: bool = True
    # Modules imported before tasks are resolved, e.g. to register a domain with tau2's registry.
    plugins: list[str] = Field(default_factory=list)
    # Only resolve the tasks and report them (and the domain's splits) in the status file.
    list_only: bool = False
    # Workers of one evaluation (shards > 1) share its grid: each runs whichever simulation it
    # claims first (worker.Recorder), so both cores stay busy until the end.
    shard: int = 0
    shards: int = 1
    agent: RoleModel
    user: RoleModel
    judge: RoleModel

    @model_validator(mode="after")
    def _local_roles_have_a_server(self):
        """A `local/` role reaches the embedded server only through api_base, which is known once the
        server is up: a request built before that would fail every simulation, so it cannot exist."""
        if not self.list_only:
            for name in ("agent", "user", "judge"):
                role = getattr(self, name)
                if role.model.startswith(LOCAL_PROVIDER + "/") and not role.api_base:
                    raise ValueError(
                        f"the {name} model {role.model} has no api_base: the embedded model's server must be "
                        "running and its address passed on before a request for it is built"
                    )
        return self


class RoleUsage(BaseModel):
    prompt_tokens: int = 0  # every prompt token, those the provider read from its prompt cache included
    completion_tokens: int = 0
    cost: float = 0.0
    # Of prompt_tokens: read from the provider's prompt cache (OpenAI's cached tokens, Anthropic's cache
    # reads), and written to it (Anthropic's cache writes); 0 in records made before they were counted.
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    # Of prompt_tokens: those of calls whose provider said how many it read from its cache (0 included), so that
    # "0% cached" is told apart from a provider (a local server, a record made before) that never says.
    cache_reported_tokens: int = 0

    def add(self, other: "RoleUsage") -> "RoleUsage":
        return RoleUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost=self.cost + other.cost,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_reported_tokens=self.cache_reported_tokens + other.cache_reported_tokens,
        )

    def cached_text(self) -> str:
        return cached_text(self.cached_tokens, self.prompt_tokens, self.cache_reported_tokens)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def priced(self) -> bool:
        """False when tokens were used at no known price (a local or self-hosted model, or one
        litellm has no price for): that cost is unknown, not $0."""
        return self.cost > 0 or self.tokens == 0


def cached_text(cached_tokens: int, prompt_tokens: int, reported_tokens: int) -> str:
    """The share of a role's prompt tokens its provider read from its prompt cache, in words: "0% ..." where the
    provider said it read none, "not reported" where it never said; "" for a role with no prompt."""
    if not prompt_tokens:
        return ""
    if not (cached_tokens or reported_tokens):
        return "prompt cache not reported"
    return f"{cached_tokens / prompt_tokens:.0%} of the prompt cached"


def cost_text(usages) -> str:
    """Dollars for some roles' usage: "$0.0123", "unknown", or "$0.0123 + unknown" when part is unpriced."""
    usages = list(usages)
    known = sum(u.cost for u in usages if u.priced)
    if all(u.priced for u in usages):
        return f"${known:.4f}"
    return f"${known:.4f} + unknown" if known else "unknown"


class RateTally(BaseModel):
    """What the calls to one provider endpoint and model met in its rate limit (evolver.ratelimit):
    permits (calls made, retries included), 429s answered, seconds spent waiting for a permit."""

    calls: int = 0
    limited: int = 0
    waited: float = 0.0

    def add(self, other: "RateTally") -> "RateTally":
        return RateTally(calls=self.calls + other.calls, limited=self.limited + other.limited, waited=self.waited + other.waited)


def add_tallies(into: dict[str, RateTally], more: dict[str, RateTally]) -> dict[str, RateTally]:
    """``into`` with ``more`` added, lane by lane."""
    for key, tally in more.items():
        into[key] = into.get(key, RateTally()).add(tally)
    return into


Outcome = Literal["ok", "failed", "infra_error"]


class SimRecord(BaseModel):
    """One simulation (task x trial).

    outcome "ok": the simulation ran and was scored.
    outcome "failed": the candidate broke it (exception in its code, invalid
    message, evaluator error caused by the agent); reward is 0.
    outcome "infra_error": a fault outside the candidate (provider error after
    retries, worker stopped by the controller); reward is None, never 0.
    """

    task_id: str
    trial: int
    seed: Optional[int] = None
    outcome: Outcome
    reward: Optional[float] = None
    reward_breakdown: dict = Field(default_factory=dict)
    termination_reason: Optional[str] = None
    # With outcome "infra_error": the side that failed (agent, user, judge: its provider; sandbox;
    # worker: the evaluation's own process), so a person sees at once which side to fix.
    error_role: Optional[str] = None
    steps: int = 0
    duration: float = 0.0
    usage: dict[str, RoleUsage] = Field(default_factory=dict)
    rate_limits: dict[str, RateTally] = Field(default_factory=dict)  # per provider endpoint and model (evolver.ratelimit)
    error: Optional[str] = None
    trajectory_file: Optional[str] = None
    turns_file: Optional[str] = None  # the model's view of each turn (evolver.store.turnview), written by the trusted side


class InfraTally(BaseModel):
    """Infrastructure errors of one side (agent, user, judge, sandbox, worker) and the first one's message."""

    count: int = 0
    first: str = ""


class EvalSummary(BaseModel):
    num_tasks: int
    num_trials: int
    num_simulations: int
    scored: int
    failed: int
    infra_errors: int
    infra_by_role: dict[str, InfraTally] = Field(default_factory=dict)  # the side that failed -> how often, and how
    avg_reward: Optional[float]
    pass_hat_k: dict[str, float]
    usage: dict[str, RoleUsage]
    duration: float
    # Per provider endpoint and model: permits, 429s and seconds waited by the simulations (evolver.ratelimit).
    rate_limits: dict[str, RateTally] = Field(default_factory=dict)


class EvalResult(BaseModel):
    """What an evaluation produced; written as result.json in the run directory."""

    run_id: str
    checkout: str
    domain: str
    split: Optional[str]
    task_ids: list[str]
    trials: int
    seed: int
    max_steps: int
    models: dict[str, RoleModel]
    harness: dict = Field(default_factory=dict)
    # How the candidate's code was confined (evolver.evaluation.sandbox); {"mode": "none"} when it was not.
    isolation: dict = Field(default_factory=dict)
    candidate_error: Optional[str] = None
    worker_note: Optional[str] = None
    summary: EvalSummary
    simulations: list[SimRecord]


def write_json_atomic(path: Path, data: BaseModel | dict | list) -> None:
    """Write JSON so a reader never sees a half-written file (rename is atomic).

    No fsync: this guards against a killed process, not against power loss, and
    an fsync per trajectory costs more than the simulation's own bookkeeping."""
    text = data.model_dump_json(indent=2) if isinstance(data, BaseModel) else json.dumps(data, indent=2)
    write_text_atomic(path, text)


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file so a reader never sees it half-written (see write_json_atomic)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write a file so a reader never sees it half-written (see write_json_atomic)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
