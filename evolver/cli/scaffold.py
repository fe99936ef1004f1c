"""`evolver init`: set up a repository whose agent evolver will evolve."""

from __future__ import annotations

from dataclasses import MISSING
from importlib import resources
from pathlib import Path

from evolver.errors import UsageError
from evolver.store.runstate import runs_dir

# Written uncommented: what a new user most often changes.
ACTIVE = ("domain", "trials", "concurrency", "seed", "max_steps")


def config_template() -> str:
    """evolver.toml with every key, its default and what it does (config.KEY_HELP)."""
    from dataclasses import fields

    from evolver.config import FLAG_ONLY, KEY_HELP, Config

    lines = [
        "# evolver configuration: every key, with its default. EVOLVER_<KEY> environment variables",
        "# override these values, and command-line flags (--key-name) override both.",
        "# Models: one litellm model string per role, or \"local\" for the embedded model. Unset:",
        "# OpenAI's gpt-4.1-mini / gpt-4.1 when OPENAI_API_KEY is set, else \"local\".",
        "",
    ]
    for f in fields(Config):
        if f.name in FLAG_ONLY:
            continue
        default = f.default if f.default_factory is MISSING else f.default_factory()
        value = tomli_value(default)
        line = f"{f.name} = {value}" if f.name in ACTIVE else f"# {f.name} = {value}"
        lines.append(f"{line:<36} # {KEY_HELP[f.name]}")
    return "\n".join(lines) + "\n"


def tomli_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(tomli_value(v) for v in value) + "]"
    return repr(value)


def _template_files() -> dict[str, str]:
    """The baseline agent, its layer switches and skills: once pristine under
    agent/templates/, once as the working copy under agent/ that evolution edits."""
    base = resources.files("evolver.baseline")
    agent = (base / "tau_bench.py").read_text()
    harness = (base / "harness.toml").read_text()
    skills = {f"skills/{p.name}": p.read_text() for p in sorted(base.joinpath("skills").iterdir(), key=lambda p: p.name) if p.name.endswith(".md")}
    files = {
        "agent/templates/tau_bench.py": agent,
        "agent/templates/__init__.py": (base / "__init__.py").read_text(),
        "agent/templates/harness.toml": harness,
        "agent/agent.py": agent,
        "agent/harness.toml": harness,
        "evolver.toml": config_template(),
    }
    for rel, text in skills.items():
        files[f"agent/templates/{rel}"] = text
        files[f"agent/{rel}"] = text
    return files


def init_repo(target: Path, force: bool = False) -> list[str]:
    """Write the agent template, a config file and ignore runs/. Returns the paths written."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} is a file, not a directory; pass a directory to `evolver init`")
    files = _template_files()
    existing = [p for p in files if (target / p).exists()]
    if existing and not force:
        raise UsageError(f"{', '.join(existing)} already exist in {target}; pass --force to overwrite them")
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    runs_dir(target).mkdir(exist_ok=True)
    gitignore = target / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    if "runs/" not in lines:
        gitignore.write_text("\n".join(lines + ["runs/"]) + "\n")
    return sorted(files) + [".gitignore"]
