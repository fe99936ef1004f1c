"""Configuration: `evolver.toml` in the repo, then EVOLVER_* environment variables, then CLI flags.

Every key can be set in all three places; later sources win. The file is flat
TOML (see `evolver init` for a commented example).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from evolver.data import USER_ADAPTER, EvalRequest, RoleModel
from evolver.errors import UsageError

CONFIG_FILE = "evolver.toml"
ENV_PREFIX = "EVOLVER_"
DOMAINS = ("airline", "retail", "telecom", "mock")
# Where simulations can run; evolver.evaluation.backends.make_backend builds each (named here, below it).
BACKENDS = ("local", "ray")


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
    style: str = "value"  # value; switch (--x/--no-x); flag (--x, true); on_off (--x sets "on", --no-x "off")


def setting(default: Any, help: str, group: str, **spec) -> Any:
    """A Config field with its Spec; a list default is copied per instance."""
    meta = {"spec": Spec(help=help, group=group, **spec)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


BOTH = ("eval", "run")


@dataclass
class Config:
    # Models: one litellm model string per role, or "local" for the embedded model; empty: see
    # apply_default_models. The user simulator changes scores, so every result file names it.
    agent_model: str = setting("", "the agent being evolved: a litellm model string, or \"local\" for the embedded model", "models", flags=BOTH)
    user_model: str = setting("", "tau2's user simulator (it changes scores; every result names it)", "models", flags=BOTH)
    meta_model: str = setting("", "the model that proposes patches", "models", flags=BOTH)
    judge_model: str = setting("", "tau2's NL-assertion judge; empty: the user model", "models", flags=BOTH)
    api_base: str = setting("", "an OpenAI-compatible server (vLLM, Ollama, llama.cpp) for every role, e.g. http://127.0.0.1:8000/v1",
                            "models", flags=BOTH, metavar="URL")
    agent_api_base: str = setting("", "the agent's server only (wins over api_base)", "models", flags=BOTH, metavar="URL")
    user_api_base: str = setting("", "the user simulator's server only", "models", flags=BOTH, metavar="URL")
    meta_api_base: str = setting("", "the meta model's server only", "models", flags=BOTH, metavar="URL")
    # The embedded model; evolver serves it unless api_base names a running server.
    local_size: str = setting("default", "the embedded model: default (1.5B) or small (0.5B, faster)", "models", flags=BOTH,
                              choices=("default", "small"))
    local_model: str = setting("", "a GGUF file to serve for roles set to \"local\" instead", "models", flags=BOTH, metavar="PATH")
    # tau2's user simulator on the local serving path, presented the conversation so that a small
    # model plays the customer instead of a second assistant (evolver.local.customer).
    local_user_adapter: bool = setting(True, "a \"local\" user simulator is shown the conversation so that the small model plays the "
                                             "customer; false: tau2's request as it is", "models", flags=BOTH, style="switch")
    agent_temperature: float = setting(0.0, "the agent's sampling temperature", "models")
    user_temperature: float = setting(0.0, "the user simulator's sampling temperature", "models")
    llm_retries: int = setting(4, "attempts per LLM call before a provider error counts as an infrastructure error", "models", bounds=(0, 20))
    # Evaluation.
    domain: str = setting("mock", "tau2 domain: airline, retail, telecom or mock", "evaluation", flags=BOTH)
    split: str = setting("", "tau2 task split for `evolver eval` (train or test; mock has only base); empty: all tasks", "evaluation", flags=("eval",))
    trials: int = setting(1, "trials per task for `evolver eval`", "evaluation", flags=("eval",), bounds=(1, 1000))
    concurrency: int = setting(4, "simulations run at once", "evaluation", flags=BOTH, bounds=(1, 256))
    seed: int = setting(300, "tau2's seed", "evaluation", flags=BOTH)
    max_steps: int = setting(30, "step limit per simulation (the agent is told it, for its H4 layer)", "evaluation", flags=BOTH, bounds=(1, 1000))
    worker_timeout: float = setting(3600.0, "wall-clock limit of one evaluation, seconds", "evaluation", flags=BOTH, positive=True)
    plugins: list = setting([], "modules the worker imports first, e.g. to register your own tau2 domain", "evaluation")
    # Where simulations run (evolver.evaluation.backends): this machine, or Ray (with no address, a
    # local Ray instance evolver starts and stops; "auto" joins a running one).
    backend: str = setting("local", "where simulations run: local (this machine) or ray", "evaluation", flags=BOTH, choices=BACKENDS)
    ray_address: str = setting("", "the Ray cluster to join with backend = ray: an address, or auto for a running one; empty: start a local "
                                   "Ray instance", "evaluation", flags=BOTH, metavar="ADDRESS")
    # The candidate's agent process (evolver.evaluation.sandbox): past either limit the simulation fails.
    agent_timeout: float = setting(120.0, "seconds the sandboxed agent may compute on one turn, LLM calls not counted", "sandbox",
                                   flags=BOTH, positive=True)
    agent_memory_mb: int = setting(1024, "memory the sandboxed agent process may add to what it starts with, MiB", "sandbox",
                                   flags=BOTH, bounds=(64, 65536))
    unsafe_no_sandbox: bool = setting(False, "run candidate code unconfined, with your files, keys and network in reach (scores can then "
                                             "be forged); only where the sandbox cannot work", "sandbox", flags=BOTH, flag_only=True,
                                      style="flag")
    # The loop (`evolver run`).
    iterations: int = setting(10, "iterations `evolver run` makes; with --resume, the new total", "runs", flags=("run",), bounds=(1, 10000))
    candidates: int = setting(1, "candidates proposed from the same parent and evaluated at once per iteration; at most one is kept",
                              "runs", flags=("run",), bounds=(1, 8))
    log_interval: float = setting(60.0, "seconds between progress lines when a run's output goes to a file (phase changes always get one)",
                                  "runs", positive=True)
    analysis_split: str = setting("", "split whose failures the meta-LLM sees (default: train, or a seeded half)", "runs", flags=("run",))
    gate_split: str = setting("", "split the gate decides on (default: test, or the other seeded half)", "runs", flags=("run",))
    analysis_trials: int = setting(1, "trials per analysis task", "runs", bounds=(1, 100))
    exclude_tasks: list = setting([], "task ids left out of a run's analysis, gate and holdout sets (see `evolver tasks --triage RUN`)",
                                  "runs", flags=("run",), metavar="IDS")
    holdout: str = setting("auto", "seal part of the analysis split as a holdout: auto (40+ analysis tasks), on or off", "gate",
                           flags=("run",), choices=("auto", "on", "off"), style="on_off")
    holdout_trials: int = setting(2, "trials per holdout task", "gate", bounds=(1, 100))
    stall: int = setting(5, "stop after this many iterations in a row that kept nothing (0: never)", "stopping", flags=("run",), bounds=(0, None))
    budget_usd: float = setting(0.0, "stop when all roles together have cost this much (0: no limit)", "stopping", flags=("run",), bounds=(0, None))
    budget_tokens: int = setting(0, "stop when all roles together have used this many tokens (0: no limit)", "stopping", flags=("run",),
                                 bounds=(0, None))
    max_hours: float = setting(0.0, "stop at this wall-clock limit (0: no limit)", "stopping", flags=("run",), bounds=(0, None))
    reference_max_hours: float = setting(24.0, "measure the incumbent's gate results again when older than this (0: never)", "gate",
                                         bounds=(0, None))
    digest_chars: int = setting(8000, "size of the failure digest the meta-LLM reads, characters (oneshot proposer)", "proposer",
                                bounds=(500, None))
    meta_context_tokens: int = setting(32000, "the meta model's context window, tokens", "proposer", bounds=(4096, None))
    # The proposer (evolver.evolution.proposers, docs/proposer.md).
    proposer: str = setting("agent", "how candidates are proposed: agent (the meta model reads trajectories and code, edits a copy and "
                                     "tries it, with tools), oneshot (one answer to the failure digest) or command (an external coding "
                                     "agent)", "proposer", flags=("run",), choices=("agent", "oneshot", "command"))
    proposer_turns: int = setting(16, "agent proposer: meta-LLM calls per proposal", "proposer", flags=("run",), bounds=(1, 500))
    proposer_tokens: int = setting(120_000, "agent proposer: meta-LLM tokens per proposal", "proposer", flags=("run",), bounds=(1000, None))
    proposer_tries: int = setting(6, "agent proposer: simulations of its edited agent on analysis tasks per proposal (counted like any "
                                     "simulation)", "proposer", flags=("run",), bounds=(0, 1000))
    proposer_seconds: float = setting(300.0, "agent and command proposers: wall-clock limit per proposal, seconds", "proposer",
                                      flags=("run",), positive=True)
    proposer_command: str = setting("", "command proposer: the command line, run confined in a workspace holding agent/, the analysis "
                                        "trajectories and TASK.md", "proposer", flags=("run",), metavar="CMD")
    proposer_env: list = setting([], "command proposer: names of the environment variables it gets (e.g. its own API key); nothing else "
                                     "of yours", "proposer", flags=("run",), metavar="NAMES")
    proposer_read: list = setting([], "command proposer: folders it may read besides the system's and Python's (where its CLI is "
                                      "installed)", "proposer", flags=("run",), metavar="DIRS")
    # The gate (docs/gate.md).
    gate_alpha: float = setting(0.05, "false-accept probability per decision for a no-effect candidate", "gate", flags=("run",),
                                bounds=(0, 0.5))
    gate_min_effect: float = setting(0.0, "smallest mean gain worth keeping, reward units (0.05 = 5 points)", "gate", flags=("run",),
                                     bounds=(0, 0.99))
    gate_stages: list = setting([], "cumulative candidate trials per task at each look, e.g. 1,2,3,4,6; empty: the tuned default", "gate",
                                flags=("run",))
    transfer_models: list = setting([], "at the end of the run, compare its base and best under each of these agent models "
                                        "(`evolver transfer`)", "runs", flags=("run",), metavar="M1,M2")
    # Experiment tracking (evolver.cli.tracking): settings, per-iteration metrics and the report.
    track: str = setting("off", "experiment tracking of `evolver run`: off, or mlflow (pip install 'evolver[mlflow]'; logs to mlruns/ "
                                "or MLFLOW_TRACKING_URI)", "runs", flags=("run",), choices=("off", "mlflow"))

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
        if model == LOCAL:  # the local serving path, labelled by role for its counters
            # The user's adapter setting travels with its model, so request.json and result.json name it.
            adapter = {USER_ADAPTER: self.local_user_adapter} if name == "user" else {}
            return RoleModel(model=f"local/{name}", api_base=api_base or local_api_base or None, llm_args={"temperature": temperature, **adapter})
        return RoleModel(model=model, api_base=api_base, llm_args={"temperature": temperature})

    def uses_local_server(self, roles: tuple[str, ...] = ("agent", "user", "meta")) -> bool:
        """Whether evolver must serve the embedded model: one of ``roles`` is "local" without a server of its own."""
        roles = roles + (("judge",) if self.judge_model else ())
        return any(getattr(self, f"{r}_model") == LOCAL and not (getattr(self, f"{r}_api_base", "") or self.api_base) for r in roles)


SPECS: dict[str, Spec] = {f.name: f.metadata["spec"] for f in fields(Config)}
GROUPS = {"models": "models (litellm model strings)", "evaluation": "evaluation", "sandbox": "sandbox (what candidate code may do)",
          "runs": "runs", "stopping": "stopping", "proposer": "proposer (how each candidate is proposed; docs/proposer.md)",
          "gate": "gate (docs/gate.md)"}

LOCAL = "local"
HOSTED_DEFAULTS = {"agent_model": "gpt-4.1-mini", "user_model": "gpt-4.1-mini", "meta_model": "gpt-4.1"}


def apply_default_models(cfg: Config, environ: Optional[dict] = None, roles: tuple[str, ...] = ("agent", "user", "meta")) -> Optional[str]:
    """Fill the unset models of ``roles`` (the ones the command uses): OpenAI's when OPENAI_API_KEY
    is present, else the embedded local model. Returns the line to tell the user when the local
    model was chosen for them."""
    environ = os.environ if environ is None else environ
    unset = [f"{r}_model" for r in roles if not getattr(cfg, f"{r}_model")]
    if not unset:
        return None
    hosted = bool(environ.get("OPENAI_API_KEY"))
    for key in unset:
        setattr(cfg, key, HOSTED_DEFAULTS[key] if hosted else LOCAL)
    if hosted:
        return None
    roles = ", ".join(k.removesuffix("_model") for k in unset)
    return (f"no model configured and no OPENAI_API_KEY: using the embedded local model ({cfg.local_size} size) for {roles}; "
            "it is for trying the loop, real gains need a capable model (--agent-model/--user-model/--meta-model)")


def spec(name: str) -> Spec:
    return SPECS[name]


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _coerce(name: str, where: str, raw: Any, default: Any) -> Any:
    """The value of one setting from ``where`` (a file, a variable or a flag), strictly typed and in range."""
    kind = type(default)
    value, problem = _convert(raw, kind)
    if problem is None:
        problem = _out_of_range(name, value)
    if problem:
        subject = f"{where} {raw}" if where.startswith("--") else f"{where}: {name} = {raw!r}"
        raise UsageError(f"{subject} {problem}; fix it")
    return value


def _convert(raw: Any, kind: type) -> tuple[Any, Optional[str]]:
    if kind is list:
        return ([str(x) for x in raw] if isinstance(raw, list) else [x.strip() for x in str(raw).split(",") if x.strip()]), None
    if kind is bool:
        if isinstance(raw, bool):
            return raw, None
        text = str(raw).strip().lower()
        return (text in TRUE, None) if text in TRUE + FALSE else (None, "is not true or false")
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw, None
        text = str(raw).strip()
        return (int(text), None) if not isinstance(raw, (bool, float)) and text.lstrip("+-").isdigit() else (None, "is not a whole number")
    if kind is float:
        try:
            value = float(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or value != value or value in (float("inf"), float("-inf")):
            return None, "is not a finite number"
        return value, None
    return str(raw), None


def _out_of_range(name: str, value: Any) -> Optional[str]:
    spec = SPECS[name]
    if spec.choices and value not in spec.choices:
        return f"is not one of: {', '.join(spec.choices)}"
    if spec.positive and value <= 0:
        return "must be more than 0 seconds"
    if name == "gate_alpha" and not 0 < value < 0.5:
        return "must be between 0 and 0.5 (a false-accept probability)"
    low, high = spec.bounds
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            return f"must be at least {low:g}"
        return f"must be between {low:g} and {high:g}"
    return None


def load_config(repo: Path, overrides: Optional[dict] = None, environ: Optional[dict] = None) -> Config:
    """Merge file < environment < CLI overrides (None values in overrides are ignored); one check for all three."""
    environ = os.environ if environ is None else environ
    cfg = Config()
    known = {f.name: f for f in fields(Config)}
    path = Path(repo) / CONFIG_FILE
    if path.exists() or path.is_symlink():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path} is not valid TOML ({exc}); fix the file or remove it") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {path} ({getattr(exc, 'strerror', None) or exc}); make it a readable TOML file or remove it") from None
        for key, value in data.items():
            if key in known and SPECS[key].flag_only:
                raise UsageError(f"{path}: '{key}' may only be given as the --{key.replace('_', '-')} flag")
            if key not in known:
                raise UsageError(f"{path}: unknown key '{key}'; known keys: {', '.join(sorted(known))}")
            setattr(cfg, key, _coerce(key, str(path), value, getattr(cfg, key)))
    for key in known:
        env_value = environ.get(ENV_PREFIX + key.upper())
        if env_value not in (None, "") and SPECS[key].flag_only:
            raise UsageError(f"{ENV_PREFIX + key.upper()} is not read: '{key}' may only be given as the --{key.replace('_', '-')} flag; unset it")
        if env_value not in (None, ""):
            setattr(cfg, key, _coerce(key, f"environment variable {ENV_PREFIX + key.upper()}", env_value, getattr(cfg, key)))
    for key, value in (overrides or {}).items():
        if value is not None:
            setattr(cfg, key, _coerce(key, "--" + key.replace("_", "-"), value, getattr(cfg, key)))
    return cfg


def checked(name: str, raw: Any, where: str) -> Any:
    """One setting checked on its own (e.g. --iterations on resume), as load_config checks them all."""
    return _coerce(name, where, raw, getattr(Config(), name))


def eval_request(cfg: Config, checkout: Path, out_dir: Path, *, local_api_base: Optional[str], timeout: Optional[float] = None,
                 **fields) -> EvalRequest:
    """The request for one evaluation under this configuration; ``fields`` set the tasks and trials.
    ``local_api_base`` is required (None when nothing is served): a request for a `local` role built
    before the embedded server is up is refused by EvalRequest itself, before any simulation."""
    timeout = timeout or cfg.worker_timeout
    base = dict(
        checkout=str(checkout), out_dir=str(out_dir), domain=cfg.domain, split=cfg.split or None,
        trials=cfg.trials, concurrency=cfg.concurrency, seed=cfg.seed, max_steps=cfg.max_steps,
        llm_retries=cfg.llm_retries, plugins=cfg.plugins,
        sandbox=not cfg.unsafe_no_sandbox, agent_timeout=min(cfg.agent_timeout, timeout), agent_memory_mb=cfg.agent_memory_mb,
        agent=cfg.role("agent", local_api_base), user=cfg.role("user", local_api_base), judge=cfg.role("judge", local_api_base),
    )
    return EvalRequest(**{**base, **fields})


def listing_request(cfg: Config, checkout: Path, out_dir: Path, **fields) -> EvalRequest:
    """A request that only resolves tasks and splits: no simulation, so no model is called and the
    embedded server need not be up yet (a misspelt split fails before minutes of model start-up)."""
    return eval_request(cfg, checkout, out_dir, local_api_base=None, list_only=True, **fields)
