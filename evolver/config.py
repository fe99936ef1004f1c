"""Configuration: `evolver.toml` in the repo, then EVOLVER_* environment variables, then CLI flags.

Every key can be set in all three places; later sources win. The file is flat
TOML (see `evolver init` for a commented example), but for the per-role tables of
model arguments ([agent_args] and the like), which merge key by key.

Here: every setting's one declaration (Config and its Specs) and each role's resolved model.
Reading the three sources is evolver.config_load; the tables' keys and checks, evolver.config_tables;
the evaluation requests a configuration makes, evolver.config_requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional

from evolver.data import USER_ADAPTER, RoleModel
from evolver.kinds import BACKENDS, CHOSEN_BY, GATE_POLICIES, PROPOSERS, choices_text

DOMAINS = ("airline", "retail", "telecom", "mock")


@dataclass(frozen=True)
class Spec:
    """How one setting is declared: everything the parser, evolver.toml, the environment and
    docs/configuration.md know of it comes from here."""

    help: str  # one line: evolver.toml's comment, the flag's help, the docs' table
    group: str  # where it is listed: models, evaluation, sandbox, runs, stopping, proposer, gate
    flags: tuple[str, ...] = ()  # the commands that take it as --name ("eval", "run"); none: file and environment only
    bounds: tuple[Optional[float], Optional[float]] = (None, None)  # inclusive; None: unbounded
    choices: tuple[str, ...] = ()
    positive: bool = False  # seconds, more than 0
    flag_only: bool = False  # never from the file or the environment (giving up the sandbox must be typed)
    metavar: Optional[str] = None
    style: str = (
        "value"  # value; switch (--x/--no-x); flag (--x, true); on_off (--x sets "on", --no-x "off"); table (--x-arg KEY=VALUE, repeated);
    )
    # limits (--rate-limit MODEL=RPM/TPM, repeated)


def setting(default: Any, help: str, group: str, **spec) -> Any:
    """A Config field with its Spec; a list or table default is copied per instance."""
    meta = {"spec": Spec(help=help, group=group, **spec)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_of(name: str) -> str:
    """A setting's flag: --key-name; a table of model arguments takes one KEY=VALUE per --role-arg."""
    if SPECS[name].style == "table":
        return "--" + name.removesuffix("_args").replace("_", "-") + "-arg"
    if SPECS[name].style == "limits":
        return "--" + name.removesuffix("s").replace("_", "-")
    return "--" + name.replace("_", "-")


BOTH = ("eval", "run")
# litellm's reasoning_effort values ("default" aside: leaving the setting empty is that).
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@dataclass(frozen=True)
class Config:
    """The settings of one command, final once built (load_config): a change is a new one (dataclasses.replace)."""

    # Models: one litellm model string per role, or "local" for the embedded model; empty: see
    # with_default_models. The user simulator changes scores, so every result file names it.
    agent_model: str = setting(
        "", 'the agent being evolved: a litellm model string, or "local" for the embedded model', "models", flags=BOTH
    )
    user_model: str = setting("", "tau2's user simulator (it changes scores; every result names it)", "models", flags=BOTH)
    meta_model: str = setting("", "the model that proposes patches", "models", flags=BOTH)
    judge_model: str = setting("", "tau2's NL-assertion judge; empty: the user model", "models", flags=BOTH)
    api_base: str = setting(
        "",
        "an OpenAI-compatible server (vLLM, Ollama, llama.cpp) for every role, e.g. http://127.0.0.1:8000/v1",
        "models",
        flags=BOTH,
        metavar="URL",
    )
    agent_api_base: str = setting("", "the agent's server only (wins over api_base)", "models", flags=BOTH, metavar="URL")
    user_api_base: str = setting("", "the user simulator's server only", "models", flags=BOTH, metavar="URL")
    meta_api_base: str = setting("", "the meta model's server only", "models", flags=BOTH, metavar="URL")
    # The embedded model; evolver serves it unless api_base names a running server.
    local_size: str = setting(
        "default", "the embedded model: default (1.5B) or small (0.5B, faster)", "models", flags=BOTH, choices=("default", "small")
    )
    local_model: str = setting("", 'a GGUF file to serve for roles set to "local" instead', "models", flags=BOTH, metavar="PATH")
    # tau2's user simulator on the local serving path, presented the conversation so that a small
    # model plays the customer instead of a second assistant (evolver.local.customer).
    local_user_adapter: bool = setting(
        True,
        'a "local" user simulator is shown the conversation so that the small model plays the customer; false: tau2\'s request as it is',
        "models",
        flags=BOTH,
        style="switch",
    )
    agent_temperature: float = setting(0.0, "the agent's sampling temperature", "models")
    user_temperature: float = setting(0.0, "the user simulator's sampling temperature", "models")
    # Per role: a reasoning model's effort, and further litellm arguments (LLM_ARGS below). The trusted
    # side passes them with every call of that role; a candidate's agent never sets them.
    agent_reasoning_effort: str = setting(
        "",
        "the agent's reasoning effort (litellm's reasoning_effort); empty: the model's own default. "
        "The agent's code may read it as AGENT_REASONING_EFFORT",
        "models",
        flags=BOTH,
        choices=("",) + REASONING_EFFORTS,
        metavar="EFFORT",
    )
    user_reasoning_effort: str = setting(
        "",
        "the user simulator's reasoning effort; empty: the model's own default",
        "models",
        flags=BOTH,
        choices=("",) + REASONING_EFFORTS,
        metavar="EFFORT",
    )
    meta_reasoning_effort: str = setting(
        "",
        "the meta model's reasoning effort; empty: the model's own default",
        "models",
        flags=BOTH,
        choices=("",) + REASONING_EFFORTS,
        metavar="EFFORT",
    )
    agent_args: dict = setting(
        {},
        "more litellm arguments for every agent call, e.g. max_tokens, top_p, seed, extra_body (the list: docs/configuration.md)",
        "models",
        flags=BOTH,
        style="table",
        metavar="KEY=VALUE",
    )
    user_args: dict = setting(
        {}, "more litellm arguments for every user-simulator call", "models", flags=BOTH, style="table", metavar="KEY=VALUE"
    )
    meta_args: dict = setting(
        {}, "more litellm arguments for every meta-model call", "models", flags=BOTH, style="table", metavar="KEY=VALUE"
    )
    judge_args: dict = setting(
        {},
        "more litellm arguments for every judge call; with no judge_model, the user's apply first",
        "models",
        flags=BOTH,
        style="table",
        metavar="KEY=VALUE",
    )
    preflight: bool = setting(
        True,
        "before anything is spent, send each role's model one short request shaped like its real ones and "
        "stop at once on a setting it refuses",
        "models",
        flags=BOTH,
        style="switch",
    )
    llm_retries: int = setting(
        4, "attempts per LLM call before a provider error counts as an infrastructure error", "models", bounds=(0, 20)
    )
    # One rate limit per provider endpoint and model for every call of the command, every role and process
    # (evolver.ratelimit); a model not listed is unlimited until its provider answers 429 or declares a limit.
    rate_limits: dict = setting(
        {},
        "requests and tokens per minute a provider allows a model, shared by every role, process and Ray "
        'node, e.g. "openai/gpt-4.1-mini" = {rpm = 500, tpm = 200000}; unlisted: learnt from the provider',
        "models",
        flags=BOTH,
        style="limits",
        metavar="MODEL=RPM/TPM",
    )
    # Evaluation.
    domain: str = setting("mock", "tau2 domain: airline, retail, telecom or mock", "evaluation", flags=BOTH)
    split: str = setting(
        "", "tau2 task split for `evolver eval` (train or test; mock has only base); empty: all tasks", "evaluation", flags=("eval",)
    )
    trials: int = setting(1, "trials per task for `evolver eval`", "evaluation", flags=("eval",), bounds=(1, 1000))
    concurrency: int = setting(4, "simulations run at once", "evaluation", flags=BOTH, bounds=(1, 256))
    seed: int = setting(300, "tau2's seed", "evaluation", flags=BOTH)
    max_steps: int = setting(
        30, "step limit per simulation (the agent is told it, for its H4 layer)", "evaluation", flags=BOTH, bounds=(1, 1000)
    )
    worker_timeout: float = setting(3600.0, "wall-clock limit of one evaluation, seconds", "evaluation", flags=BOTH, positive=True)
    plugins: list = setting([], "modules the worker imports first, e.g. to register your own tau2 domain", "evaluation")
    # Where simulations run (evolver.evaluation.backends): this machine, or Ray (with no address, a
    # local Ray instance evolver starts and stops; "auto" joins a running one).
    backend: str = setting("local", f"where simulations run: {choices_text(BACKENDS)}", "evaluation", flags=BOTH, choices=tuple(BACKENDS))
    ray_address: str = setting(
        "",
        "the Ray cluster to join with backend = ray: an address, or auto for a running one; empty: start a local Ray instance",
        "evaluation",
        flags=BOTH,
        metavar="ADDRESS",
    )
    # The candidate's agent process (evolver.evaluation.sandbox): past either limit the simulation fails.
    agent_timeout: float = setting(
        120.0, "seconds the sandboxed agent may compute on one turn, LLM calls not counted", "sandbox", flags=BOTH, positive=True
    )
    agent_memory_mb: int = setting(
        1024, "memory the sandboxed agent process may add to what it starts with, MiB", "sandbox", flags=BOTH, bounds=(64, 65536)
    )
    unsafe_no_sandbox: bool = setting(
        False,
        "run candidate code unconfined, with your files, keys and network in reach (scores can then "
        "be forged); only where the sandbox cannot work",
        "sandbox",
        flags=BOTH,
        flag_only=True,
        style="flag",
    )
    # The loop (`evolver run`).
    iterations: int = setting(10, "iterations `evolver run` makes; with --resume, the new total", "runs", flags=("run",), bounds=(1, 10000))
    candidates: int = setting(
        4,
        "candidates proposed from the same parent and evaluated at once per iteration (population: each may "
        "join the pool; a lineage keeps at most one)",
        "runs",
        flags=("run",),
        bounds=(1, 8),
    )
    log_interval: float = setting(
        60.0, "seconds between progress lines when a run's output goes to a file (phase changes always get one)", "runs", positive=True
    )
    analysis_split: str = setting("", "split whose failures the meta-LLM sees (default: train, or a seeded half)", "runs", flags=("run",))
    gate_split: str = setting("", "split the gate decides on (default: test, or the other seeded half)", "runs", flags=("run",))
    analysis_trials: int = setting(1, "trials per analysis task", "runs", bounds=(1, 100))
    exclude_tasks: list = setting(
        [],
        "task ids left out of a run's analysis, gate and holdout sets (see `evolver tasks --triage RUN`)",
        "runs",
        flags=("run",),
        metavar="IDS",
    )
    learnings_file: str = setting(
        "",
        "a file of findings from earlier work (e.g. auto-harness's workspace/learnings.md), relative to the "
        "repository: a new run copies it and its proposer reads it before the run's own learnings",
        "runs",
        flags=("run",),
        metavar="PATH",
    )
    holdout: str = setting(
        "auto",
        "seal part of the analysis split as a holdout: auto (40+ analysis tasks), on or off",
        "gate",
        flags=("run",),
        choices=("auto", "on", "off"),
        style="on_off",
    )
    holdout_trials: int = setting(2, "trials per holdout task", "gate", bounds=(1, 100))
    stall: int = setting(
        5, "stop after this many iterations in a row that kept nothing (0: never)", "stopping", flags=("run",), bounds=(0, None)
    )
    budget_usd: float = setting(
        0.0, "stop when all roles together have cost this much (0: no limit)", "stopping", flags=("run",), bounds=(0, None)
    )
    budget_tokens: int = setting(
        0, "stop when all roles together have used this many tokens (0: no limit)", "stopping", flags=("run",), bounds=(0, None)
    )
    max_hours: float = setting(0.0, "stop at this wall-clock limit (0: no limit)", "stopping", flags=("run",), bounds=(0, None))
    reference_max_hours: float = setting(
        24.0, "measure the incumbent's gate results again when older than this (0: never)", "gate", bounds=(0, None)
    )
    digest_chars: int = setting(
        8000, "size of the failure digest the meta-LLM reads, characters (oneshot proposer)", "proposer", bounds=(500, None)
    )
    meta_context_tokens: int = setting(32000, "the meta model's context window, tokens", "proposer", bounds=(4096, None))
    # The proposer (evolver.evolution.proposers, docs/proposer.md).
    proposer: str = setting(
        "agent", f"how candidates are proposed: {choices_text(PROPOSERS)}", "proposer", flags=("run",), choices=tuple(PROPOSERS)
    )
    proposer_turns: int = setting(16, "agent proposer: meta-LLM calls per proposal", "proposer", flags=("run",), bounds=(1, 500))
    proposer_tokens: int = setting(120_000, "agent proposer: meta-LLM tokens per proposal", "proposer", flags=("run",), bounds=(1000, None))
    proposer_tries: int = setting(
        3,
        "agent proposer: simulations of its edited agent on analysis tasks per proposal (counted like any simulation)",
        "proposer",
        flags=("run",),
        bounds=(0, 1000),
    )
    proposer_seconds: float = setting(
        300.0, "agent and command proposers: wall-clock limit per proposal, seconds", "proposer", flags=("run",), positive=True
    )
    proposer_command: str = setting(
        "",
        "command proposer: the command line, run confined in a workspace holding agent/, the analysis trajectories and TASK.md",
        "proposer",
        flags=("run",),
        metavar="CMD",
    )
    proposer_env: list = setting(
        [],
        "command proposer: names of the environment variables it gets (e.g. its own API key); nothing else of yours",
        "proposer",
        flags=("run",),
        metavar="NAMES",
    )
    proposer_read: list = setting(
        [],
        "command proposer: folders it may read besides the system's, Python's and its program's (found "
        "by name); never your home or a folder holding it or the repository",
        "proposer",
        flags=("run",),
        metavar="DIRS",
    )
    # The gate (docs/gate.md) and the run's policy around it (docs/search.md).
    gate_policy: str = setting(
        "population",
        f"what the run's gate bounds: {choices_text(GATE_POLICIES)}; an audit lets a run end worse "
        "than it began at most gate_alpha of the time",
        "gate",
        flags=("run",),
        choices=tuple(GATE_POLICIES),
    )
    gate_alpha: float = setting(
        0.05,
        "population and audited: the chance a run ends worse than it began; per-decision: each keep's false-accept probability",
        "gate",
        flags=("run",),
        bounds=(0, 0.5),
    )
    gate_min_effect: float = setting(
        0.0, "smallest mean gain worth keeping, reward units (0.05 = 5 points)", "gate", flags=("run",), bounds=(0, 0.99)
    )
    gate_stages: list = setting(
        [], "cumulative candidate trials per task at each look, e.g. 1,2,3,4,6; empty: the tuned default", "gate", flags=("run",)
    )
    transfer_models: list = setting(
        [],
        "at the end of the run, compare its base and best under each of these agent models (`evolver transfer`)",
        "runs",
        flags=("run",),
        metavar="M1,M2",
    )
    # Experiment tracking (evolver.cli.tracking): settings, per-iteration metrics and the report.
    track: str = setting(
        "off",
        "experiment tracking of `evolver run`: off, or mlflow (pip install 'evolver[mlflow]'; logs to mlruns/ or MLFLOW_TRACKING_URI)",
        "runs",
        flags=("run",),
        choices=("off", "mlflow"),
    )

    def role(self, name: str, local_api_base: Optional[str] = None) -> RoleModel:
        """The resolved model of one role: agent, user, meta or judge. ``local_api_base`` is the
        address of the embedded server evolver started (serve_local yields it), learnt at run time
        and passed on here, never kept in the settings."""
        if name == "judge":
            model, api_base, temperature = self.judge_model or self.user_model, self.user_api_base, 0.0
        else:
            model, api_base = getattr(self, f"{name}_model"), getattr(self, f"{name}_api_base")
            temperature = getattr(self, f"{name}_temperature", 0.0)
        api_base = api_base or self.api_base or None
        args = {"temperature": temperature, **self.model_args(name)}
        if model == LOCAL:  # the local serving path, labelled by role for its counters
            # The user's adapter setting travels with its model, so request.json and result.json name it.
            adapter = {USER_ADAPTER: self.local_user_adapter} if name == "user" else {}
            return RoleModel(model=f"local/{name}", api_base=api_base or local_api_base or None, llm_args={**args, **adapter})
        return RoleModel(model=model, api_base=api_base, llm_args=args)

    def model_args(self, name: str) -> dict:
        """A role's reasoning effort and its table of litellm arguments. The judge has no model of its
        own when judge_model is empty: it is the user simulator's model, and takes the user's first."""
        if name == "judge":
            return {**({} if self.judge_model else self.model_args("user")), **self.judge_args}
        effort = getattr(self, f"{name}_reasoning_effort")
        return {**({"reasoning_effort": effort} if effort else {}), **getattr(self, f"{name}_args")}

    def uses_local_server(self, roles: tuple[str, ...] = ("agent", "user", "meta")) -> bool:
        """Whether evolver must serve the embedded model: one of ``roles`` is "local" without a server of its own."""
        roles = roles + (("judge",) if self.judge_model else ())
        return any(getattr(self, f"{r}_model") == LOCAL and not (getattr(self, f"{r}_api_base", "") or self.api_base) for r in roles)


SPECS: dict[str, Spec] = {f.name: f.metadata["spec"] for f in fields(Config)}
GROUPS = {
    "models": "models (litellm model strings)",
    "evaluation": "evaluation",
    "sandbox": "sandbox (what candidate code may do)",
    "runs": "runs",
    "stopping": "stopping",
    "proposer": "proposer (how each candidate is proposed; docs/proposer.md)",
    "gate": "gate (docs/gate.md)",
}

LOCAL = "local"
HOSTED_DEFAULTS = {"agent_model": "openai/gpt-4.1-mini", "user_model": "openai/gpt-4.1-mini", "meta_model": "openai/gpt-4.1"}


def with_default_models(
    cfg: Config, environ: Optional[dict] = None, roles: tuple[str, ...] = ("agent", "user", "meta")
) -> tuple[Config, Optional[str]]:
    """``cfg`` with the unset models of ``roles`` (the ones the command uses) filled: OpenAI's when
    OPENAI_API_KEY is present, else the embedded local model; and the line to tell the user when the
    local model was chosen for them."""
    environ = os.environ if environ is None else environ
    unset = [f"{r}_model" for r in roles if not getattr(cfg, f"{r}_model")]
    hosted = bool(environ.get("OPENAI_API_KEY"))
    filled = replace(cfg, **{key: HOSTED_DEFAULTS[key] if hosted else LOCAL for key in unset})
    if hosted or not unset:
        return filled, None
    roles = ", ".join(k.removesuffix("_model") for k in unset)
    return filled, (
        f"no model configured and no OPENAI_API_KEY: using the embedded local model ({cfg.local_size} size) for {roles}; "
        "it is for trying the loop, real gains need a capable model (--agent-model/--user-model/--meta-model)"
    )


def unread(cfg: Config) -> list[str]:
    """A line for each setting given a value of its own that the chosen kind does not read (--gate-stages with the
    population search, say): it changes nothing, and a user should know."""
    defaults, lines = Config(), []
    for chooser, kinds in CHOSEN_BY.items():
        chosen = kinds[getattr(cfg, chooser)]
        for name in sorted({s for k in kinds.values() for s in k.settings} - set(chosen.settings)):
            if getattr(cfg, name) != getattr(defaults, name):
                readers = ", ".join(k.name for k in kinds.values() if name in k.settings)
                lines.append(
                    f"note: {flag_of(name)} is read by the {readers} {chooser.replace('_', ' ')}, not by {chosen.name}: it changes nothing here"
                )
    return lines


def spec(name: str) -> Spec:
    return SPECS[name]
