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
ROLES = ("agent", "user", "meta")


@dataclass
class Config:
    # Models, one litellm model string per role, or "local" for the embedded
    # model. Empty: see apply_default_models. The user simulator changes scores,
    # so it is recorded in every result file.
    agent_model: str = ""
    user_model: str = ""
    meta_model: str = ""
    # NL-assertion judge used by tau2's evaluator on some tasks; empty = user model.
    judge_model: str = ""
    # Any OpenAI-compatible server (vLLM, Ollama, llama.cpp); per-role values win.
    api_base: str = ""
    agent_api_base: str = ""
    user_api_base: str = ""
    meta_api_base: str = ""
    # The embedded model (role model "local"): "default" (1.5B) or "small" (0.5B),
    # or any GGUF file; evolver serves it unless api_base names a running server.
    local_size: str = "default"
    local_model: str = ""
    # tau2's user simulator on the local serving path: present the conversation so that a small
    # model plays the customer instead of a second assistant (evolver.local.customer).
    local_user_adapter: bool = True
    agent_temperature: float = 0.0
    user_temperature: float = 0.0
    # Evaluation.
    domain: str = "mock"
    split: str = ""
    trials: int = 1
    concurrency: int = 4
    seed: int = 300
    max_steps: int = 30
    llm_retries: int = 4
    worker_timeout: float = 3600.0
    # The candidate's agent process (evolver.evaluation.sandbox): compute seconds per turn (LLM calls not
    # counted) and memory on top of what it starts with; past either the simulation fails.
    agent_timeout: float = 120.0
    agent_memory_mb: int = 1024
    # Run candidate code unconfined. Only as the --unsafe-no-sandbox flag, never from a file
    # or the environment, so that nobody gives up the sandbox without typing it.
    unsafe_no_sandbox: bool = False
    # Modules the worker imports first, e.g. to register an extra tau2 domain.
    plugins: list = field(default_factory=list)
    # Where simulations run (evolver.evaluation.backends): this machine, or Ray. With ray and no
    # address, evolver starts a local Ray instance and stops it at exit; "auto" joins a running one.
    backend: str = "local"
    ray_address: str = ""
    # The loop (`evolver run`).
    iterations: int = 10
    candidates: int = 1  # proposed from the same parent and evaluated at once per iteration; at most one is kept
    log_interval: float = 60.0  # seconds: with output to a file, a progress line at least this often
    analysis_split: str = ""  # default: train, or a seeded split for domains without one
    gate_split: str = ""  # default: test (the test gate), or the seeded rest
    analysis_trials: int = 1
    holdout: str = "auto"  # auto: on when the analysis split has 40 or more tasks; on; off
    holdout_trials: int = 2
    stall: int = 5  # stop after this many consecutive candidates not kept (0: never)
    budget_usd: float = 0.0  # 0: no limit; counts every role
    budget_tokens: int = 0
    max_hours: float = 0.0
    reference_max_hours: float = 24.0  # re-measure the incumbent's gate results when older (0: never)
    digest_chars: int = 8000
    meta_context_tokens: int = 32000
    # The proposer (evolver.evolution.proposers): agent investigates with tools before it proposes,
    # oneshot answers the failure digest with a patch, command runs an external coding agent.
    proposer: str = "agent"
    proposer_turns: int = 16  # meta-LLM calls per proposal (agent)
    proposer_tokens: int = 120_000  # meta-LLM tokens per proposal (agent)
    proposer_tries: int = 6  # simulations of the proposal's scratch agent on analysis tasks (agent)
    proposer_seconds: float = 300.0  # wall clock per proposal (agent, command)
    proposer_command: str = ""  # with proposer = command: the command line, run in the proposal's workspace
    proposer_env: list = field(default_factory=list)  # names of environment variables the command gets (its own API key)
    proposer_read: list = field(default_factory=list)  # folders the command may read besides the system's (where its CLI lives)
    # The gate (see docs/gate.md).
    gate_alpha: float = 0.05
    gate_min_effect: float = 0.0
    gate_stages: list = field(default_factory=list)  # empty: the gate's tuned default (docs/gate.md)
    # Experiment tracking (evolver.cli.tracking): off, or mlflow (an optional extra) for the settings,
    # per-iteration metrics and the report, logged to mlruns/ or MLFLOW_TRACKING_URI.
    track: str = "off"

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


# What each setting accepts, checked the same way whether it comes from evolver.toml, an
# EVOLVER_* variable or a flag: (low, high) bounds, inclusive; None means unbounded.
BOUNDS: dict[str, tuple[Optional[float], Optional[float]]] = {
    "trials": (1, 1000), "concurrency": (1, 256), "candidates": (1, 8), "max_steps": (1, 1000), "iterations": (1, 10000),
    "analysis_trials": (1, 100), "holdout_trials": (1, 100), "llm_retries": (0, 20), "stall": (0, None),
    "budget_tokens": (0, None), "digest_chars": (500, None), "meta_context_tokens": (4096, None),
    "agent_memory_mb": (64, 65536), "budget_usd": (0, None), "max_hours": (0, None), "reference_max_hours": (0, None),
    "gate_min_effect": (0, 0.99), "proposer_turns": (1, 500), "proposer_tokens": (1000, None), "proposer_tries": (0, 1000),
}
POSITIVE = ("worker_timeout", "agent_timeout", "log_interval", "proposer_seconds")  # seconds: more than 0
CHOICES = {"holdout": ("auto", "on", "off"), "local_size": ("default", "small"), "backend": BACKENDS, "track": ("off", "mlflow"),
           "proposer": ("agent", "oneshot", "command")}
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
    if name in CHOICES and value not in CHOICES[name]:
        return f"is not one of: {', '.join(CHOICES[name])}"
    if name in POSITIVE and value <= 0:
        return "must be more than 0 seconds"
    if name == "gate_alpha" and not 0 < value < 0.5:
        return "must be between 0 and 0.5 (a false-accept probability)"
    low, high = BOUNDS.get(name, (None, None))
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
            if key in FLAG_ONLY:
                raise UsageError(f"{path}: '{key}' may only be given as the --{key.replace('_', '-')} flag")
            if key not in known:
                raise UsageError(f"{path}: unknown key '{key}'; known keys: {', '.join(sorted(known))}")
            setattr(cfg, key, _coerce(key, str(path), value, getattr(cfg, key)))
    for key in known:
        env_value = environ.get(ENV_PREFIX + key.upper())
        if env_value not in (None, "") and key in FLAG_ONLY:
            raise UsageError(f"{ENV_PREFIX + key.upper()} is not read: '{key}' may only be given as the --{key.replace('_', '-')} flag; unset it")
        if env_value not in (None, ""):
            setattr(cfg, key, _coerce(key, f"environment variable {ENV_PREFIX + key.upper()}", env_value, getattr(cfg, key)))
    for key, value in (overrides or {}).items():
        if value is not None:
            setattr(cfg, key, _coerce(key, "--" + key.replace("_", "-"), value, getattr(cfg, key)))
    return cfg


# One line per setting: `evolver init` writes them all into evolver.toml, and a test holds
# the README to naming every one.
KEY_HELP: dict[str, str] = {
    "agent_model": "the agent being evolved: a litellm model string, or \"local\" for the embedded model",
    "user_model": "tau2's user simulator (it changes scores; every result names it)",
    "meta_model": "the model that proposes patches",
    "judge_model": "tau2's NL-assertion judge; empty: the user model",
    "api_base": "an OpenAI-compatible server (vLLM, Ollama, llama.cpp) for every role",
    "agent_api_base": "the agent's server only (wins over api_base)",
    "user_api_base": "the user simulator's server only",
    "meta_api_base": "the meta model's server only",
    "local_size": "the embedded model: default (1.5B) or small (0.5B, faster)",
    "local_model": "a GGUF file to serve for roles set to \"local\" instead",
    "local_user_adapter": "a \"local\" user simulator is shown the conversation so that the small model plays the customer; false: tau2's request as it is",
    "agent_temperature": "the agent's sampling temperature",
    "user_temperature": "the user simulator's sampling temperature",
    "domain": "tau2 domain: airline, retail, telecom or mock",
    "split": "tau2 task split for `evolver eval` (train or test; mock has only base); empty: all tasks",
    "trials": "trials per task for `evolver eval`, 1-1000",
    "concurrency": "simulations run at once, 1-256",
    "seed": "tau2's seed",
    "max_steps": "step limit per simulation (the agent is told it, for its H4 layer)",
    "llm_retries": "attempts per LLM call before a provider error counts as an infrastructure error",
    "worker_timeout": "wall-clock limit of one evaluation, seconds",
    "agent_timeout": "seconds the sandboxed agent may compute on one turn, LLM calls not counted",
    "agent_memory_mb": "memory the sandboxed agent process may add to what it starts with, MiB",
    "unsafe_no_sandbox": "flag only (--unsafe-no-sandbox): run candidate code unconfined",
    "plugins": "modules the worker imports first, e.g. to register your own tau2 domain",
    "backend": "where simulations run: local (this machine) or ray",
    "ray_address": "the Ray cluster to join with backend = ray: an address, or auto for a running one; empty: start a local Ray instance",
    "iterations": "iterations `evolver run` makes",
    "candidates": "candidates proposed and evaluated at once per iteration, 1-8; at most one is kept",
    "log_interval": "seconds between progress lines when a run's output goes to a file (phase changes always get one)",
    "analysis_split": "split whose failures the meta-LLM sees (default: train, or a seeded half)",
    "gate_split": "split the gate decides on (default: test, or the other seeded half)",
    "analysis_trials": "trials per analysis task",
    "holdout": "seal part of the analysis split as a holdout: auto (40+ analysis tasks), on or off",
    "holdout_trials": "trials per holdout task",
    "stall": "stop after this many iterations in a row that kept nothing (0: never)",
    "budget_usd": "stop when all roles together have cost this much (0: no limit)",
    "budget_tokens": "stop when all roles together have used this many tokens (0: no limit)",
    "max_hours": "stop at this wall-clock limit (0: no limit)",
    "reference_max_hours": "measure the incumbent's gate results again when older than this (0: never)",
    "digest_chars": "size of the failure digest the meta-LLM reads, characters",
    "meta_context_tokens": "the meta model's context window, tokens",
    "proposer": "how candidates are proposed: agent (the meta model investigates with tools first), oneshot (one answer to the failure digest) or command (an external coding agent)",
    "proposer_turns": "agent proposer: meta-LLM calls per proposal",
    "proposer_tokens": "agent proposer: meta-LLM tokens per proposal",
    "proposer_tries": "agent proposer: simulations of its edited agent on analysis tasks per proposal (counted like any simulation)",
    "proposer_seconds": "agent and command proposers: wall-clock limit per proposal, seconds",
    "proposer_command": "command proposer: the command line, run confined in a workspace holding agent/, the analysis trajectories and TASK.md",
    "proposer_env": "command proposer: names of the environment variables it gets (e.g. its own API key); nothing else of yours",
    "proposer_read": "command proposer: folders it may read besides the system's and Python's (where its CLI is installed)",
    "gate_alpha": "false-accept probability per decision for a no-effect candidate",
    "gate_min_effect": "smallest mean gain worth keeping, reward units (0.05 = 5 points)",
    "gate_stages": "cumulative candidate trials per task at each look, e.g. [1, 2, 3, 4, 6]; empty: the tuned default",
    "track": "experiment tracking of `evolver run`: off, or mlflow (pip install 'evolver[mlflow]'; logs to mlruns/ or MLFLOW_TRACKING_URI)",
}


def setting(name: str, raw: Any, where: str) -> Any:
    """One setting checked on its own (e.g. --iterations on resume), as load_config checks them all."""
    return _coerce(name, where, raw, getattr(Config(), name))


FLAG_ONLY = ("unsafe_no_sandbox",)


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
