"""`evolver init --from SOURCE`: bring an auto-harness checkout or a Life-Harness evaluation command line.

An auto-harness checkout (neosigmaai/auto-harness) brings its agent as it is
(agent/agent.py runs unchanged: evolver gives its process AGENT_MODEL and
AGENT_REASONING_EFFORT, and resolves tau2.agent.base_agent), the tau-bench
settings of its experiment_config.yaml, and workspace/learnings.md as the
first run's learnings. A Life-Harness command line (scripts/eval_harness.py of
Tianshi-Xu/Life-Harness's TauBench) brings its settings and its harness
switches onto evolver's template agent, whose H2-H5 layers are evolver's own.
Everything mapped, and everything left out with the reason, is printed;
docs/migration.md has the whole table.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from evolver.config import DOMAINS
from evolver.config_load import checked
from evolver.errors import UsageError

LAYERS = {"h2": "h2_action_realization", "h3": "h3_environment_contract", "h4": "h4_trajectory_regulation", "h5": "h5_procedural_skills"}
LEARNINGS_FILE = "learnings.md"  # where the learnings brought along are kept in the repository (learnings_file)


@dataclass
class Migration:
    """What `evolver init` writes from another tool's set-up, and what it says about it."""

    source: str  # what was read, for the first line
    settings: dict[str, Any] = field(default_factory=dict)  # evolver.toml
    switches: Optional[dict[str, bool]] = None  # agent/harness.toml (evolver's template agent)
    h5_top_k: Optional[int] = None  # H5_TOP_K in the template's agent/agent.py
    agent: Optional[str] = None  # agent/agent.py brought as it is (then no layers, no skills)
    baseline: Optional[str] = None  # agent/templates/tau_bench.py: that agent's pristine template
    learnings: Optional[str] = None  # learnings.md
    mapped: list[str] = field(default_factory=list)  # "theirs -> evolver's"
    left_out: list[str] = field(default_factory=list)  # "theirs: why it has no equivalent"

    def set(self, key: str, raw: Any, theirs: str, note: str = "") -> None:
        """One evolver setting from the source, checked as every setting is (bad input: one line, exit 2)."""
        value = checked(key, raw, f"{self.source} ({theirs})")
        self.settings[key] = value
        shown = value if not isinstance(value, str) else f'"{value}"'
        self.mapped.append(f"{theirs} -> {key} = {shown}" + (f" ({note})" if note else ""))

    def add_arg(self, table: str, name: str, value: Any, theirs: str, note: str = "") -> None:
        merged = checked(table, {**self.settings.get(table, {}), name: value}, f"{self.source} ({theirs})")
        self.settings[table] = merged
        self.mapped.append(f"{theirs} -> [{table}] {name} = {_shown(value)}" + (f" ({note})" if note else ""))


def _shown(value: Any) -> str:
    from evolver.cli.settings_text import tomli_value

    return tomli_value(value)


def read_source(source: str) -> Migration:
    """An auto-harness checkout (a directory), a file holding one Life-Harness command line, or the command line itself."""
    path = Path(source).expanduser()
    if path.is_dir():
        if (path / "TauBench" / "scripts" / "eval_harness.py").is_file() or (path / "scripts" / "eval_harness.py").is_file():
            raise UsageError(
                f"{path} is a Life-Harness checkout: pass its evaluation command line instead, e.g. "
                "--from 'python scripts/eval_harness.py --domain retail --enabled --h2 --h3 --trials 3'"
            )
        return from_auto_harness(path)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot read {path} ({getattr(exc, 'strerror', None) or exc}); pass an auto-harness checkout or a "
                "Life-Harness command line"
            ) from None
        lines = [line for line in _joined_lines(text) if "eval_harness.py" in line and not line.lstrip().startswith("#")]
        if len(lines) != 1:
            raise UsageError(f"{path} holds {len(lines)} eval_harness.py command lines; pass the one to bring (in quotes) as --from")
        return from_life_harness(lines[0], str(path))
    if "eval_harness.py" in source or source.lstrip().startswith("--"):
        return from_life_harness(source, "the Life-Harness command line")
    raise UsageError(
        f"--from {source}: not a directory (an auto-harness checkout) nor a Life-Harness command line "
        "(python scripts/eval_harness.py --domain ... or its flags)"
    )


def _joined_lines(text: str) -> list[str]:
    """A shell script's commands, a backslash-newline continuation joined into its line."""
    return re.sub(r"\\\r?\n", " ", text).splitlines()


# ---- auto-harness -----------------------------------------------------------------------------------

AUTO_HARNESS_LEFT_OUT = {
    "threshold": "auto-harness's pass-rate threshold for its regression suite; evolver's gate keeps a change only when a paired "
    "statistical test on the gate split says it is better (gate_alpha, gate_min_effect; docs/gate.md)",
}


def from_auto_harness(root: Path) -> Migration:
    config_path = root / "experiment_config.yaml"
    agent_path = root / "agent" / "agent.py"
    m = Migration(source=str(config_path))
    if not agent_path.is_file():
        raise UsageError(f"no agent/agent.py in {root}: pass an auto-harness checkout (its agent/agent.py and experiment_config.yaml)")
    if not config_path.is_file():
        raise UsageError(
            f"no experiment_config.yaml in {root}: auto-harness reads it; copy experiment_config.yaml.template, "
            "set it up for tau-bench, and run `evolver init --from` again"
        )
    config = _yaml(config_path)
    benchmark = str(config.pop("benchmark", "tau-bench"))
    if benchmark != "tau-bench":
        raise UsageError(
            f"{config_path} is set up for benchmark '{benchmark}'; evolver evolves tau2-bench agents (benchmark: \"tau-bench\")"
        )
    m.mapped.append("benchmark: tau-bench -> tau2-bench, which evolver runs")
    try:
        m.agent = agent_path.read_text(encoding="utf-8")
        template = root / "agent" / "templates" / "tau_bench.py"
        m.baseline = template.read_text(encoding="utf-8") if template.is_file() else m.agent
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {agent_path} ({getattr(exc, 'strerror', None) or exc})") from None
    m.mapped.append(
        "agent/agent.py -> agent/agent.py, unchanged (its process gets AGENT_MODEL and AGENT_REASONING_EFFORT; "
        "tau2.agent.base_agent resolves to the installed tau2's tau2.agent.base)"
    )
    if "domain" in config:
        domain = str(config.pop("domain"))
        if domain not in DOMAINS:
            raise UsageError(f"{config_path}: domain '{domain}' is not a tau2 domain evolver has ({', '.join(DOMAINS)})")
        m.set("domain", domain, f"domain: {domain}")
    # auto-harness analyses `split` (train by default) and gates on `gate_split` (test by default); evolver sets both or neither.
    split, gate = config.pop("split", None), config.pop("gate_split", None)
    m.set("analysis_split", split or "train", f"split: {split or 'train'}", "" if split else "auto-harness's default")
    m.set("gate_split", gate or "test", f"gate_split: {gate or 'test'}", "" if gate else "auto-harness's default")
    agent_model = config.pop("agent_model", None)
    if agent_model:
        m.set("agent_model", agent_model, f"agent_model: {agent_model}")
    user_model = config.pop("user_model", None)
    if user_model or agent_model:
        m.set(
            "user_model",
            user_model or agent_model,
            f"user_model: {user_model}" if user_model else f"agent_model: {agent_model}",
            "" if user_model else "auto-harness simulates the user with the agent's model when user_model is unset",
        )
    had = "max_concurrency" in config
    concurrency = config.pop("max_concurrency", 3)
    m.set("concurrency", concurrency, f"max_concurrency: {concurrency}", "" if had else "auto-harness's default")
    effort = config.pop("reasoning_effort", None)
    if effort:
        # (no drop_params: every request carries what its model takes, evolver.models)
        m.set("agent_reasoning_effort", effort, f"reasoning_effort: {effort}", "the agent's only, as auto-harness passes it")
    for key, value in config.items():
        why = AUTO_HARNESS_LEFT_OUT.get(key, "no equivalent in evolver (not a tau-bench setting of evolver's)")
        m.left_out.append(f"{key}: {value}: {why}")
    m.left_out.append(
        "meta model: auto-harness has none (a coding agent follows PROGRAM.md); evolver's proposer needs meta_model, "
        'or proposer = "command" with that coding agent\'s command line (docs/proposer.md)'
    )
    learnings = root / "workspace" / "learnings.md"
    text = learnings.read_text(encoding="utf-8", errors="replace").strip() if learnings.is_file() else ""
    if re.sub(r"^#\s*Learnings\s*$", "", text, flags=re.M | re.I).strip():  # more than the header prepare.py writes
        m.learnings = text + "\n"
        m.set("learnings_file", LEARNINGS_FILE, "workspace/learnings.md", f"copied to {LEARNINGS_FILE}; the first run's proposer reads it")
    else:
        m.left_out.append("workspace/learnings.md: none, or only its header")
    for name, why in (
        ("workspace/suite.json", "its regression suite: evolver's gate measures every gate task at each decision"),
        ("workspace/results.tsv", "auto-harness's own history: evolver's runs start in runs/"),
        ("PROGRAM.md", "the coding agent's instructions: evolver's meta model follows Harness.md"),
    ):
        if (root / name).exists():
            m.left_out.append(f"{name}: {why}")
    others = sorted(p.name for p in (root / "agent").iterdir() if p.name not in ("agent.py", "templates", "__init__.py", "__pycache__"))
    if others:
        m.left_out.append(f"agent/{', agent/'.join(others)}: not brought, only agent/agent.py is")
    if re.search(r"^\s*(from|import)\s+agent\.", m.agent, re.M):
        m.left_out.append("agent/agent.py imports other modules of agent/: copy them into agent/ by hand (only agent.py is brought)")
    m.left_out.append("harness layers: the auto-harness agent has none; evolver's H2-H5 layers live in its own template (Harness.md)")
    return m


def _yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path} is not readable YAML ({str(exc).splitlines()[0]}); fix it") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a mapping of settings; fix it")
    return data


# ---- Life-Harness -----------------------------------------------------------------------------------


def _life_harness_parser() -> argparse.ArgumentParser:
    """The flags of Life-Harness's scripts/eval_harness.py, with its defaults (None: the flag was not given)."""
    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for flag in (
        "--enabled",
        "--h2",
        "--h3",
        "--h4",
        "--h5",
        "--retrieve-policy",
        "--user-enable-reasoning",
        "--user-disable-thinking",
        "--nl",
        "--malicious-user",
    ):
        p.add_argument(flag, action="store_true")
    for flag in (
        "--domain",
        "--split",
        "--agent-llm",
        "--agent-api-base",
        "--user-llm",
        "--user-api-base",
        "--user-api-key-env",
        "--retrieval-config",
        "--save-to",
        "--output",
        "--task-id-file",
        "--failed-from",
    ):
        p.add_argument(flag)
    for flag in (
        "--h5-top-k",
        "--policy-top-k",
        "--kb-top-k",
        "--concurrency",
        "--agent-max-tokens",
        "--user-max-tokens",
        "--num-tasks",
        "--max-steps",
    ):
        p.add_argument(flag, type=int)
    p.add_argument("--trials", "--num-trials", dest="trials", type=int)
    p.add_argument("--task-ids", nargs="+")
    p.add_argument("--task-indices", nargs="+")
    return p


# Life-Harness's defaults where they change what a simulation does (its README and eval_harness.py).
LIFE_HARNESS_DEFAULTS = {
    "domain": "airline",
    "split": "test",
    "trials": 1,
    "concurrency": 10,
    "h5_top_k": 3,
    "agent_max_tokens": 2048,
    "max_steps": 200,
}
LIFE_HARNESS_LEFT_OUT = {
    "nl": "--nl: no equivalent: evolver scores with tau2's default evaluation, without the NL-assertion judge's verdict",
    "retrieve_policy": "--retrieve-policy: no equivalent (Life-Harness's policy-retrieval tool)",
    "policy_top_k": "--policy-top-k: no equivalent (Life-Harness's policy-retrieval tool)",
    "retrieval_config": "--retrieval-config: no equivalent (banking_knowledge retrieval)",
    "kb_top_k": "--kb-top-k: no equivalent (banking_knowledge retrieval)",
    "malicious_user": "--malicious-user: no equivalent (evolver's user simulator is tau2's)",
    "output": "--output: evolver writes every evaluation to runs/<run-id>/",
    "save_to": "--save-to: evolver writes every evaluation to runs/<run-id>/",
    "user_api_key_env": "--user-api-key-env: keys are never settings: export the provider's own variable (OPENAI_API_KEY for an "
    "openai/ model), which only evolver's trusted side reads",
    "task_id_file": "--task-id-file: no setting: pass the ids to `evolver eval --task-ids`",
    "task_indices": "--task-indices: no equivalent: pass task ids to `evolver eval --task-ids`",
    "failed_from": "--failed-from: no equivalent: pass the failed task ids to `evolver eval --task-ids`",
    "task_ids": "--task-ids: a flag of `evolver eval`, not a setting: pass it there",
    "num_tasks": "--num-tasks: a flag of `evolver eval`, not a setting: pass it there",
}


def from_life_harness(command: str, source: str) -> Migration:
    try:
        tokens = shlex.split(" ".join(_joined_lines(command)))
    except ValueError as exc:
        raise UsageError(f"--from: the command line does not parse ({exc}); quote it as the shell would") from None
    script = next((i for i, t in enumerate(tokens) if t.endswith("eval_harness.py")), None)
    tokens = tokens[script + 1 :] if script is not None else tokens
    try:
        args, unknown = _life_harness_parser().parse_known_args(tokens)
    except (argparse.ArgumentError, ValueError) as exc:
        raise UsageError(f"--from: {exc}; fix the command line") from None
    m = Migration(source=source)
    given = {k: v for k, v in vars(args).items() if v is not None and v is not False}  # 0 is given: --agent-max-tokens 0
    value = lambda key: given.get(key, LIFE_HARNESS_DEFAULTS.get(key))  # noqa: E731
    note = lambda key: "" if key in given else "Life-Harness's default"  # noqa: E731

    domain = value("domain")
    if domain in DOMAINS:
        m.set("domain", domain, f"--domain {domain}", note("domain"))
    else:
        m.left_out.append(f"--domain {domain}: not a tau2 domain evolver has ({', '.join(DOMAINS)}); register it with plugins")
    m.set("split", value("split"), f"--split {value('split')}", note("split"))
    m.set("trials", value("trials"), f"--trials {value('trials')}", note("trials"))
    m.set("concurrency", value("concurrency"), f"--concurrency {value('concurrency')}", note("concurrency"))
    m.set("max_steps", value("max_steps"), f"--max-steps {value('max_steps')}", note("max_steps"))
    # The layers: each switch counts only with the master switch --enabled, as in Life-Harness.
    m.switches = {name: bool(args.enabled and getattr(args, flag)) for flag, name in LAYERS.items()}
    for flag, name in LAYERS.items():
        if getattr(args, flag):
            m.mapped.append(
                f"--{flag} -> agent/harness.toml {name} = {'true' if m.switches[name] else 'false'}"
                + ("" if args.enabled else " (without --enabled Life-Harness leaves it off)")
            )
    if args.enabled and not any(m.switches.values()):
        m.mapped.append("--enabled with no layer flag -> every layer off in agent/harness.toml")
    if m.switches[LAYERS["h5"]]:
        m.h5_top_k = value("h5_top_k")
        if m.h5_top_k < 1:
            raise UsageError(f"{source}: --h5-top-k {m.h5_top_k} must be at least 1; fix it")
        m.mapped.append(
            f"--h5-top-k {m.h5_top_k} -> H5_TOP_K = {m.h5_top_k} in agent/agent.py" + (f" ({note('h5_top_k')})" if note("h5_top_k") else "")
        )
    elif "h5_top_k" in given:
        m.left_out.append(f"--h5-top-k {given['h5_top_k']}: H5 is off, so it has no effect")
    if any(m.switches.values()):
        m.left_out.append(
            "Life-Harness's domain rule sets (its tau2/harness/<domain>.py) do not come along: the switches turn on evolver's own "
            "H2-H5 layers (Harness.md), which the run then evolves"
        )
    # Models, servers and their arguments.
    if "agent_llm" in given:
        m.set("agent_model", given["agent_llm"], f"--agent-llm {given['agent_llm']}")
    else:
        m.left_out.append(
            "--agent-llm not given: Life-Harness's default, openai/Qwen/Qwen3-4B-Instruct-2507 at AGENT_API_BASE, is not "
            "copied; set agent_model (and agent_api_base)"
        )
    if "agent_api_base" in given:
        m.set("agent_api_base", given["agent_api_base"], f"--agent-api-base {given['agent_api_base']}")
    if "user_llm" in given:
        m.set("user_model", given["user_llm"], f"--user-llm {given['user_llm']}")
    else:
        m.left_out.append("--user-llm not given: Life-Harness's default, openai/deepseek-v4-flash, is not copied; set user_model")
    user_base = given.get("user_api_base", "")
    if user_base:
        m.set("user_api_base", user_base, f"--user-api-base {user_base}")
    tokens_ = value("agent_max_tokens")
    if tokens_:
        m.add_arg("agent_args", "max_tokens", tokens_, f"--agent-max-tokens {tokens_}", note("agent_max_tokens"))
    if given.get("user_max_tokens"):
        m.add_arg("user_args", "max_tokens", given["user_max_tokens"], f"--user-max-tokens {given['user_max_tokens']}")
    body = {}
    if user_base and "openrouter.ai" in user_base and not args.user_enable_reasoning:
        body["reasoning"] = {"enabled": False}  # what Life-Harness sends an OpenRouter user model by default
    if args.user_disable_thinking and user_base:
        body.update(
            {"enable_thinking": False}
            if "dashscope.aliyuncs.com" in user_base
            else {"thinking": {"type": "disabled"}, "reasoning": {"enabled": False}}
        )
    if body:
        m.add_arg(
            "user_args",
            "extra_body",
            body,
            "--user-disable-thinking" if args.user_disable_thinking else "an OpenRouter --user-api-base",
            "the user simulator's thinking off, as Life-Harness sends it",
        )
    elif args.user_disable_thinking or args.user_enable_reasoning:
        m.left_out.append("--user-disable-thinking / --user-enable-reasoning: no effect without --user-api-base, as in Life-Harness")
    m.mapped.append("agent temperature 0.0 -> agent_temperature = 0.0 (evolver's default too)")
    m.left_out.append("user temperature: Life-Harness sends none (the API's default); evolver sends user_temperature (0.0)")
    for key, why in LIFE_HARNESS_LEFT_OUT.items():
        if key in given:
            m.left_out.append(why)
    if unknown:
        m.left_out.append(f"not flags of Life-Harness's eval_harness.py: {' '.join(unknown)}")
    return m
