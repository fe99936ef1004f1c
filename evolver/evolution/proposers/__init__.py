"""The proposer: what turns the evidence of a run into a candidate, behind one small interface.

The loop gives a proposer a Request (what it may see: the parent's agent/, the analysis evaluation
and its trajectories, the run's earlier candidates, the learnings, the guide; a budget; and the
means to try an idea on analysis tasks) and gets back a ProposalResult (the edits, a title, a rationale,
what the meta-LLM used, and a transcript on disk). Three implementations:

- oneshot: one completion over the failure digest, answered with a patch (re-asked on format errors;
  agent_source shortens the agent's files to fit its prompt);
- agent: the meta-LLM investigates with tools (agent_tools) before it proposes (evolver.evolution.proposers.agent);
- command: an external coding agent in a confined workspace (evolver.evolution.proposers.command).

What each sends the meta-LLM is a file in prompts/<proposer>/ (evolver.evolution.proposers.prompts).

Gate and holdout trajectories never reach a proposer; nothing an LLM writes runs on the trusted side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from evolver.data import EvalResult, RoleModel, RoleUsage
from evolver.evolution.evidence import Evidence
from evolver.evolution.patch import Proposal

PROPOSERS = ("agent", "oneshot", "command")


@dataclass(frozen=True)
class Budget:
    """What one proposal may spend; the defaults fit the embedded model on two cores."""

    turns: int = 16  # meta-LLM calls
    tokens: int = 120_000  # meta-LLM tokens, prompt and completion
    tries: int = 6  # simulations of the scratch agent on analysis tasks
    seconds: float = 300.0  # wall clock, tries included


@dataclass
class Request:
    label: str  # the candidate, "3" or "3b"
    focus: tuple[int, int]  # proposal i of k drawn at once from the same parent
    parent: Path  # a checkout of the parent commit (read, never written)
    evidence: Evidence  # the analysis simulations and the run's earlier candidates
    learnings: list[str]
    guide: str  # Harness.md
    identifiers: frozenset  # task-data identifiers, for the static scan
    meta: RoleModel
    llm_retries: int
    context_tokens: int
    budget: Budget
    workdir: Path  # this proposal's own folder in the run directory: scratch copy, transcript
    prompts_dir: Path
    digest_chars: int = 8000
    # Evaluate a folder holding agent/ on analysis task ids (one trial each, the analysis seed), counted
    # in the run's usage like any evaluation: its result and the folder holding its trajectories.
    # None where no simulation may run.
    try_agent: Optional[Callable[[Path, list[str]], tuple[EvalResult, Path]]] = None
    progress: Callable[[int, int, str], None] = lambda turn, turns, doing: None  # turn, most turns, what it does


@dataclass
class ProposalResult:
    proposal: Optional[Proposal]
    refused: Optional[str] = None  # why a well-formed proposal may not be applied (e.g. an edit outside agent/)
    findings: list[str] = field(default_factory=list)  # the static scan's, when it refused the patch
    responses: list[str] = field(default_factory=list)  # the meta-LLM's answers (oneshot)
    errors: list[str] = field(default_factory=list)
    usage: RoleUsage = field(default_factory=RoleUsage)  # the meta-LLM's; try simulations are charged as evaluations
    prompt_chars: int = 0
    stats: dict = field(default_factory=dict)  # what the investigation did: turns, tools, edits, tries


class Proposer:
    """A kind of proposer (evolver.kinds.PROPOSERS names its class, a subclass of this). The class answers for the
    kind before any proposal is made: how it is built from the settings, what the preflight sends its meta-LLM, what
    the dry run charges a proposal, what a run refuses to start without. The defaults are a kind's with no settings
    of its own and nothing to check; meta_shape and meta_tokens each kind states."""

    name: str
    reuses_prompt = False  # a conversation that sends its prefix again, so a provider's prompt cache prices it

    @classmethod
    def from_config(cls, cfg) -> "Proposer":
        """The proposer the settings (evolver.config.Config) ask for."""
        return cls()

    @classmethod
    def meta_shape(cls, meta: RoleModel) -> Optional[dict]:
        """What its meta-LLM requests carry besides the conversation (meta_call's extra arguments), for a request
        shaped like them before a run; None when it calls no meta-LLM of evolver's."""
        raise NotImplementedError

    @classmethod
    def meta_tokens(cls, cfg, one_request: int) -> tuple[int, int]:
        """The meta-LLM tokens of one proposal, expected and at most, before any is measured; ``one_request``: the
        tokens of one prompt and its answer as evolver would build it (evolver.evolution.plan)."""
        raise NotImplementedError

    @classmethod
    def problem(cls, cfg, repo: Path) -> Optional[str]:
        """Why a run with these settings cannot start (one line), or None."""
        return None

    def propose(self, request: Request) -> ProposalResult:
        """One candidate from the request's parent, or ProposalResult(proposal=None) with errors saying why not.
        Raises evolver.llm.ProviderError when the meta-LLM stays down (the run pauses), ConfigurationError when
        it refuses its configuration (the run stops: no retry can fix it)."""
        raise NotImplementedError


def meta_request(role: RoleModel, messages: list, answer_tokens: Optional[int] = None, **extra) -> dict:
    """The arguments of one meta-LLM completion. The configured ones (meta_args, the reasoning effort) win over
    a proposer's defaults (its answer's room, timeout), except the temperature and seed a proposer varies from
    turn to turn so as not to repeat itself. The answer's room is a token limit with the model's thinking budget
    on top where it reasons; the conversation is marked for the provider's prompt cache where it needs marks."""
    from evolver.models import answer_limit, cache_marked

    configured = {k: v for k, v in role.llm_args.items() if k not in ("temperature", "seed")}
    if answer_tokens and not {"max_tokens", "max_completion_tokens"} & configured.keys():
        extra["max_tokens"] = answer_limit(role.model, role.api_base, role.llm_args, answer_tokens)
    return {
        "model": role.model,
        "messages": cache_marked(messages, role.model, role.api_base),
        **{**role.litellm_args(), **extra, **configured},
    }


def meta_call(role: RoleModel, messages: list, retries: int, answer_tokens: Optional[int] = None, **extra) -> tuple[object, RoleUsage]:
    """One completion of the meta-LLM (evolver.llm.retrying shapes it and classifies its errors), and what it used."""
    from evolver.llm import retrying, usage_of
    from evolver.local.providers import register_providers

    register_providers([role.model])
    import litellm

    response = retrying(litellm.completion, retries, "meta")(**meta_request(role, messages, answer_tokens, **extra))
    return response, usage_of(response, role.model)


def proposer_kind(name: str) -> type[Proposer]:
    """The proposer class a kind's name stands for, as evolver.kinds.PROPOSERS declares it."""
    from evolver.kinds import PROPOSERS

    return PROPOSERS[name].load(__name__)
